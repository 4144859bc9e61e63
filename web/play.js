// The play page: the server steps both games in the real ALE; this page draws the two
// screens, reads the person's keys, and computes the agent's action with onnxruntime-web.
// Each agent step: state arrives -> agent Q-values for that observation -> both actions
// sent back; the next step is scheduled `pace` ms after the previous one was sent. One game
// is stepped by one loop: Start during a game retires it (the server stores it as abandoned),
// and a state or an action of a retired game goes no further.
import { PageModel } from './ort_page.js';
import { KeyLatch, qBars } from './play_view.js';

const params = new URLSearchParams(location.search);
const config = await (await fetch('/play/config.json')).json();
const pace = params.has('pace_ms') ? Number(params.get('pace_ms')) : config.pace_ms;
const provider = params.get('provider') || config.provider;
const ACTIONS = config.actions; // NOOP, FIRE, RIGHT, LEFT
const $ = (id) => document.getElementById(id);
$('seed').value = params.get('seed') ?? config.seed;

let currentGame = null; // the game this page steps; null before the first and between games
let gameOn = false; // a game is on or being started: space serves rather than starting another
const retired = new Set(); // games Start left: their late states are not stepped
const latch = new KeyLatch(ACTIONS);
addEventListener('keydown', (e) => {
  if (!['ArrowLeft', 'ArrowRight', ' '].includes(e.key)) return;
  e.preventDefault();
  if (e.key === ' ' && !gameOn && window.playPage?.ready) {
    if (!e.repeat) start(); // space with no game on starts one, as Start does
    return;
  }
  latch.down(e.key);
});
addEventListener('keyup', (e) => latch.up(e.key));

// The game's own RGB screen (160x210 PNG), not the agent's 84x84 grayscale view.
function draw(imgId, pngBase64) {
  $(imgId).src = `data:image/png;base64,${pngBase64}`;
}

function stats(side) {
  const end = side.done ? ` · over (${side.ended_by.replace('_', ' ')})` : '';
  return `score ${side.score} · lives ${side.lives} · step ${side.steps}${end}`;
}

function showQ(q, chosen) {
  const { top, bars } = qBars(q);
  $('q').innerHTML = bars.map(({ value, percent, negative }, a) => {
    const cls = a === chosen ? 'chosen' : '';
    const bar = `bar${a === chosen ? ' chosen-bar' : ''}${negative ? ' negative' : ''}`;
    return `<span class="${cls}">${ACTIONS[a]}</span><span class="track"><span class="${bar}" style="width:${percent}%"></span></span>` +
      `<span class="${cls} value">${value.toFixed(4)}</span>`;
  }).join('');
  const negative = bars.some((b) => b.negative) ? '; a hatched bar is negative' : '';
  $('q-scale').textContent = `bar length: Q-value on a scale from 0 to ${top.toFixed(4)} (the largest |Q|)${negative}`;
}

const model = await PageModel.load(config.model, provider);
const info = model.info;
const adapter = info.adapter ? ` · adapter ${info.adapter.vendor}/${info.adapter.architecture}${info.adapter.software ? ' (software, on the CPU)' : ''}` : '';
$('agent-provider').textContent = `(onnxruntime-web ${info.onnxruntime_web}, ${info.actual_provider})`;
$('runtime').textContent = `requested ${info.requested_provider}, ran on ${info.actual_provider}${adapter} · ` +
  `WASM threads ${info.wasm_threads} · cross-origin isolated ${info.cross_origin_isolated} · ${info.user_agent}`;

const ws = new WebSocket(`ws://${location.host}/play/ws`);
await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
// acting: steps being computed now (one loop: never more than 1); mostActing: the most at once
window.playPage = { games: [], steps: 0, errors: [], lastState: null, ready: true, info, acting: 0, mostActing: 0,
  humanActions: Object.fromEntries(ACTIONS.map((a) => [a, 0])) };
$('status').textContent = 'ready: press Start (or space) to play';

let lastSent = 0;
async function act(state) {
  const page = window.playPage;
  page.acting++;
  page.mostActing = Math.max(page.mostActing, page.acting);
  try {
    let agentAction = 0;
    if (!state.agent.done) {
      const q = await model.qValues(state.agent.obs, 1);
      agentAction = q.indexOf(Math.max(...q));
      showQ(q, agentAction);
    }
    const wait = Math.max(0, lastSent + pace - performance.now());
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    if (state.game_id !== currentGame) return; // Start was pressed meanwhile: this loop ends here
    lastSent = performance.now();
    const human = latch.take();
    ws.send(JSON.stringify({ type: 'act', human_action: human, agent_action: agentAction, game_id: state.game_id }));
    page.humanActions[ACTIONS[human]]++;
    page.steps++;
  } finally {
    page.acting--;
  }
}

function show(msg) {
  window.playPage.lastState = { human: { ...msg.human, screen: undefined }, agent: { ...msg.agent, screen: undefined, obs: undefined } };
  draw('human', msg.human.screen);
  draw('agent', msg.agent.screen);
  $('human-stats').textContent = stats(msg.human);
  $('agent-stats').textContent = stats(msg.agent);
}

function listGame(g, stored) {
  $('games').insertAdjacentHTML('afterbegin', `<tr class="${g.status}"><td>${g.seed}</td><td>${g.human_score}</td><td>${g.agent_score}</td>` +
    `<td>${g.human_ended_by}</td><td>${g.agent_ended_by}</td><td>${g.human_steps} / ${g.agent_steps}</td>` +
    `<td>${g.agent_actions_unlike_cpu}</td><td>${g.status}</td><td>${stored}</td></tr>`);
}

// 'later': the database could not take the row (another process held it, or the file cannot be written);
// the server keeps the game beside it and appends it once the file takes it. 'held': it could not keep it
// beside the file either, so it holds the game in memory and tries again at each game and as it stops
const storedText = (msg) => (msg.stored === 'now' ? 'stored'
  : msg.stored === 'held' ? `not stored yet: held by the server, which tries again at each game; keep it running (${msg.stored_reason})`
    : `stored later (${msg.stored_reason})`);

ws.onmessage = async (event) => {
  const msg = JSON.parse(event.data);
  if (msg.type === 'state') {
    if (retired.has(msg.game_id)) return; // a step of a game Start left, answered before the start
    currentGame = msg.game_id;
    show(msg);
    const waiting = msg.human.done && !msg.agent.done;
    $('human-side').classList.toggle('waiting', waiting);
    $('human-banner').hidden = !waiting;
    $('status').textContent = waiting
      ? `your game is over (you scored ${msg.human.score}); the agent is still playing, step ${msg.agent.steps} · game ${msg.game_id}`
      : `game ${msg.game_id} · seed ${msg.seed}`;
    await act(msg);
  } else if (msg.type === 'over' || msg.type === 'abandoned') {
    const g = msg.game;
    window.playPage.games.push({ ...g, stored: msg.stored });
    listGame(g, msg.stored);
    if (msg.type === 'over') {
      if (currentGame === g.game_id) { // not a game that ended just as Start was pressed
        currentGame = null;
        gameOn = false;
        show(msg);
        $('human-side').classList.remove('waiting');
        $('human-banner').hidden = true;
      }
      $('status').textContent = `game over: you ${g.human_score}, agent ${g.agent_score} · game ${storedText(msg)} (${g.game_id}) · press Start (or space) to play again`;
    } else {
      $('status').textContent = `game ${g.game_id} abandoned at step ${g.agent_steps} (you ${g.human_score}, agent ${g.agent_score}): ` +
        `${storedText(msg)} as abandoned · a new game starts`;
    }
  } else if (msg.type === 'error') {
    window.playPage.errors.push(msg.message);
    $('status').textContent = `error: ${msg.message}`;
  }
};
// the server closes the socket after telling why (an idle game, a failure); the status keeps that reason
ws.onclose = () => { $('start').disabled = true; };

function start() {
  if (currentGame !== null) retired.add(currentGame); // its loop stops at its next step
  currentGame = null;
  gameOn = true;
  $('human-banner').hidden = true;
  $('human-side').classList.remove('waiting');
  ws.send(JSON.stringify({ type: 'start', seed: Number($('seed').value) }));
}

$('start').onclick = () => {
  start();
  $('start').blur();
};
