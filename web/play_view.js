// What the play page computes without a game: the person's action from the keys pressed since
// the last step, and the Q-value bars' lengths. A module of its own so a test can load it alone.

// Keys held now, and keys pressed since the last step: a tap that starts and ends between two
// steps (66 ms apart at the default pace) still counts at the next step.
export class KeyLatch {
  constructor(actions) {
    this.actions = actions; // the contract's action names, e.g. NOOP, FIRE, RIGHT, LEFT
    this.held = new Set();
    this.tapped = new Set();
  }

  down(key) { this.held.add(key); this.tapped.add(key); }

  up(key) { this.held.delete(key); }

  // The action for this step, from the keys held and those tapped since the last take().
  take() {
    const keys = new Set([...this.held, ...this.tapped]);
    this.tapped.clear();
    let name = 'NOOP';
    if (keys.has(' ')) name = 'FIRE';
    else if (keys.has('ArrowRight') && !keys.has('ArrowLeft')) name = 'RIGHT';
    else if (keys.has('ArrowLeft') && !keys.has('ArrowRight')) name = 'LEFT';
    return this.actions.indexOf(name);
  }
}

// Bars on a scale from 0 to the largest |Q|: a bar's length is proportional to its value, so
// 1.5649 against 1.6093 reads as 97%, not as a tenfold gap. Negative values are marked.
export function qBars(q) {
  const top = Math.max(...q.map(Math.abs)) || 1;
  return { top, bars: q.map((value) => ({ value, percent: 100 * Math.abs(value) / top, negative: value < 0 })) };
}
