// The play page: the server steps both games in the real ALE; this page draws the two
// screens, reads the person's keys, and computes the agent's action with onnxruntime-web.
// Each agent step: state arrives -> agent Q-values for that observation -> both actions
// sent back; the next step is scheduled `pace` ms after the previous one was sent.
import { PageModel } from './ort_page.js';

const params = new URLSearchParams(location.search);
const config = await (await fetch('/play/config.json')).json();
const pace = params.has('pace_ms') ? Number(params.get('pace_ms')) : config.pace_ms;
const provider = params.get('provider') || config.provider;
const ACTIONS = config.actions; // NOOP, FIRE, RIGHT, LEFT
const $ = (id) => document.getElementById(id);
$('seed').value = params.get('seed') ?? config.seed;

const keys = new Set();
addEventListener('keydown', (e) => {
  if (['ArrowLeft', 'ArrowRight', ' '].includes(e.key)) { keys.add(e.key); e.preventDefault(); }
});
addEventListener('keyup', (e) => keys.delete(e.key));
function humanAction() {
  if (keys.has(' ')) return ACTIONS.indexOf('FIRE');
  if (keys.has('ArrowRight') && !keys.has('ArrowLeft')) return ACTIONS.indexOf('RIGHT');
  if (keys.has('ArrowLeft') && !keys.has('ArrowRight')) return ACTIONS.indexOf('LEFT');
  return ACTIONS.indexOf('NOOP');
}

// The game's own RGB screen (160x210 PNG), not the agent's 84x84 grayscale view.
function draw(imgId, pngBase64) {
  $(imgId).src = `data:image/png;base64,${pngBase64}`;
}

function stats(side) {
  const end = side.done ? ` · over (${side.ended_by.replace('_', ' ')})` : '';
  return `score ${side.score} · lives ${side.lives} · step ${side.steps}${end}`;
}

function showQ(q, chosen) {
  if (!q) return;
  const lo = Math.min(...q), hi = Math.max(...q), span = hi - lo || 1;
  $('q').innerHTML = q.map((v, a) => {
    const cls = a === chosen ? 'chosen' : '';
    const width = 10 + 90 * (v - lo) / span;
    return `<span class="${cls}">${ACTIONS[a]}</span><span class="bar ${a === chosen ? 'chosen-bar' : ''}" style="width:${width}%"></span>` +
      `<span class="${cls}">${v.toFixed(4)}</span>`;
  }).join('');
}

const model = await PageModel.load(config.model, provider);
const info = model.info;
const adapter = info.adapter ? ` · adapter ${info.adapter.vendor}/${info.adapter.architecture}${info.adapter.software ? ' (software, on the CPU)' : ''}` : '';
$('agent-provider').textContent = `(onnxruntime-web ${info.onnxruntime_web}, ${info.actual_provider})`;
$('runtime').textContent = `requested ${info.requested_provider}, ran on ${info.actual_provider}${adapter} · ` +
  `WASM threads ${info.wasm_threads} · cross-origin isolated ${info.cross_origin_isolated} · ${info.user_agent}`;

const ws = new WebSocket(`ws://${location.host}/play/ws`);
await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
window.playPage = { games: [], steps: 0, errors: [], lastState: null, ready: true, info };
$('status').textContent = 'ready: press Start';

let lastSent = 0;
async function act(state) {
  let agentAction = 0;
  if (!state.agent.done) {
    const q = await model.qValues(state.agent.obs, 1);
    agentAction = q.indexOf(Math.max(...q));
    showQ(q, agentAction);
  }
  const wait = Math.max(0, lastSent + pace - performance.now());
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  lastSent = performance.now();
  ws.send(JSON.stringify({ type: 'act', human_action: humanAction(), agent_action: agentAction }));
  window.playPage.steps++;
}

function show(msg) {
  window.playPage.lastState = { human: { ...msg.human, screen: undefined }, agent: { ...msg.agent, screen: undefined, obs: undefined } };
  draw('human', msg.human.screen);
  draw('agent', msg.agent.screen);
  $('human-stats').textContent = stats(msg.human);
  $('agent-stats').textContent = stats(msg.agent);
}

ws.onmessage = async (event) => {
  const msg = JSON.parse(event.data);
  if (msg.type === 'state') {
    show(msg);
    $('status').textContent = `game ${msg.game_id} · seed ${msg.seed}`;
    await act(msg);
  } else if (msg.type === 'over') {
    show(msg);
    const g = msg.game;
    window.playPage.games.push({ ...g, stored: msg.stored });
    // 'later': another process held the database; the server keeps the game and appends it when the file is free
    const stored = msg.stored === 'now' ? 'game stored' : 'the database is busy: the game is kept and stored when it is free';
    $('status').textContent = `game over: you ${g.human_score}, agent ${g.agent_score} · ${stored} (${g.game_id})`;
    $('games').insertAdjacentHTML('afterbegin', `<tr><td>${g.seed}</td><td>${g.human_score}</td><td>${g.agent_score}</td>` +
      `<td>${g.human_ended_by}</td><td>${g.agent_ended_by}</td><td>${g.human_steps} / ${g.agent_steps}</td>` +
      `<td>${g.agent_actions_unlike_cpu}</td><td>${msg.stored}</td></tr>`);
  } else if (msg.type === 'error') {
    window.playPage.errors.push(msg.message);
    $('status').textContent = `error: ${msg.message}`;
  }
};
// the server closes the socket after telling why (an idle game, a failure); the status keeps that reason
ws.onclose = () => { $('start').disabled = true; };

$('start').onclick = () => {
  ws.send(JSON.stringify({ type: 'start', seed: Number($('seed').value) }));
  $('start').blur();
};
