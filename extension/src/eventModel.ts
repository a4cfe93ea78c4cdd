/**
 * What the trace viewer shows, computed from a parsed trace with no DOM: bucket maps grouped
 * across ranks, each rank's verification outcome, broadcast progress and, per DDP iteration,
 * a timeline of gradient hooks and bucket all-reduces. The viewer's twin of
 * ddpviz/model/event_model.py: the same readings as the Python side (`Trace.spans()`, the
 * widgets), from the same events.
 */

import {
  AllReduceDone,
  AllReduceLaunched,
  BucketAssigned,
  DDPEvent,
  EventType,
  Finding,
  Mismatch,
  ParamInfo
} from './events';
import { ParsedTrace } from './trace';
import { WaitFold, whoWaited } from './straggler';

/**
 * Bytes per element by dtype name, only for traces written before `ParamInfo.element_size`
 * (the same table as `_LEGACY_ELEMENT_SIZE` in ddpviz/events.py).
 */
const LEGACY_ELEMENT_SIZE: Record<string, number> = {
  float64: 8,
  double: 8,
  int64: 8,
  long: 8,
  uint64: 8,
  complex64: 8,
  complex128: 16,
  complex32: 4,
  float32: 4,
  float: 4,
  int32: 4,
  int: 4,
  uint32: 4,
  float16: 2,
  half: 2,
  bfloat16: 2,
  int16: 2,
  uint16: 2,
  uint8: 1,
  int8: 1,
  bool: 1
};

/**
 * Bytes per element of a parameter's gradient: as recorded, or (older traces) from its dtype's
 * name (float8 types: 1); 0 when neither says (as `element_size_of` in ddpviz/events.py).
 */
export function elementSize(p: ParamInfo): number {
  const size = p.element_size;
  if (typeof size === 'number' && Number.isInteger(size) && size > 0 && size <= 64) {
    return size;
  }
  const dtype = p.dtype.replace(/^torch\./, '');
  return Object.prototype.hasOwnProperty.call(LEGACY_ELEMENT_SIZE, dtype)
    ? LEGACY_ELEMENT_SIZE[dtype]
    : dtype.startsWith('float8')
      ? 1
      : 0;
}

/** Bytes of a parameter's gradient: numel times the element size. */
export function paramBytes(p: ParamInfo): number {
  const numel = p.shape.reduce((a, b) => a * b, 1);
  const size = elementSize(p);
  return numel * size;
}

/** A bucket map that one or more ranks used (ranks that differ get their own group). */
export interface BucketMapGroup {
  rebuilt: boolean;
  /** DDP iteration of the BucketAssigned event (-1: the constructor). */
  step: number;
  ranks: number[];
  /** Parameter indices per bucket, in reduction order. */
  buckets: number[][];
  limits: number[];
  /** Gradient bytes per bucket (0 where the parameters are unknown). */
  bytes: number[];
}

/** One rank's verification outcome (its last verification). */
export interface VerificationRow {
  rank: number;
  /** "running": started, never passed nor failed (the rank crashed or hung in it). */
  status: 'passed' | 'failed' | 'running' | 'absent';
  worldSize: number;
  nParams: number;
  nBuffers: number;
  digest: string;
  mismatches: Mismatch[];
}

/** One rank's state broadcast (its last one). */
export interface BroadcastRow {
  rank: number;
  src: number;
  totalBytes: number;
  nChunks: number;
  chunksDone: number;
  bytesDone: number;
  /** Seconds from BroadcastFinished; null while unfinished. */
  seconds: number | null;
}

/** An interval on the aligned clock, in ns. */
export interface Interval {
  name: string;
  start: number;
  end: number;
  /** False: no end event (the rank crashed or hung inside it). */
  finished: boolean;
}

/** A bucket's all-reduce in one iteration. */
export interface AllReduceSpan extends Interval {
  bucket: number;
  nbytes: number;
}

/** A gradient hook firing. */
export interface GradMark {
  t: number;
  param: number;
  bucket: number;
}

/**
 * One bucket's gradients in a step recorded at an aggregated detail level (a GradsSummarized:
 * no per-parameter hooks): first and last gradient ready, aligned ns.
 */
export interface GradSummary {
  bucket: number;
  first: number;
  last: number;
  nGrads: number;
  nbytes: number;
}

/** One rank's lane of the hook timeline. */
export interface TimelineRow {
  rank: number;
  phases: Interval[];
  grads: GradMark[];
  allreduces: AllReduceSpan[];
  /** Per-bucket summaries (steps the detail level aggregated; `grads` is empty then). */
  summaries: GradSummary[];
}

/** The hook timeline of one DDP iteration, every rank on the aligned clock. */
export interface Timeline {
  step: number;
  t0: number;
  t1: number;
  rows: TimelineRow[];
  /** Marks (phases, hooks, all-reduces) in this iteration, and how many are drawn. */
  total: number;
  shown: number;
  /** Steps with per-parameter hooks (GradReady) on some rank, for the note on summaries. */
  fullSteps: number[];
}

/** A lane whose arrays can be cut without touching the cached one. */
function cloneRow(row: TimelineRow): TimelineRow {
  return {
    rank: row.rank,
    phases: [...row.phases],
    grads: [...row.grads],
    allreduces: [...row.allreduces],
    summaries: [...row.summaries]
  };
}

/**
 * The events a rank's state is read from (its model, its verification, its state broadcast,
 * its bucket maps): TraceModel.setupEvents keeps them apart, in file order, so the panels
 * that read them do not scan the rank's hooks.
 */
export const SETUP_TYPES: ReadonlySet<EventType> = new Set<EventType>([
  'ParamsBuilt',
  'VerificationStarted',
  'VerificationPassed',
  'VerificationFailed',
  'BroadcastStarted',
  'BroadcastChunkDone',
  'BroadcastFinished',
  'BucketAssigned'
]);

interface RankIndex {
  byType: Map<EventType, DDPEvent[]>;
  setup: DDPEvent[];
}

/** Everything the viewer shows, computed once per file. */
export class TraceModel {
  /**
   * @param trace - a parsed trace.
   */
  constructor(readonly trace: ParsedTrace) {
    this.ranks = [...trace.byRank.keys()].sort((a, b) => a - b);
    this.params = this._params();
    this.bucketMaps = this._bucketMaps();
    this.verification = this.ranks.map(r => this._verification(r));
    this.broadcast = this.ranks
      .map(r => this._broadcast(r))
      .filter((row): row is BroadcastRow => row !== null);
    this.steps = this._steps();
    this.findings = this._findings();
    this.dropped = this._all('EventsDropped').reduce((n, e) => n + e.count, 0);
  }

  readonly ranks: number[];
  /** The parameters DDP reduces (from the lowest rank's ParamsBuilt), or [] if unknown. */
  readonly params: ParamInfo[];
  readonly bucketMaps: BucketMapGroup[];
  readonly verification: VerificationRow[];
  readonly broadcast: BroadcastRow[];
  /** DDP iterations with a backward (steps >= 0), ascending. */
  readonly steps: number[];
  /** Diagnosed problems, one per (kind, title, ranks). */
  readonly findings: Finding[];
  /** Events the transport dropped (EventsDropped), summed over ranks. */
  readonly dropped: number;

  /** Events of one rank (file order). */
  events(rank: number): DDPEvent[] {
    return this.trace.byRank.get(rank) ?? [];
  }

  /** How many events of each type one rank emitted (in the order of their first). */
  counts(rank: number): Map<EventType, number> {
    const out = new Map<EventType, number>();
    for (const [type, events] of this.index(rank).byType) {
      out.set(type, events.length);
    }
    return out;
  }

  /** One rank's events of one type, in file order. */
  ofType<T extends EventType>(rank: number, type: T): Extract<DDPEvent, { type: T }>[] {
    return (this.index(rank).byType.get(type) ?? []) as Extract<DDPEvent, { type: T }>[];
  }

  /**
   * One rank's model, verification, broadcast and bucket-map events (SETUP_TYPES), in file
   * order: the few events the panels that read a rank's state scan, without its hooks.
   */
  setupEvents(rank: number): DDPEvent[] {
    return this.index(rank).setup;
  }

  /** A rank's events by type and its setup events, made in one pass at the first use. */
  private index(rank: number): RankIndex {
    let index = this._index.get(rank);
    if (index === undefined) {
      const byType = new Map<EventType, DDPEvent[]>();
      const setup: DDPEvent[] = [];
      for (const e of this.events(rank)) {
        let list = byType.get(e.type);
        if (list === undefined) {
          list = [];
          byType.set(e.type, list);
        }
        list.push(e);
        if (SETUP_TYPES.has(e.type)) {
          setup.push(e);
        }
      }
      index = { byType, setup };
      this._index.set(rank, index);
    }
    return index;
  }

  private readonly _index = new Map<number, RankIndex>();

  /** `t_ns` on the reference clock: t_ns + the rank's offset (0 on one host). */
  aligned(e: DDPEvent): number {
    return e.t_ns + (this.trace.clock.get(e.rank)?.[0] ?? 0);
  }

  /**
   * The hook timeline of iteration `step`.
   *
   * @param step - a DDP iteration (see `steps`).
   * @param maxMarks - at most this many marks are drawn (hooks first in time order per rank).
   */
  timeline(step: number, maxMarks: number, only?: number[]): Timeline {
    const all = this.timelineRows(step);
    const rows = only === undefined ? all.rows : all.rows.filter(r => only.includes(r.rank));
    let { t0, t1 } = all;
    let total = 0;
    for (const row of rows) {
      total += row.phases.length + row.grads.length + row.allreduces.length;
    }
    let shown = total;
    if (total > maxMarks && rows.length > 0) {
      const per = Math.max(1, Math.floor(maxMarks / rows.length));
      shown = 0;
      for (const row of rows) {
        row.phases = row.phases.slice(0, per);
        row.allreduces = row.allreduces.slice(0, Math.max(0, per - row.phases.length));
        row.grads = row.grads.slice(
          0,
          Math.max(0, per - row.phases.length - row.allreduces.length)
        );
        shown += row.phases.length + row.grads.length + row.allreduces.length;
      }
    }
    if (!Number.isFinite(t0)) {
      t0 = t1 = 0;
    }
    const fullSteps = this.fullSteps();
    return { step, t0, t1: Math.max(t1, t0 + 1), rows, total, shown, fullSteps };
  }

  /**
   * Every rank's lane of iteration `step`, nothing left out, and the window they span
   * (aligned ns); computed once per step.
   *
   * @param step - a DDP iteration (see `steps`).
   */
  timelineRows(step: number): { rows: TimelineRow[]; t0: number; t1: number } {
    const cached = this._rowCache.get(step);
    if (cached !== undefined) {
      return { rows: cached.rows.map(cloneRow), t0: cached.t0, t1: cached.t1 };
    }
    const rows: TimelineRow[] = [];
    let t0 = Infinity;
    let t1 = -Infinity;
    for (const rank of this.ranks) {
      const events = this.events(rank).filter(e => e.step === step);
      if (events.length === 0) {
        continue;
      }
      rows.push(this._row(rank, events));
      const offset = this.trace.clock.get(rank)?.[0] ?? 0; // (aligned's, once a rank)
      for (const e of events) {
        const t = e.t_ns + offset;
        t0 = Math.min(t0, t);
        t1 = Math.max(t1, t);
      }
    }
    this._rowCache.set(step, { rows, t0, t1 });
    return { rows: rows.map(cloneRow), t0, t1 };
  }

  /** Steps with per-parameter gradient hooks on some rank (computed once). */
  fullSteps(): number[] {
    if (this._fullSteps === null) {
      const steps = new Set<number>();
      for (const e of this._all('GradReady')) {
        steps.add(e.step);
      }
      this._fullSteps = [...steps].sort((a, b) => a - b);
    }
    return this._fullSteps;
  }

  private _fullSteps: number[] | null = null;

  /** Who made each bucket's all-reduce wait, rank x bucket (computed once; see straggler.ts). */
  waits(): WaitFold {
    if (this._waits === null) {
      this._waits = whoWaited(
        this.ranks.map(rank => {
          const offset = this.trace.clock.get(rank)?.[0] ?? 0; // (aligned's, once a rank)
          const launched = this.ofType(rank, 'AllReduceLaunched');
          const ready: DDPEvent[] = launched.length ? launched : this.ofType(rank, 'BucketReady');
          return {
            rank,
            forwardSteps: this.ofType(rank, 'ForwardStarted').map(e => e.step),
            launches: ready.map(
              e =>
                [e.step, (e as { bucket: number }).bucket, e.t_ns + offset] as [
                  number,
                  number,
                  number
                ]
            ),
            ends: this.ofType(rank, 'BackwardFinished').map(
              e => [e.step, e.t_ns + offset] as [number, number]
            ),
            error: this.trace.clock.get(rank)?.[1] ?? 0
          };
        })
      );
    }
    return this._waits;
  }

  private _waits: WaitFold | null = null;

  private readonly _rowCache = new Map<number, { rows: TimelineRow[]; t0: number; t1: number }>();

  private _all<T extends EventType>(type: T): Extract<DDPEvent, { type: T }>[] {
    const out: Extract<DDPEvent, { type: T }>[] = [];
    for (const rank of this.ranks) {
      for (const e of this.ofType(rank, type)) {
        out.push(e);
      }
    }
    return out;
  }

  private _params(): ParamInfo[] {
    const built = this._all('ParamsBuilt');
    return built.length > 0 ? built[0].params : [];
  }

  private _bucketMaps(): BucketMapGroup[] {
    const groups = new Map<string, BucketMapGroup>();
    const sizes = new Map(this.params.map(p => [p.index, paramBytes(p)]));
    // the maps' text by their lists: a COPY frame's events share their source's lists, so
    // each distinct pair is written out once, not once per rank
    const texts = new Map<unknown, Map<unknown, string>>();
    for (const e of this._all('BucketAssigned') as BucketAssigned[]) {
      let byLimits = texts.get(e.buckets);
      if (byLimits === undefined) {
        byLimits = new Map();
        texts.set(e.buckets, byLimits);
      }
      let text = byLimits.get(e.limits);
      if (text === undefined) {
        text = JSON.stringify([e.buckets, e.limits]);
        byLimits.set(e.limits, text);
      }
      const key = `${e.rebuilt}:${text}`;
      const group = groups.get(key);
      if (group === undefined) {
        groups.set(key, {
          rebuilt: e.rebuilt,
          step: e.step,
          ranks: [e.rank],
          buckets: e.buckets,
          limits: e.limits,
          bytes: e.buckets.map(b => b.reduce((n, i) => n + (sizes.get(i) ?? 0), 0))
        });
      } else if (!group.ranks.includes(e.rank)) {
        group.ranks.push(e.rank);
      }
    }
    return [...groups.values()];
  }

  private _verification(rank: number): VerificationRow {
    const row: VerificationRow = {
      rank,
      status: 'absent',
      worldSize: 0,
      nParams: 0,
      nBuffers: 0,
      digest: '',
      mismatches: []
    };
    for (const e of this.setupEvents(rank)) {
      if (e.type === 'VerificationStarted') {
        Object.assign(row, {
          status: 'running',
          worldSize: e.world_size,
          nParams: e.n_params,
          nBuffers: e.n_buffers,
          digest: '',
          mismatches: []
        });
      } else if (e.type === 'VerificationPassed') {
        Object.assign(row, { status: 'passed', worldSize: e.world_size, digest: e.digest });
      } else if (e.type === 'VerificationFailed') {
        Object.assign(row, {
          status: 'failed',
          worldSize: e.world_size,
          mismatches: e.mismatches
        });
      }
    }
    return row;
  }

  private _broadcast(rank: number): BroadcastRow | null {
    let row: BroadcastRow | null = null;
    for (const e of this.setupEvents(rank)) {
      if (e.type === 'BroadcastStarted') {
        row = {
          rank,
          src: e.src,
          totalBytes: e.total_bytes,
          nChunks: e.n_chunks,
          chunksDone: 0,
          bytesDone: 0,
          seconds: null
        };
      } else if (row !== null && e.type === 'BroadcastChunkDone') {
        row.chunksDone++;
        row.bytesDone += e.nbytes;
      } else if (row !== null && e.type === 'BroadcastFinished') {
        row.seconds = e.seconds;
        row.bytesDone = Math.max(row.bytesDone, e.total_bytes);
        row.chunksDone = Math.max(row.chunksDone, row.nChunks);
      }
    }
    return row;
  }

  private _steps(): number[] {
    const steps = new Set<number>();
    for (const rank of this.ranks) {
      for (const type of ['GradReady', 'BackwardStarted'] as const) {
        for (const e of this.ofType(rank, type)) {
          if (e.step >= 0) {
            steps.add(e.step);
          }
        }
      }
    }
    return [...steps].sort((a, b) => a - b);
  }

  private _findings(): Finding[] {
    const seen = new Map<string, Finding>();
    for (const e of this._all('FindingReported')) {
      const f = e.finding;
      const key = JSON.stringify([f.kind, f.title, f.ranks ?? []]);
      if (!seen.has(key)) {
        seen.set(key, f);
      }
    }
    return [...seen.values()];
  }

  private _row(rank: number, events: DDPEvent[]): TimelineRow {
    const row: TimelineRow = { rank, phases: [], grads: [], allreduces: [], summaries: [] };
    const offset = this.trace.clock.get(rank)?.[0] ?? 0; // (aligned's, once a lane)
    const aligned = (e: DDPEvent) => e.t_ns + offset;
    const last = aligned(events[events.length - 1]);
    let forward: DDPEvent | null = null;
    let backward: DDPEvent | null = null;
    // the optimizer step after this step's backward (recorded on sampled steps only)
    let optimizer: DDPEvent | null = null;
    const open = new Map<number, AllReduceLaunched[]>();
    const phase = (name: string, start: DDPEvent, end: number, finished: boolean) =>
      row.phases.push({ name, start: aligned(start), end, finished });
    for (const e of events) {
      const t = aligned(e);
      switch (e.type) {
        case 'ForwardStarted':
          if (forward !== null) {
            phase('forward', forward, t, true);
          }
          forward = e;
          break;
        case 'BackwardStarted':
          if (forward !== null) {
            phase('forward', forward, t, true);
            forward = null;
          }
          backward = e;
          break;
        case 'BackwardFinished':
          if (backward !== null) {
            phase('backward', backward, t, true);
            backward = null;
          }
          break;
        case 'OptimizerStepStarted':
          optimizer = optimizer ?? e; // (a step nested in another: from the outer start)
          break;
        case 'OptimizerStepFinished':
          if (optimizer !== null) {
            phase('optimizer', optimizer, t, true);
            optimizer = null;
          }
          break;
        case 'GradReady':
          row.grads.push({ t, param: e.param, bucket: e.bucket });
          break;
        case 'GradsSummarized': {
          const shift = t - e.t_ns; // the rank's clock offset
          row.summaries.push({
            bucket: e.bucket,
            first: e.first_t_ns + shift,
            last: e.last_t_ns + shift,
            nGrads: e.n_grads,
            nbytes: e.nbytes
          });
          break;
        }
        case 'AllReduceLaunched': {
          const pending = open.get(e.bucket) ?? [];
          pending.push(e);
          open.set(e.bucket, pending);
          break;
        }
        case 'AllReduceDone': {
          const start = open.get((e as AllReduceDone).bucket)?.shift();
          if (start !== undefined) {
            row.allreduces.push({
              name: `all-reduce b${start.bucket}`,
              bucket: start.bucket,
              nbytes: start.nbytes,
              start: aligned(start),
              end: t,
              finished: true
            });
          }
          break;
        }
        default:
          break;
      }
    }
    if (forward !== null) {
      phase('forward', forward, last, false);
    }
    if (backward !== null) {
      phase('backward', backward, last, false);
    }
    if (optimizer !== null) {
      phase('optimizer', optimizer, last, false);
    }
    for (const pending of open.values()) {
      for (const start of pending) {
        row.allreduces.push({
          name: `all-reduce b${start.bucket}`,
          bucket: start.bucket,
          nbytes: start.nbytes,
          start: aligned(start),
          end: last,
          finished: false
        });
      }
    }
    row.allreduces.sort((a, b) => a.start - b.start);
    return row;
  }
}
