/**
 * The verification matrix: is the model the same on every rank? One row per parameter (then
 * buffer), one cell per rank: "same" (the rank agrees with the most common value of every
 * field), "differs", "missing" (the rank has no such entry) or "pending" (not reported yet),
 * from each rank's ParamsBuilt and the verification result (VerificationFailed's mismatches
 * carry the fields ParamsBuilt lacks: strides, requires_grad, buffer shapes).
 *
 * `buildMatrix` is the browser twin of `build_matrix` in ddpviz/model/verification_matrix.py
 * (tests/extension/test_verification_matrix_mirror.py runs both on the same runs): the same
 * rows, cells, differing fields and verdict. As there, a row keeps only the cells of the ranks
 * it names; every other rank's cell follows from the rank alone (`base`), and ranks whose
 * ParamsBuilt lists the same parameters share their cells and values (one entry per class),
 * so 256 ranks x 10,000 parameters cost 10,000 rows, not 2.56M cells.
 *
 * `renderVerificationMatrix` draws it as the dashboard's VerificationView did: the verdict
 * line, a table (rows that differ first when the model is large, at most MAX_ROWS; above
 * MANY_RANKS ranks one column per group of ranks that agree on every row, at most
 * MAX_COLUMNS), the notes that belong to no row, and a detail line per differing row with each
 * group of ranks' values. Text only through `h()` (textContent and attributes): trace strings
 * are hostile.
 */

import { h, note } from './dom';
import { ParamsBuilt, VerificationFailed, VerificationPassed } from './events';
import { TraceModel } from './eventModel';
import { formatRanges, MANY_RANKS, rankLabel } from './rankGroups';
import { pickableAttrs } from './selection';

export type CellStatus = 'same' | 'differs' | 'missing' | 'pending';
export type MatrixState = 'waiting' | 'verifying' | 'passed' | 'failed' | 'unverified';
export type RowKind = 'param' | 'buffer';
/** field -> value (a Map: field names come from the trace). */
export type Values = Map<string, string>;

/** The order fields are compared and shown in (verification_matrix.FIELD_ORDER). */
export const FIELD_ORDER = [
  'present',
  'name',
  'order',
  'index',
  'shape',
  'stride',
  'dtype',
  'device',
  'requires_grad',
  'sparse_grad',
  'count',
  'cuda_device'
];
const LABEL: Record<string, string> = { order: 'index' };
/** Distinct parameter lists a rank's is compared with (past them: its own class). */
export const MAX_CLASSES = 8;
/** Rows drawn (rows that differ first); the rest are counted (verification_view's max_rows). */
export const MAX_ROWS = 40;
/** Columns (ranks or groups of ranks) drawn; the rest are counted. */
export const MAX_COLUMNS = 64;
/** Differing rows given a detail line with every group of ranks' values. */
export const MAX_DETAILS = 8;
/** A cell's glyph, per status (verification_view.GLYPHS). */
export const GLYPHS: Record<CellStatus, string> = {
  same: '✓',
  differs: '≠',
  missing: '∅',
  pending: '…'
};
const COLOURS: Record<CellStatus, string> = {
  same: '#dff3dc',
  differs: '#fdd9b5',
  missing: '#f6c5c5',
  pending: '#eeeeee'
};
const VERDICT_COLOURS: Record<MatrixState, string> = {
  passed: '#1e7b34',
  failed: '#b42318',
  verifying: 'inherit',
  waiting: 'inherit',
  unverified: '#8a6d00'
};

/** What one rank reported of the constructor (event_model.RankState's fields read here). */
export interface RankFacts {
  /** Its (last) ParamsBuilt. */
  params: ParamsBuilt | null;
  verifyStarted: boolean;
  /** Its last VerificationPassed or VerificationFailed. */
  result: VerificationPassed | VerificationFailed | null;
  broadcastStarted: boolean;
  /** It reported a bucket map. */
  maps: boolean;
}

/** A rank's cells or values: the ranks a row names, and the value of each. */
interface RankLookup<V> {
  get(rank: number): V | undefined;
  entries(): Iterable<[number, V]>;
}

/** Every rank of a class has its class's value (verification_matrix._ByClass). */
class ByClass<V> implements RankLookup<V> {
  constructor(
    private readonly classOf: Map<number, number>,
    /** class -> its value. */
    readonly of: Map<number, V>,
    private readonly members: number[]
  ) {}

  get(rank: number): V | undefined {
    const c = this.classOf.get(rank);
    return c === undefined ? undefined : this.of.get(c);
  }

  *entries(): Iterable<[number, V]> {
    for (const r of this.members) {
      yield [r, this.of.get(this.classOf.get(r) as number) as V];
    }
  }
}

/** A plain Map as a RankLookup. */
class ByRank<V> implements RankLookup<V> {
  constructor(private readonly map: Map<number, V>) {}

  get(rank: number): V | undefined {
    return this.map.get(rank);
  }

  entries(): Iterable<[number, V]> {
    return this.map.entries();
  }
}

/** One parameter or buffer across ranks (verification_matrix.Row). */
export class MatrixRow {
  constructor(
    readonly kind: RowKind,
    /** Its index on the lowest rank holding it. */
    readonly position: number,
    readonly name: string,
    /** Fields whose values differ across ranks, in FIELD_ORDER. */
    readonly differing: string[],
    /** Ranks per status, over all of the matrix's ranks (statuses with none left out). */
    readonly counts: Map<CellStatus, number>,
    /** The cells of the ranks this row names. */
    readonly known: RankLookup<CellStatus>,
    /** The values of the ranks this row names. */
    readonly valuesBy: RankLookup<Values>,
    private readonly _base: Map<number, CellStatus>
  ) {}

  get key(): string {
    return `${this.kind}:${this.name}`;
  }

  /** `rank`'s status in this row. */
  cell(rank: number): CellStatus {
    return this.known.get(rank) ?? this._base.get(rank) ?? 'pending';
  }

  /** What `rank` holds (field -> value), if it holds the row or a mismatch names it. */
  values(rank: number): Values | undefined {
    return this.valuesBy.get(rank);
  }

  /** The worst cell: missing > differs > pending > same. */
  get status(): CellStatus {
    for (const s of ['missing', 'differs', 'pending'] as CellStatus[]) {
      if (this.counts.get(s)) {
        return s;
      }
    }
    return 'same';
  }
}

export interface VerificationMatrix {
  ranks: number[];
  worldSize: number | null;
  /** Parameters in index order, then buffers. */
  rows: MatrixRow[];
  state: MatrixState;
  /** VerificationPassed's digest ("" otherwise). */
  digest: string;
  /** Count and GPU-sharing mismatches, which belong to no row. */
  notes: string[];
  /** The one-line summary, plain text. */
  verdict: string;
  /** Cells of the reporting ranks in rows not naming them. */
  base: Map<number, CellStatus>;
  /** rank -> its class: ranks whose ParamsBuilt lists the same (rows share their cells). */
  classOf: Map<number, number>;
}

/** [3] -> "rank 3"; [0, 1, 2] -> "ranks 0,1,2"; runs of 4 or more as "a-b" (findings.py). */
function formatRanks(ranks: number[]): string {
  if (ranks.length === 0) {
    return 'no rank';
  }
  return (ranks.length === 1 ? 'rank ' : 'ranks ') + formatRanges(ranks, { run: 4, sep: ',' });
}

/** Python's str < str: by code point (JavaScript's compares UTF-16 units). */
function compareStrings(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = (x[i].codePointAt(0) as number) - (y[i].codePointAt(0) as number);
    if (d !== 0) {
      return d;
    }
  }
  return x.length - y.length;
}

/** 'shape=(16, 8) dtype=float32 ...' in FIELD_ORDER (verification_matrix.describe). */
export function describe(values: Values): string {
  const parts: string[] = [];
  for (const f of FIELD_ORDER) {
    const v = values.get(f);
    if (v !== undefined && f !== 'present') {
      parts.push(`${LABEL[f] ?? f}=${v}`);
    }
  }
  return parts.join(' ') || 'present';
}

/** Python's str(tuple(shape)): (16, 8), (16,), (). */
function shapeText(shape: number[]): string {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
}

function sameParams(a: ParamsBuilt, b: ParamsBuilt): boolean {
  if (a.params === b.params && a.buffers === b.buffers) {
    return true;
  }
  if (a.params.length !== b.params.length || a.buffers.length !== b.buffers.length) {
    return false;
  }
  for (let i = 0; i < a.buffers.length; i++) {
    if (a.buffers[i] !== b.buffers[i]) {
      return false;
    }
  }
  for (let i = 0; i < a.params.length; i++) {
    const p = a.params[i];
    const q = b.params[i];
    if (
      p.index !== q.index ||
      p.name !== q.name ||
      p.dtype !== q.dtype ||
      p.device !== q.device ||
      p.sparse_grad !== q.sparse_grad ||
      p.shape.length !== q.shape.length ||
      p.shape.some((d, j) => d !== q.shape[j])
    ) {
      return false;
    }
  }
  return true;
}

/** {rank: value} -> [value, ranks][], most common value first, ties by lowest rank. */
function groupRanks(values: Iterable<[number, string]>): [string, number[]][] {
  const byValue = new Map<string, number[]>();
  for (const [r, v] of [...values].sort((a, b) => a[0] - b[0])) {
    pushTo(byValue, v, r);
  }
  return [...byValue.entries()].sort((a, b) => b[1].length - a[1].length || a[1][0] - b[1][0]);
}

function bump(counts: Map<CellStatus, number>, status: CellStatus, n: number): void {
  counts.set(status, (counts.get(status) ?? 0) + n);
}

function nonZero(counts: Map<CellStatus, number>): Map<CellStatus, number> {
  return new Map([...counts].filter(([, n]) => n !== 0));
}

function inOrder(fields: Set<string>): string[] {
  return FIELD_ORDER.filter(f => fields.has(f));
}

/**
 * Each rank's constructor facts in `model` and the world size, as EventModel folds a trace:
 * the last ParamsBuilt and verification result per rank; the world size from the last
 * verification event (ranks in order), else the highest rank + 1.
 */
export function rankFacts(model: TraceModel): {
  states: Map<number, RankFacts>;
  worldSize: number | null;
} {
  const states = new Map<number, RankFacts>();
  let worldSize: number | null = null;
  for (const rank of model.ranks) {
    const facts: RankFacts = {
      params: null,
      verifyStarted: false,
      result: null,
      broadcastStarted: false,
      maps: false
    };
    // (the rank's model, verification, broadcast and map events: all this reads)
    for (const e of model.setupEvents(rank)) {
      switch (e.type) {
        case 'ParamsBuilt':
          facts.params = e;
          break;
        case 'VerificationStarted':
          facts.verifyStarted = true;
          worldSize = e.world_size;
          break;
        case 'VerificationPassed':
        case 'VerificationFailed':
          facts.result = e;
          worldSize = e.world_size;
          break;
        case 'BroadcastStarted':
          facts.broadcastStarted = true;
          break;
        case 'BucketAssigned':
          facts.maps = true;
          break;
        default:
          break;
      }
    }
    states.set(rank, facts);
  }
  if (worldSize === null && model.ranks.length > 0) {
    worldSize = model.ranks[model.ranks.length - 1] + 1;
  }
  return { states, worldSize };
}

const cache = new WeakMap<TraceModel, VerificationMatrix>();

/** The matrix of `model` (computed once per model). */
export function verificationMatrix(model: TraceModel): VerificationMatrix {
  let m = cache.get(model);
  if (m === undefined) {
    const { states, worldSize } = rankFacts(model);
    m = buildMatrix(states, worldSize);
    cache.set(model, m);
  }
  return m;
}

/** The matrix for the constructor facts in `states` (verification_matrix.build_matrix). */
export function buildMatrix(
  states: Map<number, RankFacts>,
  worldSize: number | null = null
): VerificationMatrix {
  const stateRanks = [...states.keys()].sort((a, b) => a - b);
  const rankSet = new Set(stateRanks);
  for (let r = 0; r < (worldSize ?? 0); r++) {
    rankSet.add(r);
  }
  const firstIndex = new Map<string, [number, number]>(); // key -> (lowest rank, index there)
  const kinds = new Map<string, RowKind>();
  const listed = new Set<number>(); // ranks whose ParamsBuilt we have
  const note = (key: string, kind: RowKind, rank: number, index: number) => {
    kinds.set(key, kind);
    const f = firstIndex.get(key);
    if (f === undefined || rank < f[0] || (rank === f[0] && index < f[1])) {
      firstIndex.set(key, [rank, index]);
    }
  };

  // ranks by the parameters and buffers they list, lowest rank first
  const classes: { built: ParamsBuilt; members: number[] }[] = [];
  for (const r of stateRanks) {
    const built = (states.get(r) as RankFacts).params;
    if (built === null) {
      continue;
    }
    const found = classes.slice(0, MAX_CLASSES).find(c => sameParams(c.built, built));
    if (found === undefined) {
      classes.push({ built, members: [r] });
    } else {
      found.members.push(r);
    }
  }
  const classValues: Map<string, Values>[] = []; // class -> key -> values
  const holding = new Map<string, number[]>(); // key -> the classes holding it, in order
  const classOf = new Map<number, number>();
  classes.forEach(({ built, members }, c) => {
    const low = members[0];
    const values = new Map<string, Values>();
    for (const p of built.params) {
      const key = `param:${p.name}`;
      note(key, 'param', low, p.index);
      values.set(
        key,
        new Map([
          ['index', String(p.index)],
          ['shape', shapeText(p.shape)],
          ['dtype', p.dtype],
          ['device', p.device.split(':')[0]],
          ['sparse_grad', p.sparse_grad ? 'True' : 'False']
        ])
      );
    }
    built.buffers.forEach((name, i) => {
      const key = `buffer:${name}`;
      note(key, 'buffer', low, i);
      values.set(key, new Map([['index', String(i)]]));
    });
    classValues.push(values);
    for (const key of values.keys()) {
      pushTo(holding, key, c);
    }
    for (const r of members) {
      listed.add(r);
      classOf.set(r, c);
    }
  });

  /** The row's values rank by rank (copies), lowest rank first. */
  const perRank = (key: string): Map<number, Values> => {
    const ranks: number[] = [];
    for (const c of holding.get(key) ?? []) {
      for (const r of classes[c].members) {
        ranks.push(r);
      }
    }
    ranks.sort((a, b) => a - b);
    return new Map(
      ranks.map(r => [r, new Map(classValues[classOf.get(r) as number].get(key) as Values)])
    );
  };

  const entries = new Map<string, Map<number, Values>>(); // rows built rank by rank
  // the verification result: every rank computes the same one; take the lowest rank's
  let failed: VerificationFailed | null = null;
  let passed: VerificationPassed | null = null;
  const verified = new Set<number>();
  for (const r of stateRanks) {
    const result = (states.get(r) as RankFacts).result;
    if (result === null) {
      continue;
    }
    verified.add(r);
    if (result.type === 'VerificationFailed') {
      failed = failed ?? result;
    } else {
      passed = passed ?? result;
    }
  }
  const notes: string[] = [];
  const flagged = new Map<string, Map<number, Set<string>>>(); // key -> rank -> its fields
  if (failed !== null) {
    for (let r = 0; r < failed.world_size; r++) {
      rankSet.add(r);
    }
    for (const m of failed.mismatches) {
      if (m.kind === 'count' || m.kind === 'device') {
        const what = m.kind === 'count' ? m.name : 'GPUs shared on one host';
        notes.push(
          `${m.field} of ${what}: ` +
            m.values.map(([v, rs]) => `${formatRanks(rs)}: ${v}`).join('; ')
        );
        continue;
      }
      const kind: RowKind = m.kind === 'param' ? 'param' : 'buffer';
      const key = `${kind}:${m.name}`;
      let low = Infinity;
      for (const [v, rs] of m.values) {
        if (v !== 'missing') {
          for (const r of rs) {
            low = Math.min(low, r);
          }
        }
      }
      note(key, kind, low === Infinity ? 0 : low, m.index);
      let rowValues = entries.get(key);
      if (rowValues === undefined) {
        rowValues = perRank(key);
        entries.set(key, rowValues);
      }
      for (const [value, rs] of m.values) {
        for (const r of rs) {
          let v = rowValues.get(r);
          if (v === undefined) {
            v = new Map();
            rowValues.set(r, v);
          }
          v.set(m.field, value);
          if (m.field === 'present' && value === 'missing') {
            rowValues.set(r, new Map([['present', 'missing']]));
          }
        }
      }
      for (const [value, rs] of m.field === 'present' ? m.values : m.values.slice(1)) {
        if (m.field === 'present' && value !== 'missing') {
          continue;
        }
        let byRank = flagged.get(key);
        if (byRank === undefined) {
          byRank = new Map();
          flagged.set(key, byRank);
        }
        for (const r of rs) {
          addField(byRank, r, m.field);
        }
      }
    }
  }
  const ranks = [...rankSet].sort((a, b) => a - b);

  // a rank's cell in a row that does not name it depends on the rank alone
  const base = new Map<number, CellStatus>();
  for (const r of stateRanks) {
    if (listed.has(r)) {
      base.set(r, 'missing'); // its ParamsBuilt does not list the row
    } else if (verified.has(r) && (passed !== null || failed !== null)) {
      base.set(r, 'same'); // verified, and no mismatch names this rank
    } else {
      base.set(r, 'pending');
    }
  }
  const baseCounts = new Map<CellStatus, number>();
  for (const [r, c] of base) {
    if (rankSet.has(r)) {
      bump(baseCounts, c, 1);
    }
  }
  const anonymous = ranks.length - [...baseCounts.values()].reduce((a, b) => a + b, 0);
  const ctx: RowContext = { base, baseCounts, anonymous, rankSet };
  const sizes = classes.map(c => c.members.length);
  const membersOf = new Map<string, number[]>(); // holding classes -> their ranks

  const keys = [...firstIndex.keys()].sort((a, b) => {
    const [ra, ia] = firstIndex.get(a) as [number, number];
    const [rb, ib] = firstIndex.get(b) as [number, number];
    return (
      Number(kinds.get(a) !== 'param') - Number(kinds.get(b) !== 'param') ||
      ia - ib ||
      ra - rb ||
      compareStrings(a, b)
    );
  });
  const rows: MatrixRow[] = [];
  // rows held by one class: each row's cells, counts and differing fields are those of its
  // class (its ParamsBuilt alone lists it: nothing to compare), made once per class
  const single = new Map<number, MatrixRow>();
  for (const key of keys) {
    const kind = kinds.get(key) as RowKind;
    const name = key.slice(key.indexOf(':') + 1);
    const position = (firstIndex.get(key) as [number, number])[1];
    const rowValues = entries.get(key);
    if (rowValues === undefined) {
      const held = holding.get(key) ?? [];
      const groupKey = held.join(',');
      let members = membersOf.get(groupKey);
      if (members === undefined) {
        members = held.flatMap(c => classes[c].members).sort((a, b) => a - b);
        membersOf.set(groupKey, members);
      }
      const like = held.length === 1 ? single.get(held[0]) : undefined;
      if (like !== undefined) {
        const values = classValues[held[0]].get(key) as Values;
        rows.push(
          new MatrixRow(
            kind,
            position,
            name,
            like.differing,
            like.counts,
            like.known,
            new ByClass(classOf, new Map([[held[0], values]]), members),
            base
          )
        );
        continue;
      }
      rows.push(
        classRow(
          kind,
          position,
          name,
          held,
          key,
          classValues,
          classes,
          sizes,
          classOf,
          members,
          ctx
        )
      );
      if (held.length === 1) {
        single.set(held[0], rows[rows.length - 1]);
      }
    } else {
      rows.push(rankRow(kind, position, name, rowValues, flagged.get(key) ?? new Map(), ctx));
    }
  }

  let state: MatrixState;
  if (failed !== null) {
    state = 'failed';
  } else if (passed !== null && verified.size >= ranks.length) {
    state = 'passed';
  } else if (stateRanks.some(r => (states.get(r) as RankFacts).verifyStarted) || verified.size) {
    state = 'verifying';
  } else if (
    stateRanks.some(r => {
      const s = states.get(r) as RankFacts;
      return s.broadcastStarted || s.maps;
    })
  ) {
    state = 'unverified'; // init_sync=False: DDP skipped verification and broadcast
  } else {
    state = 'waiting';
  }
  const matrix: VerificationMatrix = {
    ranks,
    worldSize: worldSize ?? (failed !== null ? failed.world_size : null),
    rows,
    state,
    digest: passed !== null ? passed.digest : '',
    notes,
    verdict: '',
    base,
    classOf
  };
  matrix.verdict = matrixVerdict(matrix, states);
  return matrix;
}

interface RowContext {
  base: Map<number, CellStatus>;
  baseCounts: Map<CellStatus, number>;
  anonymous: number;
  rankSet: Set<number>;
}

/** One row from its values rank by rank (a row a mismatch names). */
function rankRow(
  kind: RowKind,
  position: number,
  name: string,
  perRank: Map<number, Values>,
  flagged: Map<number, Set<string>>,
  { base, baseCounts, anonymous, rankSet }: RowContext
): MatrixRow {
  const holders = [...perRank].filter(([, v]) => v.get('present') !== 'missing');
  const holderSet = new Set(holders.map(([r]) => r));
  const differing = new Set<string>();
  const rankFields = new Map<number, Set<string>>(
    [...flagged].map(([r, f]) => [r, new Set(f)] as [number, Set<string>])
  );
  // ParamsBuilt's index shifts after an entry missing on a rank; verification reports true
  // reorderings as "order", so the index alone never flags a cell
  const allFields = new Set<string>();
  for (const [, v] of holders) {
    for (const f of v.keys()) {
      if (f !== 'present' && f !== 'index') {
        allFields.add(f);
      }
    }
  }
  for (const f of allFields) {
    const groups = groupRanks(
      holders.filter(([, v]) => v.has(f)).map(([r, v]) => [r, v.get(f) as string])
    );
    if (groups.length > 1) {
      differing.add(f);
      for (const [, rs] of groups.slice(1)) {
        for (const r of rs) {
          addField(rankFields, r, f);
        }
      }
    }
  }
  const known = new Map<number, CellStatus>();
  const counts = new Map(baseCounts);
  bump(counts, 'pending', anonymous);
  const named = [...new Set([...perRank.keys(), ...rankFields.keys()])]
    .filter(r => rankSet.has(r))
    .sort((a, b) => a - b);
  for (const r of named) {
    const fields = rankFields.get(r) ?? new Set<string>();
    let cell: CellStatus;
    if (perRank.get(r)?.get('present') === 'missing' || fields.has('present')) {
      cell = 'missing';
    } else if (holderSet.has(r)) {
      cell = fields.size ? 'differs' : 'same';
    } else {
      cell = base.get(r) ?? 'pending';
    }
    known.set(r, cell);
    bump(counts, base.get(r) ?? 'pending', -1);
    bump(counts, cell, 1);
  }
  if (counts.get('missing')) {
    differing.add('present');
  }
  for (const fields of rankFields.values()) {
    for (const f of fields) {
      differing.add(f);
    }
  }
  return new MatrixRow(
    kind,
    position,
    name,
    inOrder(differing),
    nonZero(counts),
    new ByRank(known),
    new ByRank(perRank),
    base
  );
}

/** One row no mismatch names, class by class (verification_matrix._class_row). */
function classRow(
  kind: RowKind,
  position: number,
  name: string,
  holding: number[],
  key: string,
  classValues: Map<string, Values>[],
  classes: { members: number[] }[],
  sizes: number[],
  classOf: Map<number, number>,
  members: number[],
  { base, baseCounts, anonymous }: RowContext
): MatrixRow {
  const differing = new Set<string>();
  const classFields = new Map<number, Set<string>>();
  const values = holding.map(c => classValues[c].get(key) as Values);
  if (holding.length > 1) {
    const allFields = new Set<string>();
    for (const v of values) {
      for (const f of v.keys()) {
        if (f !== 'present' && f !== 'index') {
          allFields.add(f);
        }
      }
    }
    for (const f of allFields) {
      const byValue = new Map<string, number[]>();
      holding.forEach((c, i) => {
        const v = values[i].get(f);
        if (v !== undefined) {
          pushTo(byValue, v, c);
        }
      });
      if (byValue.size > 1) {
        differing.add(f);
        const groups = [...byValue.values()]
          .map(cs => ({
            cs,
            weight: cs.reduce((n, c) => n + sizes[c], 0),
            lowest: cs.reduce((n, c) => Math.min(n, classes[c].members[0]), Infinity)
          }))
          .sort((a, b) => b.weight - a.weight || a.lowest - b.lowest);
        for (const { cs } of groups.slice(1)) {
          for (const c of cs) {
            addField(classFields, c, f);
          }
        }
      }
    }
  }
  const counts = new Map(baseCounts);
  bump(counts, 'pending', anonymous);
  const cells = new Map<number, CellStatus>();
  for (const c of holding) {
    const cell: CellStatus = classFields.has(c) ? 'differs' : 'same';
    cells.set(c, cell);
    bump(counts, 'missing', -sizes[c]); // the base of a rank with a ParamsBuilt
    bump(counts, cell, sizes[c]);
  }
  if (counts.get('missing')) {
    differing.add('present');
  }
  return new MatrixRow(
    kind,
    position,
    name,
    inOrder(differing),
    nonZero(counts),
    new ByClass(classOf, cells, members),
    new ByClass(classOf, new Map(holding.map((c, i) => [c, values[i]])), members),
    base
  );
}

/** The ranks whose cell in `row` is `status`, sorted. */
export function ranksWith(m: VerificationMatrix, row: MatrixRow, status: CellStatus): number[] {
  return m.ranks.filter(r => row.cell(r) === status);
}

/** One line: what the verification concluded, or how far it got (verification_matrix.verdict). */
export function matrixVerdict(m: VerificationMatrix, states: Map<number, RankFacts>): string {
  const nParams = m.rows.filter(r => r.kind === 'param').length;
  const nBuffers = m.rows.length - nParams;
  const world = m.worldSize || m.ranks.length;
  const bad = m.rows.filter(r => r.status === 'differs' || r.status === 'missing');
  if (m.state === 'failed') {
    const head = `✘ the model differs across ${world} ranks: `;
    const parts: string[] = [];
    if (bad.length) {
      const first = bad[0];
      const what = first.kind === 'param' ? 'parameter' : 'buffer';
      const fields = first.differing.filter(f => f !== 'present').join(', ');
      const missing = ranksWith(m, first, 'missing');
      const how = missing.length ? 'missing on ' + formatRanks(missing) : `${fields} differs`;
      parts.push(`${what} ${first.position} '${first.name}' ${how}`);
      if (bad.length > 1) {
        const more = bad.length - 1;
        parts.push(`${more} more row${more > 1 ? 's differ' : ' differs'}`);
      }
    }
    return head + parts.concat(m.notes).join('; ');
  }
  if (m.state === 'passed') {
    return (
      `✔ identical on all ${world} ranks: ${nParams} parameters, ${nBuffers} buffers ` +
      `(digest ${m.digest})`
    );
  }
  if (m.state === 'verifying') {
    const done = [...states].filter(([, s]) => s.result !== null).length;
    return (
      `… verifying across ${world} ranks: ${done} of ${world} have a result ` +
      `(${nParams} parameters, ${nBuffers} buffers)`
    );
  }
  if (m.state === 'unverified') {
    const same = bad.length === 0;
    return (
      `${same ? '✔' : '✘'} init_sync=False: no verification ran; the parameter lists ` +
      `${same ? 'agree' : 'differ'} on the ${m.ranks.length} ranks that reported`
    );
  }
  if (m.rows.length) {
    const reported = [...states.keys()].sort((a, b) => a - b);
    return `… parameters built on ${formatRanks(reported)}; waiting for verification`;
  }
  return '… waiting for the ranks to build DistributedDataParallel';
}

/**
 * The matrix's columns: one rank each (up to `many` ranks), else groups of ranks identical on
 * every row, by their lowest rank (verification_view.columns). Only rows with a difference
 * tell ranks apart, and there only the cell and the differing fields' values do; a rank's
 * signature is its base cell plus the rows where it departs from it. A row shared by a class
 * of ranks departs alike on all of them (their base: "missing"), so it is read once per class:
 * linear in the classes and the cells rows name rank by rank, not in rows x ranks.
 */
export function matrixColumns(m: VerificationMatrix, many = MANY_RANKS): number[][] {
  if (m.ranks.length <= many) {
    return m.ranks.map(r => [r]);
  }
  const departs = new Map<number, [number, string][]>(); // rank -> its rank-by-rank departures
  const classDeparts = new Map<number, [number, string][]>(); // class -> its departures
  m.rows.forEach((row, i) => {
    if (!row.differing.length && row.status === 'same') {
      return;
    }
    const blank = '|'.repeat(Math.max(row.differing.length - 1, 0));
    const entry = (cell: CellStatus, values: Values | undefined) =>
      cell + '|' + row.differing.map(f => values?.get(f) ?? '').join('|');
    if (row.known instanceof ByClass && row.valuesBy instanceof ByClass) {
      const values = row.valuesBy.of as Map<number, Values>;
      for (const [c, cell] of (row.known as ByClass<CellStatus>).of) {
        const e = entry(cell, values.get(c));
        if (e !== 'missing|' + blank) {
          pushTo(classDeparts, c, [i, e]);
        }
      }
      return;
    }
    for (const [r, cell] of row.known.entries()) {
      const e = entry(cell, row.values(r));
      if (e !== (m.base.get(r) ?? 'pending') + '|' + blank) {
        pushTo(departs, r, [i, e]);
      }
    }
  });
  const signatures = new Map<string, number>(); // a class's departures -> a small id
  const classId = new Map<number, number>();
  for (const [c, list] of classDeparts) {
    const key = JSON.stringify(list);
    let id = signatures.get(key);
    if (id === undefined) {
      id = signatures.size;
      signatures.set(key, id);
    }
    classId.set(c, id);
  }
  const groups = new Map<string, number[]>();
  for (const r of m.ranks) {
    const c = m.classOf.get(r);
    const signature = JSON.stringify([
      m.base.get(r) ?? 'pending',
      c === undefined ? -1 : (classId.get(c) ?? -1),
      departs.get(r) ?? []
    ]);
    pushTo(groups, signature, r);
  }
  return [...groups.values()].sort((a, b) => a[0] - b[0]);
}

/** The rows drawn: every row that is not "same" first in mind, in order, then as many "same"
 * rows as fit in `most`, in order (verification_view.shown_rows). */
export function shownRows(m: VerificationMatrix, most = MAX_ROWS): MatrixRow[] {
  if (m.rows.length <= most) {
    return m.rows;
  }
  const bad: number[] = [];
  const good: number[] = [];
  m.rows.forEach((row, i) => {
    (row.status === 'same' ? good : bad).push(i);
  });
  const kept = bad.slice(0, most);
  const chosen = [...kept, ...good.slice(0, most - kept.length)].sort((a, b) => a - b);
  return chosen.map(i => m.rows[i]);
}

function short(label: string, limit = 40): string {
  return label.length <= limit ? label : label.slice(0, limit - 1) + '…';
}

/** What a rank holds in `row`, as text: its values, "missing" or "not reported yet". */
function cellText(row: MatrixRow, rank: number): string {
  const status = row.cell(rank);
  if (status === 'missing') {
    return 'missing';
  }
  if (status === 'pending') {
    return 'not reported yet';
  }
  return describe(row.values(rank) ?? new Map());
}

/** A row's detail line: each group of ranks with what it holds, differing fields marked. */
function detail(m: VerificationMatrix, row: MatrixRow): HTMLElement {
  const what = row.kind === 'param' ? 'parameter' : 'buffer';
  const head = row.differing.length
    ? ' · differs in: ' + row.differing.filter(f => f !== 'present').join(', ')
    : ' · the same on every rank';
  const described = new Map<number, string>();
  const texts = new Map<string, Values | null>();
  const seen = new Map<Values, string>(); // ranks of a class share their values
  for (const r of m.ranks) {
    const status = row.cell(r);
    const values = row.values(r);
    let text: string;
    if (status === 'missing' || status === 'pending' || values === undefined) {
      text = cellText(row, r);
    } else {
      text = seen.get(values) ?? describe(values);
      seen.set(values, text);
    }
    described.set(r, text);
    if (!texts.has(text)) {
      texts.set(text, status === 'same' || status === 'differs' ? (values ?? null) : null);
    }
  }
  const groups = groupRanks(described);
  const lines = groups.slice(0, MAX_COLUMNS).map(([text, ranks]) => {
    const values = texts.get(text) ?? null;
    const parts: (HTMLElement | string)[] = [];
    if (values === null) {
      parts.push(text);
    } else {
      for (const f of FIELD_ORDER) {
        const v = values.get(f);
        if (v === undefined || f === 'present') {
          continue;
        }
        const part = `${LABEL[f] ?? f}=${v}`;
        if (parts.length) {
          parts.push(' ');
        }
        parts.push(
          row.differing.includes(f)
            ? h(
                'span',
                { class: 'ddpviz-vm-differs', style: 'color:#b42318;font-weight:bold' },
                part
              )
            : part
        );
      }
      if (!parts.length) {
        parts.push('present');
      }
    }
    return h(
      'div',
      { 'data-ranks': short(rankLabel(ranks), 400) },
      `${short(formatRanks(ranks), 400)}: `,
      parts
    );
  });
  if (groups.length > MAX_COLUMNS) {
    lines.push(h('div', {}, `… and ${groups.length - MAX_COLUMNS} more groups of ranks`));
  }
  return h(
    'div',
    {
      class: 'ddpviz-vm-detail ddpviz-mono',
      'data-name': row.name,
      'data-kind': row.kind,
      style: 'font-size:12px;margin:4px 0'
    },
    h('div', { style: 'font-weight:bold' }, `${what} ${row.position} '${row.name}'${head}`),
    lines
  );
}

/**
 * The matrix of `model` drawn: the verdict line, the table, notes and detail lines; null when
 * the trace holds nothing of the constructor (no rows and nothing verified).
 *
 * DOM hooks: `p.ddpviz-vm-verdict[data-state]`; `table.ddpviz-vm[data-grouped]`, its header
 * `th[data-ranks][data-count]` per column; a `tr[data-name][data-kind][data-status]` per row
 * drawn (a parameter's also `[data-param][role=button]`: a click selects it), a `td.ddpviz-vm-<status>[data-status][title]` per column; `p.ddpviz-vm-more`
 * (rows or columns left out), `p.ddpviz-vm-note` (mismatches of no row),
 * `div.ddpviz-vm-detail[data-name][data-kind]` per differing row (at most MAX_DETAILS).
 */
export function renderVerificationMatrix(model: TraceModel, many = MANY_RANKS): HTMLElement | null {
  const m = verificationMatrix(model);
  if (m.rows.length === 0 && m.state === 'waiting') {
    return null;
  }
  const verdict = h(
    'p',
    {
      class: 'ddpviz-vm-verdict',
      'data-state': m.state,
      style: `font-weight:bold;color:${VERDICT_COLOURS[m.state]}`
    },
    m.verdict
  );
  if (m.rows.length === 0) {
    return h('div', { class: 'ddpviz-vm-panel' }, verdict);
  }
  const all = matrixColumns(m, many);
  const columns = all.slice(0, MAX_COLUMNS);
  const leftOut = all.slice(MAX_COLUMNS);
  const grouped = m.ranks.length > many;
  const head = h(
    'tr',
    {},
    h('th', {}, '#'),
    h('th', {}, 'name'),
    columns.map(g => {
      const label = rankLabel(g);
      return h(
        'th',
        { title: short(label, 400), 'data-ranks': short(label, 400), 'data-count': g.length },
        (g.length === 1 ? 'r' : `${g.length} ranks: `) + short(label)
      );
    })
  );
  const shown = shownRows(m);
  const body = shown.map(row =>
    h(
      'tr',
      {
        'data-name': row.name,
        'data-kind': row.kind,
        'data-status': row.status,
        // a parameter's row selects it (selection.ts): `position` is its index on the lowest
        // rank holding it, as the bucket maps of that rank number it
        ...(row.kind === 'param' ? { 'data-param': row.position, ...pickableAttrs() } : {})
      },
      h('td', {}, `${row.kind === 'param' ? 'p' : 'b'}${row.position}`),
      h('td', {}, row.name),
      columns.map(g => {
        const status = row.cell(g[0]);
        let title = `${short(formatRanks(g), 400)}: ${cellText(row, g[0])}`;
        if (status === 'differs') {
          title += ' · differs in: ' + row.differing.filter(f => f !== 'present').join(', ');
        }
        return h(
          'td',
          {
            class: `ddpviz-vm-${status}`,
            'data-status': status,
            title,
            style: `background:${COLOURS[status]};color:#222;text-align:center`
          },
          GLYPHS[status]
        );
      })
    )
  );
  const table = h(
    'table',
    {
      class: 'ddpviz-vm ddpviz-mono',
      'data-grouped': String(grouped),
      style: 'border-collapse:collapse;font-size:11px'
    },
    h('thead', {}, head),
    h('tbody', {}, body)
  );
  const more: HTMLElement[] = [];
  if (leftOut.length) {
    const n = leftOut.reduce((a, g) => a + g.length, 0);
    more.push(
      note(
        `… and ${leftOut.length.toLocaleString('en-US')} more columns ` +
          `(${n.toLocaleString('en-US')} ranks)`,
        'vm-more'
      )
    );
  }
  const hidden = m.rows.length - shown.length;
  if (hidden) {
    more.push(
      note(`… and ${hidden.toLocaleString('en-US')} more rows, the same on every rank`, 'vm-more')
    );
  }
  const bad = m.rows.filter(r => r.status === 'differs' || r.status === 'missing');
  const details = bad.slice(0, MAX_DETAILS).map(row => detail(m, row));
  if (bad.length > MAX_DETAILS) {
    more.push(note(`… and ${bad.length - MAX_DETAILS} more rows that differ`, 'vm-more'));
  }
  return h(
    'div',
    { class: 'ddpviz-vm-panel' },
    verdict,
    h('div', { class: 'ddpviz-scroll', style: 'max-height:420px;overflow:auto' }, table),
    more,
    m.notes.map(text => note(text, 'vm-note')),
    details
  );
}

/** `field` added to `key`'s set of differing fields in `fields`. */
function addField<K>(fields: Map<K, Set<string>>, key: K, field: string): void {
  const set = fields.get(key);
  if (set === undefined) {
    fields.set(key, new Set([field]));
  } else {
    set.add(field);
  }
}

/** `value` appended to `key`'s list in `lists` (a new list for a new key). */
function pushTo<K, V>(lists: Map<K, V[]>, key: K, value: V): void {
  const list = lists.get(key);
  if (list === undefined) {
    lists.set(key, [value]);
  } else {
    list.push(value);
  }
}
