/**
 * The event vocabulary of ddpviz, mirrored from `ddpviz/events.py` (and the `Finding` struct of
 * `ddpviz/findings.py`). Events travel as msgpack maps tagged by class name in `type`; fields
 * keep Python's names and order. `tests/extension/test_event_schema.py` compares every
 * interface and the runtime table `EVENT_FIELDS` with `msgspec.json.schema` of the Python
 * structs, so a change on either side fails the tests until the other follows.
 */

import { fieldLimit, findingInLimits, LimitCheck, outOfLimits } from './limits';

/** `ddpviz.events.SCHEMA_VERSION`: traces with another event schema are refused. */
export const SCHEMA_VERSION = 1;

/** Fields every event carries. */
export interface EventBase {
  /** The event's class name in Python. */
  type: EventType;
  rank: number;
  /** DDP iteration; -1 while the constructor runs. */
  step: number;
  /** time.monotonic_ns() on the emitting rank. */
  t_ns: number;
  /** Per-rank sequence number, from 0, no gaps. */
  seq: number;
}

/** A parameter as DDP sees it (index = position in the reducer's parameter list). */
export interface ParamInfo {
  index: number;
  name: string;
  shape: number[];
  dtype: string;
  device: string;
  sparse_grad: boolean;
  /** Bytes per element; 0 or absent in traces written before it was recorded. */
  element_size?: number;
}

/** One field of one parameter (or buffer) that differs across ranks. */
export interface Mismatch {
  /** "param" | "buffer" | "count" | "device". */
  kind: string;
  index: number;
  name: string;
  field: string;
  /** (value, ranks holding it), most common first. */
  values: [string, number[]][];
}

/** A kind of finding (`ddpviz.findings.Kind`, sorted as in msgspec's schema; what each
 * means: `KINDS` there). */
export type FindingKind =
  | 'buffer_mismatch'
  | 'buffer_reassigned'
  | 'collective_mismatch'
  | 'events_dropped'
  | 'gpu_shared'
  | 'grad_order'
  | 'graph_changed'
  | 'hook_fired_twice'
  | 'initial_values'
  | 'missing_rank'
  | 'nonfinite_gradient'
  | 'nonfinite_parameter'
  | 'param_mismatch'
  | 'peer_failed'
  | 'plan_mismatch'
  | 'rank_exited'
  | 'rank_hang'
  | 'rank_waiting'
  | 'replicas_diverged'
  | 'straggler'
  | 'uneven_iterations'
  | 'unmatched_collective'
  | 'unsynced_gradients'
  | 'unused_parameter';

/** How bad a finding is (`ddpviz.findings.Severity`). */
export type Severity = 'error' | 'info' | 'warning';

/** One diagnosed problem (`ddpviz.findings.Finding`). */
export interface Finding {
  kind: FindingKind;
  severity: Severity;
  title: string;
  ranks?: number[];
  param?: number;
  name?: string;
  field?: string;
  bucket?: number;
  step?: number;
  values?: [string, number[]][];
  detail?: string[];
  fix?: string;
  world_size?: number;
  /** replicas_diverged: per tensor, [name, [[what a group of ranks holds, its ranks as
   * inclusive [lo, hi] spans], ...]] (the per-tensor detail lines as data). */
  tensors?: [string, [string, [number, number][]][]][];
}

/** Step 1: the parameters DDP reduces and the buffers it syncs. */
export interface ParamsBuilt extends EventBase {
  type: 'ParamsBuilt';
  params: ParamInfo[];
  buffers: string[];
  ignored: string[];
}

/** Step 2: cross-rank verification started. */
export interface VerificationStarted extends EventBase {
  type: 'VerificationStarted';
  world_size: number;
  n_params: number;
  n_buffers: number;
}

/** Step 2: every rank holds the same parameters and buffers. */
export interface VerificationPassed extends EventBase {
  type: 'VerificationPassed';
  world_size: number;
  digest: string;
}

/** Step 2: ranks differ; what differs. */
export interface VerificationFailed extends EventBase {
  type: 'VerificationFailed';
  world_size: number;
  mismatches: Mismatch[];
}

/** Step 3: rank `src` starts broadcasting its state. */
export interface BroadcastStarted extends EventBase {
  type: 'BroadcastStarted';
  src: number;
  n_tensors: number;
  total_bytes: number;
  n_chunks: number;
}

/** Step 3: a coalesced chunk's broadcast was launched (at most 2 in flight). */
export interface BroadcastChunkSent extends EventBase {
  type: 'BroadcastChunkSent';
  chunk: number;
  dtype: string;
  device: string;
  nbytes: number;
  n_tensors: number;
}

/** Step 3: a chunk's broadcast completed. */
export interface BroadcastChunkDone extends EventBase {
  type: 'BroadcastChunkDone';
  chunk: number;
  nbytes: number;
}

/** Step 3: the whole state arrived. */
export interface BroadcastFinished extends EventBase {
  type: 'BroadcastFinished';
  total_bytes: number;
  seconds: number;
}

/** Step 4: the bucket map in force from this step on (reduction order). */
export interface BucketAssigned extends EventBase {
  type: 'BucketAssigned';
  /** Parameter indices per bucket, bucket 0 reduced first. */
  buckets: number[][];
  /** Per-bucket size limit in bytes. */
  limits: number[];
  /** False for the constructor's map, true for the gradient-ready-order rebuild. */
  rebuilt: boolean;
}

/** Steps 5-6: a forward pass started. */
export interface ForwardStarted extends EventBase {
  type: 'ForwardStarted';
}

/** Buffers were broadcast from rank 0 before a forward. */
export interface BuffersSynced extends EventBase {
  type: 'BuffersSynced';
  n_buffers: number;
  nbytes: number;
}

/** A backward pass reached DDP. */
export interface BackwardStarted extends EventBase {
  type: 'BackwardStarted';
}

/** A parameter's gradient hook fired. */
export interface GradReady extends EventBase {
  type: 'GradReady';
  param: number;
  bucket: number;
}

/** All gradients of a bucket are ready. */
export interface BucketReady extends EventBase {
  type: 'BucketReady';
  bucket: number;
}

/**
 * A bucket's GradReady events of one step, aggregated at the source (steps recorded at a
 * detail level that skips per-parameter events); emitted just before its BucketReady.
 */
export interface GradsSummarized extends EventBase {
  type: 'GradsSummarized';
  bucket: number;
  n_grads: number;
  first_t_ns: number;
  last_t_ns: number;
  nbytes: number;
}

/** A bucket's all-reduce was launched. */
export interface AllReduceLaunched extends EventBase {
  type: 'AllReduceLaunched';
  bucket: number;
  nbytes: number;
  dtype: string;
}

/** A bucket's all-reduce completed. */
export interface AllReduceDone extends EventBase {
  type: 'AllReduceDone';
  bucket: number;
}

/** Every bucket of this backward was reduced. */
export interface BackwardFinished extends EventBase {
  type: 'BackwardFinished';
}

/**
 * This rank's autograd pass ended (every gradient computed, every bucket launched; before the
 * wait); `param`'s gradient was ready first, at `first_t_ns` (every synced step, hook-less);
 * `cpu_wait_ns`: the main thread's cumulative wait for a CPU (-1: unknown); `left_prev_ns`: when
 * the rank left the previous step's backward, its all-reduces waited for (-1: unknown).
 */
export interface BackwardComputed extends EventBase {
  type: 'BackwardComputed';
  param?: number;
  first_t_ns?: number;
  cpu_wait_ns?: number;
  left_prev_ns?: number;
}

/** Parameters that got no gradient in this backward. */
export interface UnusedParametersFound extends EventBase {
  type: 'UnusedParametersFound';
  params: number[];
  names: string[];
}

/** Buckets were rebuilt in this gradient-ready order. */
export interface BucketsRebuilt extends EventBase {
  type: 'BucketsRebuilt';
  grad_ready_order: number[];
}

/**
 * An optimizer holding the DDP's parameters starts its step() (after the backward of `step`;
 * recorded on sampled steps only).
 */
export interface OptimizerStepStarted extends EventBase {
  type: 'OptimizerStepStarted';
}

/** That optimizer's step() returned. */
export interface OptimizerStepFinished extends EventBase {
  type: 'OptimizerStepFinished';
}

/** The transport dropped this many events. */
export interface EventsDropped extends EventBase {
  type: 'EventsDropped';
  count: number;
}

/** A rank diagnosed a problem. */
export interface FindingReported extends EventBase {
  type: 'FindingReported';
  finding: Finding;
}

/** The debugger: ddpviz.events.DebugArmed (see ddpviz/debugger/protocol.py). */
export interface DebugArmed extends EventBase {
  type: 'DebugArmed';
  request: number;
  bucket_points: boolean;
  ddp: string;
}

/** The debugger: ddpviz.events.Parked (see ddpviz/debugger/protocol.py). */
export interface Parked extends EventBase {
  type: 'Parked';
  point: string;
  bucket: number;
  reason: string;
  request: number;
}

/** The debugger: ddpviz.events.Unparked (see ddpviz/debugger/protocol.py). */
export interface Unparked extends EventBase {
  type: 'Unparked';
  how: string;
  request: number;
}

/** The debugger: ddpviz.events.Inspected (see ddpviz/debugger/protocol.py). */
export interface Inspected extends EventBase {
  type: 'Inspected';
  request: number;
  name: string;
  what: string;
  error?: string;
  shape?: number[];
  dtype?: string;
  device?: string;
  numel?: number;
  norm?: number;
  max_abs?: number;
  n_nan?: number;
  n_posinf?: number;
  n_neginf?: number;
  nonfinite_at?: number[][];
  finiteness?: number[];
  digest?: string;
  chunk_elements?: number;
  chunk_digests?: string[];
  head?: number[];
}

/** The debugger: ddpviz.events.Fetched (see ddpviz/debugger/protocol.py). */
export interface Fetched extends EventBase {
  type: 'Fetched';
  request: number;
  name: string;
  what: string;
  error?: string;
  dtype?: string;
  shape?: number[];
  offset?: number;
  part?: number;
  parts?: number;
  data?: string;
}

/** The debugger: ddpviz.events.CodeRan (see ddpviz/debugger/protocol.py). */
export interface CodeRan extends EventBase {
  type: 'CodeRan';
  request: number;
  stdout: string;
  result_repr: string;
  error: string;
}

/** The debugger: ddpviz.events.StacksTaken (see ddpviz/debugger/protocol.py). */
export interface StacksTaken extends EventBase {
  type: 'StacksTaken';
  request: number;
  threads: string[];
  stacks: string[];
}

/** The debugger: ddpviz.events.DebugRefused (see ddpviz/debugger/protocol.py). */
export interface DebugRefused extends EventBase {
  type: 'DebugRefused';
  request: number;
  reason: string;
}

/** Any event, discriminated by `type`. */
export type DDPEvent =
  | ParamsBuilt
  | VerificationStarted
  | VerificationPassed
  | VerificationFailed
  | BroadcastStarted
  | BroadcastChunkSent
  | BroadcastChunkDone
  | BroadcastFinished
  | BucketAssigned
  | ForwardStarted
  | BuffersSynced
  | BackwardStarted
  | GradReady
  | BucketReady
  | GradsSummarized
  | AllReduceLaunched
  | AllReduceDone
  | BackwardFinished
  | BackwardComputed
  | UnusedParametersFound
  | BucketsRebuilt
  | OptimizerStepStarted
  | OptimizerStepFinished
  | EventsDropped
  | FindingReported
  | DebugArmed
  | Parked
  | Unparked
  | Inspected
  | Fetched
  | CodeRan
  | StacksTaken
  | DebugRefused;

/** How a field is checked when a trace is decoded. */
export type FieldKind = 'int' | 'float' | 'str' | 'bool' | 'array' | 'struct';

/** The fields every event carries, checked on every decoded event. */
export const BASE_FIELDS: Readonly<Record<string, FieldKind>> = {
  rank: 'int',
  step: 'int',
  t_ns: 'int',
  seq: 'int'
};

/**
 * Each event's own fields in declared order, with their kinds: what decoding validates
 * (an event that does not match is counted as rejected, never shown).
 */
export const EVENT_FIELDS = {
  ParamsBuilt: { params: 'array', buffers: 'array', ignored: 'array' },
  VerificationStarted: { world_size: 'int', n_params: 'int', n_buffers: 'int' },
  VerificationPassed: { world_size: 'int', digest: 'str' },
  VerificationFailed: { world_size: 'int', mismatches: 'array' },
  BroadcastStarted: { src: 'int', n_tensors: 'int', total_bytes: 'int', n_chunks: 'int' },
  BroadcastChunkSent: {
    chunk: 'int',
    dtype: 'str',
    device: 'str',
    nbytes: 'int',
    n_tensors: 'int'
  },
  BroadcastChunkDone: { chunk: 'int', nbytes: 'int' },
  BroadcastFinished: { total_bytes: 'int', seconds: 'float' },
  BucketAssigned: { buckets: 'array', limits: 'array', rebuilt: 'bool' },
  ForwardStarted: {},
  BuffersSynced: { n_buffers: 'int', nbytes: 'int' },
  BackwardStarted: {},
  GradReady: { param: 'int', bucket: 'int' },
  BucketReady: { bucket: 'int' },
  GradsSummarized: {
    bucket: 'int',
    n_grads: 'int',
    first_t_ns: 'int',
    last_t_ns: 'int',
    nbytes: 'int'
  },
  AllReduceLaunched: { bucket: 'int', nbytes: 'int', dtype: 'str' },
  AllReduceDone: { bucket: 'int' },
  BackwardFinished: {},
  BackwardComputed: {
    param: 'int',
    first_t_ns: 'int',
    cpu_wait_ns: 'int',
    left_prev_ns: 'int'
  },
  UnusedParametersFound: { params: 'array', names: 'array' },
  BucketsRebuilt: { grad_ready_order: 'array' },
  OptimizerStepStarted: {},
  OptimizerStepFinished: {},
  EventsDropped: { count: 'int' },
  FindingReported: { finding: 'struct' },
  DebugArmed: { request: 'int', bucket_points: 'bool', ddp: 'str' },
  Parked: { point: 'str', bucket: 'int', reason: 'str', request: 'int' },
  Unparked: { how: 'str', request: 'int' },
  Inspected: {
    request: 'int',
    name: 'str',
    what: 'str',
    error: 'str',
    shape: 'array',
    dtype: 'str',
    device: 'str',
    numel: 'int',
    norm: 'float',
    max_abs: 'float',
    n_nan: 'int',
    n_posinf: 'int',
    n_neginf: 'int',
    nonfinite_at: 'array',
    finiteness: 'array',
    digest: 'str',
    chunk_elements: 'int',
    chunk_digests: 'array',
    head: 'array'
  },
  Fetched: {
    request: 'int',
    name: 'str',
    what: 'str',
    error: 'str',
    dtype: 'str',
    shape: 'array',
    offset: 'int',
    part: 'int',
    parts: 'int',
    data: 'str'
  },
  CodeRan: { request: 'int', stdout: 'str', result_repr: 'str', error: 'str' },
  StacksTaken: { request: 'int', threads: 'array', stacks: 'array' },
  DebugRefused: { request: 'int', reason: 'str' }
} as const satisfies Record<string, Readonly<Record<string, FieldKind>>>;

/** The name of an event class. */
export type EventType = keyof typeof EVENT_FIELDS;

/** Every event type, in `ddpviz.events.ANY_EVENT` order. */
export const EVENT_TYPES = Object.keys(EVENT_FIELDS) as EventType[];

/** True when `value` holds a value of `kind` (ints must be integral). */
export function hasKind(value: unknown, kind: FieldKind): boolean {
  switch (kind) {
    case 'int':
      return typeof value === 'number' && Number.isInteger(value);
    case 'float':
      return typeof value === 'number';
    case 'str':
      return typeof value === 'string';
    case 'bool':
      return typeof value === 'boolean';
    case 'array':
      return Array.isArray(value);
    case 'struct':
      return typeof value === 'object' && value !== null && !Array.isArray(value);
  }
}

/** One field of an event type as `asEvent` checks it: its kind, then its bound if any. */
const fieldCheck = (kind: FieldKind, limit: LimitCheck | null): LimitCheck => {
  if (limit === null) {
    return v => hasKind(v, kind);
  }
  return v => hasKind(v, kind) && limit(v);
};

/** An event type's checks, made once: the fields' (base first), and how many keys it has. */
interface TypeCheck {
  names: string[];
  checks: LimitCheck[];
  /** Own keys of an event with these fields and no other: `type` and the fields. */
  keys: number;
  finding: boolean;
}

const TYPE_CHECKS: ReadonlyMap<string, TypeCheck> = new Map(
  EVENT_TYPES.map(type => {
    const fields: [string, FieldKind][] = [
      ...Object.entries(BASE_FIELDS),
      ...Object.entries(EVENT_FIELDS[type] as Readonly<Record<string, FieldKind>>)
    ];
    return [
      type,
      {
        names: fields.map(([name]) => name),
        checks: fields.map(([name, kind]) => fieldCheck(kind, fieldLimit(name))),
        keys: new Set(['type', ...fields.map(([name]) => name)]).size,
        finding: type === 'FindingReported'
      }
    ];
  })
);

/** The number of own enumerable keys of `record`, without allocating. */
function keyCount(record: Record<string, unknown>): number {
  let n = 0;
  for (const key in record) {
    if (Object.prototype.hasOwnProperty.call(record, key)) {
      n++;
    }
  }
  return n;
}

/**
 * True when `record` is an event of its `type` that `checkedEvent` accepts, decided by its
 * type's checks made once. False leaves the verdict (and the reason) to `checkedEvent`: an
 * event with a key its type does not declare takes that path, as does every rejected one.
 */
function fastAccepts(record: Record<string, unknown>): boolean {
  const type = record.type;
  const compiled = typeof type === 'string' ? TYPE_CHECKS.get(type) : undefined;
  if (compiled === undefined) {
    return false;
  }
  const { names, checks } = compiled;
  for (let i = 0; i < names.length; i++) {
    if (!checks[i](record[names[i]])) {
      return false;
    }
  }
  if (compiled.finding && !findingInLimits(record.finding)) {
    return false;
  }
  // with exactly its fields as own keys (each present: it passed its kind) and a plain
  // object's prototype, no other bounded field is `in` it
  return keyCount(record) === compiled.keys && Object.getPrototypeOf(record) === Object.prototype;
}

/**
 * The event in `value`, or a one-line reason why it is not one: an unknown `type`, a missing
 * field or a field of the wrong kind.
 */
export function asEvent(value: unknown): DDPEvent | string {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return 'not a map';
  }
  if (fastAccepts(value as Record<string, unknown>)) {
    return value as DDPEvent;
  }
  return checkedEvent(value as Record<string, unknown>);
}

/** `asEvent` field by field, in declared order: the first problem found is the reason. */
function checkedEvent(record: Record<string, unknown>): DDPEvent | string {
  const type = record.type;
  if (typeof type !== 'string' || !Object.prototype.hasOwnProperty.call(EVENT_FIELDS, type)) {
    return `unknown event type ${JSON.stringify(type)}`;
  }
  const own: Readonly<Record<string, FieldKind>> = EVENT_FIELDS[type as EventType];
  for (const fields of [BASE_FIELDS, own]) {
    for (const [name, kind] of Object.entries(fields)) {
      if (!hasKind(record[name], kind)) {
        return `${type}.${name} is not ${kind === 'int' ? 'an' : 'a'} ${kind}`;
      }
    }
  }
  const bad = outOfLimits(type, record);
  if (bad !== null) {
    return `${bad} is out of ddpviz's limits or malformed`;
  }
  return record as unknown as DDPEvent;
}
