/**
 * The replica panel: do the ranks still hold the same parameters? Tensor x rank, from the
 * `replicas_diverged` findings the view shows (diagnose()'s where a kernel sent them, else the
 * ranks' reported ones). One verdict line, then one row per differing tensor and checked step,
 * one cell per rank holding the letter of its group of identical bytes (A: the most common;
 * others highlighted), columns grouped by rank ranges above MANY_RANKS ranks; hovering a cell
 * shows what that group holds (norms).
 *
 * `replicaMatrix` is the browser twin of ddpviz/widgets/replica_matrix.py (tests/extension/
 * test_replica_matrix_mirror.py runs both on the same findings): ranks are kept as [lo, hi]
 * spans throughout, so a group of 131,072 ranks costs one span, whatever a trace claims.
 */

import { h, note, section } from './dom';
import { Finding } from './events';
import { MANY_RANKS } from './rankGroups';
import { MAX_WORLD_SIZE } from './limits';

/** Inclusive [lo, hi] runs of ranks, sorted, disjoint. */
export type Spans = [number, number][];
/** [lo, hi, letter]: ranks lo..hi hold the bytes of group `letter`. */
export type Lettered = [number, number, string];

/** Rows drawn; the rest are counted (as replica_view.py). */
export const MAX_ROWS = 64;
/** Columns (ranks or groups) drawn; the rest are counted. */
export const MAX_COLUMNS = 64;
/** Cell updates spent on grouping ranks into columns (as replica_matrix.py's MAX_CELL_WORK). */
export const MAX_CELL_WORK = 1 << 20;

/** One differing tensor at one checked step. */
export interface ReplicaRow {
  step: number;
  name: string;
  severity: string;
  /** rank -> group letter as sorted disjoint spans ("A": the most common bytes). */
  cells: Lettered[];
  /** group letter -> what those ranks hold (norms). */
  sizes: Map<string, string>;
}

export interface ReplicaMatrix {
  rows: ReplicaRow[];
  /** [label, its ranks as spans]: a rank, or a group of ranks alike in every row. */
  columns: [string, Spans][];
  worldSize: number;
}

/** Spans sorted, overlapping or adjacent ones joined (findings.py's merge_spans). */
export function mergeSpans(spans: Spans): Spans {
  const sorted = [...spans].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const out: Spans = [];
  for (const [lo, hi] of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && lo <= last[1] + 1) {
      last[1] = Math.max(last[1], hi);
    } else {
      out.push([lo, hi]);
    }
  }
  return out;
}

/** '0-3, 5' for [[0, 3], [5, 5]]: a span of 3 or more as 'lo-hi' (findings.py's format_spans). */
export function formatSpans(spans: Spans): string {
  const parts: string[] = [];
  for (const [lo, hi] of mergeSpans(spans)) {
    if (hi - lo + 1 >= 3) {
      parts.push(`${lo}-${hi}`);
    } else {
      for (let r = lo; r <= hi; r++) {
        parts.push(String(r));
      }
    }
  }
  return parts.join(', ');
}

function partition(text: string, sep: string): [string, string, string] {
  const i = text.indexOf(sep);
  return i < 0 ? [text, '', ''] : [text.slice(0, i), sep, text.slice(i + sep.length)];
}

const RANK_DIGITS = String(MAX_WORLD_SIZE).length;

/** A rank as findings.py writes it; MAX_WORLD_SIZE past the bound; null when not a number. */
function rankNumber(text: string): number | null {
  const t = text.trim();
  if (!/^[0-9]+$/.test(t)) {
    return null;
  }
  const digits = t.replace(/^0+/, '') || '0';
  return digits.length > RANK_DIGITS ? MAX_WORLD_SIZE : Math.min(Number(digits), MAX_WORLD_SIZE);
}

/**
 * A per-tensor detail line ("name: ranks 0,2: norm ..., ...; rank 1: norm ...") read back as
 * [name, [[spans, held]]], for traces written before findings carried `tensors`; null for the
 * other lines (findings.py's tensor_groups: a range is one span, cut at the rank bound).
 */
export function tensorGroups(line: string): [string, [Spans, string][]] | null {
  const [name, sep, rest] = partition(line, ': ');
  if (!sep || name.includes(' ') || !rest.startsWith('rank')) {
    return null;
  }
  const top = MAX_WORLD_SIZE - 1;
  const groups: [Spans, string][] = [];
  for (const part of rest.split('; ')) {
    const [label, colon, value] = partition(part, ': ');
    if (!colon || !label.startsWith('rank')) {
      continue;
    }
    const space = label.indexOf(' ');
    const spans: Spans = [];
    for (const item of (space < 0 ? label : label.slice(space + 1)).split(',')) {
      const [loText, dash, hiText] = partition(item, '-');
      const lo = rankNumber(loText);
      const hi = dash ? rankNumber(hiText) : lo;
      if (lo === null || hi === null) {
        return null;
      }
      if (lo <= Math.min(hi, top)) {
        spans.push([lo, Math.min(hi, top)]);
      }
    }
    groups.push([mergeSpans(spans), value]);
  }
  return groups.length > 0 ? [name, groups] : null;
}

/** A replicas_diverged finding's groups per tensor: its `tensors`, else its detail lines. */
export function replicaGroups(f: Finding): [string, [Spans, string][]][] {
  if (f.tensors && f.tensors.length > 0) {
    return f.tensors
      .filter(([, groups]) => groups.length > 0)
      .map(([name, groups]) => [
        name,
        groups.map(([held, spans]) => [mergeSpans(spans), held] as [Spans, string])
      ]);
  }
  const out: [string, [Spans, string][]][] = [];
  for (const line of f.detail ?? []) {
    const row = tensorGroups(line);
    if (row !== null) {
      out.push(row);
    }
  }
  return out;
}

/** Where a sorted list of starts puts `x` (Python's bisect_right). */
function bisectRight(starts: number[], x: number): number {
  let lo = 0;
  let hi = starts.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (x < starts[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

/** The letter of `rank` in sorted disjoint lettered spans (`starts`: their los); '' for none. */
export function letterOf(
  cells: Lettered[],
  rank: number,
  starts: number[] = cells.map(c => c[0])
): string {
  const i = bisectRight(starts, rank);
  return i > 0 && rank <= cells[i - 1][1] ? cells[i - 1][2] : '';
}

function byTuple(a: Lettered, b: Lettered): number {
  return a[0] - b[0] || a[1] - b[1] || (a[2] < b[2] ? -1 : a[2] > b[2] ? 1 : 0);
}

/**
 * Overlapping [lo, hi, letter] spans as disjoint sorted ones, the later span winning where
 * they overlap (replica_matrix.py's _resolve: a sweep over their ends with a heap of the
 * open ones).
 */
export function resolve(assigned: Lettered[]): Lettered[] {
  const ordered = assigned.filter(x => x[0] <= x[1]).sort(byTuple);
  if (ordered.every((a, i) => i === 0 || ordered[i - 1][1] < a[0])) {
    return ordered;
  }
  const cuts = [
    ...new Set(assigned.filter(([lo, hi]) => lo <= hi).flatMap(([lo, hi]) => [lo, hi + 1]))
  ].sort((a, b) => a - b);
  const order = assigned
    .map(([lo, hi], k) => [lo, hi, k])
    .filter(([lo, hi]) => lo <= hi)
    .map(([lo, , k]) => [lo, k])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const open: [number, number][] = []; // a max-heap of [k, hi]: the latest open span on top
  const push = (x: [number, number]) => {
    open.push(x);
    let i = open.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (open[p][0] >= open[i][0]) {
        break;
      }
      [open[p], open[i]] = [open[i], open[p]];
      i = p;
    }
  };
  const pop = () => {
    const last = open.pop() as [number, number];
    if (open.length === 0) {
      return;
    }
    open[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let top = i;
      if (l < open.length && open[l][0] > open[top][0]) {
        top = l;
      }
      if (r < open.length && open[r][0] > open[top][0]) {
        top = r;
      }
      if (top === i) {
        return;
      }
      [open[top], open[i]] = [open[i], open[top]];
      i = top;
    }
  };
  const out: Lettered[] = [];
  let j = 0;
  for (let c = 0; c + 1 < cuts.length; c++) {
    const a = cuts[c];
    const b = cuts[c + 1];
    while (j < order.length && order[j][0] <= a) {
      const k = order[j][1];
      push([k, assigned[k][1]]);
      j++;
    }
    while (open.length > 0 && open[0][1] < a) {
      pop();
    }
    if (open.length === 0) {
      continue;
    }
    const letter = assigned[open[0][0]][2];
    const last = out[out.length - 1];
    if (last !== undefined && last[1] === a - 1 && last[2] === letter) {
      last[1] = b - 1;
    } else {
      out.push([a, b - 1, letter]);
    }
  }
  return out;
}

/**
 * The rows of every replicas_diverged finding in `findings`, and the columns: each rank up to
 * `many` ranks, else the groups of ranks whose cells are alike in every row.
 */
export function replicaMatrix(
  findings: Finding[],
  worldSize = 0,
  many = MANY_RANKS
): ReplicaMatrix {
  const rows: ReplicaRow[] = [];
  let world = worldSize;
  for (const f of findings) {
    if (f.kind !== 'replicas_diverged') {
      continue;
    }
    world = Math.max(world, f.world_size ?? 0);
    for (const [name, groups] of replicaGroups(f)) {
      const assigned: Lettered[] = [];
      const sizes = new Map<string, string>();
      groups.forEach(([spans, held], k) => {
        const letter = k < 26 ? String.fromCharCode(65 + k) : String(k);
        sizes.set(letter, held);
        for (const [lo, hi] of spans) {
          assigned.push([lo, hi, letter]);
        }
      });
      rows.push({
        step: f.step ?? -1,
        name,
        severity: f.severity,
        cells: resolve(assigned),
        sizes
      });
    }
  }
  const everyone = mergeSpans([
    ...rows.flatMap(r => r.cells.map(([lo, hi]) => [lo, hi] as [number, number])),
    ...(world > 0 ? [[0, world - 1] as [number, number]] : [])
  ]);
  const count = everyone.reduce((n, [lo, hi]) => n + hi - lo + 1, 0);
  const columns: [string, Spans][] = [];
  if (count <= many) {
    for (const [lo, hi] of everyone) {
      for (let r = lo; r <= hi; r++) {
        columns.push([String(r), [[r, r]]]);
      }
    }
  } else {
    for (const spans of alike(rows, everyone)) {
      columns.push([formatSpans(spans), spans]);
    }
  }
  return { rows, columns, worldSize: world || count };
}

/**
 * The ranks of `everyone` grouped by their letters in every row, as spans: the largest group
 * first, ties by lowest rank. Pieces between any two span ends are refined row by row,
 * touching only the pieces a row covers, within MAX_CELL_WORK (replica_matrix.py's _alike).
 */
function alike(rows: ReplicaRow[], everyone: Spans): Spans[] {
  const cuts = [
    ...new Set([
      ...rows.flatMap(r => r.cells.flatMap(([lo, hi]) => [lo, hi + 1])),
      ...everyone.flatMap(([lo, hi]) => [lo, hi + 1])
    ])
  ].sort((a, b) => a - b);
  const insideStarts = everyone.map(x => x[0]);
  const pieces: [number, number][] = [];
  for (let c = 0; c + 1 < cuts.length; c++) {
    const a = cuts[c];
    const i = bisectRight(insideStarts, a);
    if (i > 0 && a <= everyone[i - 1][1]) {
      pieces.push([a, cuts[c + 1] - 1]);
    }
  }
  const starts = pieces.map(p => p[0]);
  const classes = new Array<number>(pieces.length).fill(0);
  let fresh = 1;
  let work = 0;
  outer: for (const row of rows) {
    const renamed = new Map<string, number>();
    for (const [lo, hi, letter] of row.cells) {
      const first = bisectRight(starts, lo) - 1;
      const last = bisectRight(starts, hi);
      work += last - first;
      if (work > MAX_CELL_WORK) {
        break outer;
      }
      for (let i = Math.max(first, 0); i < last; i++) {
        const key = `${classes[i]}\u0000${letter}`;
        let next = renamed.get(key);
        if (next === undefined) {
          next = fresh++;
          renamed.set(key, next);
        }
        classes[i] = next;
      }
    }
  }
  const byClass = new Map<number, Spans>();
  pieces.forEach((piece, i) => {
    const spans = byClass.get(classes[i]);
    if (spans === undefined) {
      byClass.set(classes[i], [piece]);
    } else {
      spans.push(piece);
    }
  });
  const size = (g: Spans) => g.reduce((n, [lo, hi]) => n + hi - lo + 1, 0);
  return [...byClass.values()]
    .map(mergeSpans)
    .sort((a, b) => size(b) - size(a) || a[0][0] - b[0][0]);
}

/** A cell's class: a (the majority's bytes), o (other bytes), i (other, but expected). */
function cellClass(row: ReplicaRow, letter: string): string {
  return row.severity === 'info' && letter !== 'A' ? 'i' : letter === 'A' ? 'a' : 'o';
}

/** The panel: the verdict, the tensor x rank table (bounded), what was left out. */
export function renderReplicas(findings: Finding[]): HTMLElement {
  const m = replicaMatrix(findings);
  const title = 'Replicas: do the ranks hold the same tensors?';
  if (m.rows.length === 0) {
    return section(
      'replicas',
      title,
      h(
        'p',
        { class: 'ddpviz-replica-verdict', 'data-rows': 0 },
        "replicas: no divergence reported (the check compares each rank's parameters, " +
          'gradients and buffers bitwise every 25th step by default)'
      )
    );
  }
  const first = m.rows.reduce((lo, r) => Math.min(lo, r.step), Infinity);
  const errors = m.rows.filter(r => r.severity !== 'info').length;
  const verdictLine = h(
    'p',
    {
      class: `ddpviz-replica-verdict ${errors ? 'ddpviz-replica-error' : 'ddpviz-replica-info'}`,
      'data-rows': m.rows.length
    },
    `replicas diverged: ${new Set(m.rows.map(r => r.name)).size} tensor(s) differ across ` +
      `ranks, first seen after step ${first}` +
      (errors ? '' : ' (per-rank buffers, broadcast_buffers=False: expected)')
  );
  const columns = m.columns.slice(0, MAX_COLUMNS);
  const head = h(
    'tr',
    {},
    h('th', {}, 'step'),
    h('th', {}, 'tensor'),
    columns.map(([label]) => h('th', { 'data-ranks': label }, label))
  );
  const body = m.rows.slice(0, MAX_ROWS).map(row => {
    const starts = row.cells.map(c => c[0]);
    return h(
      'tr',
      { 'data-step': row.step, 'data-tensor': row.name },
      h('td', {}, String(row.step)),
      h('td', {}, row.name),
      columns.map(([, spans]) => {
        const letter = letterOf(row.cells, spans[0][0], starts); // a column's ranks share it
        return h(
          'td',
          { class: `ddpviz-rm-${cellClass(row, letter)}`, title: row.sizes.get(letter) ?? '' },
          letter || '·'
        );
      })
    );
  });
  const more: string[] = [];
  if (m.rows.length > MAX_ROWS) {
    more.push(`${m.rows.length - MAX_ROWS} more rows`);
  }
  if (m.columns.length > MAX_COLUMNS) {
    more.push(`${m.columns.length - MAX_COLUMNS} more columns`);
  }
  return section(
    'replicas',
    title,
    verdictLine,
    h(
      'div',
      { class: 'ddpviz-scroll' },
      h('table', { class: 'ddpviz-replica-matrix' }, h('thead', {}, head), h('tbody', {}, body))
    ),
    more.length > 0 ? note(more.join('; ')) : null
  );
}
