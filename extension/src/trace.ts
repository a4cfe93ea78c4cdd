/**
 * Reading `.ddpviz` trace files in the browser, as `ddpviz/traces/fileformat.py` writes them: the 8-byte
 * magic, then frames `kind (u8) | length (u32 LE) | crc32 (u32 LE) | msgpack payload`. The
 * first frame is the header; then event chunks and clock records. Like `Trace.load`, a torn
 * last frame is skipped (the writer died mid-write) and marks the trace truncated; a bad
 * checksum elsewhere, a wrong magic or another format or schema version is an error.
 */

import { decode } from '@msgpack/msgpack';

import { readColumns } from './columnsFrame';
import { asEvent, DDPEvent, SCHEMA_VERSION } from './events';
import { MAX_STEP, MAX_WORLD_SIZE } from './limits';

/** `ddpviz.traces.fileformat.FORMAT_VERSION`, the newest (formats 1 and 2 are read too). */
export const FORMAT_VERSION = 3;

/** `ddpviz.traces.fileformat.MAGIC`: "DDPVIZ\0\x1a". */
export const MAGIC = [0x44, 0x44, 0x50, 0x56, 0x49, 0x5a, 0x00, 0x1a];

/** Frame kinds (`ddpviz.traces.fileformat.HEADER`, `EVENTS`, `CLOCK`, `COPY`, `COLUMNS`). */
export const FRAME_KINDS = { header: 1, events: 2, clock: 3, copy: 5, columns: 6 } as const;

/**
 * The event types a COPY frame may repeat (`ddpviz.traces.copies.COPY_SOURCES`): the ones
 * with list fields, never a hot type.
 */
export const COPY_SOURCES: ReadonlySet<string> = new Set([
  'BucketAssigned',
  'BucketsRebuilt',
  'ParamsBuilt',
  'UnusedParametersFound',
  'VerificationFailed'
]);

/** Copies in one COPY frame at most (`ddpviz.traces.copies.MAX_COPIES`). */
export const MAX_COPIES = 131072;

/** List entries the copies of one trace may repeat in all (`copies.MAX_COPIED`). */
export const MAX_COPIED = 1073741824;

/** Per trace: the events a COPY frame may repeat, by "rank:seq", with their list entries. */
interface CopySources {
  events: Map<string, [DDPEvent, number]>;
  copied: number;
}
const copySources = new WeakMap<ParsedTrace, CopySources>();

const FRAME_HEADER_BYTES = 9;

/** A file that is not a loadable ddpviz trace; the message follows ddpviz's error style. */
export class TraceError extends Error {}

/** The events of a run, per rank, in the order each rank emitted them. */
export interface ParsedTrace {
  /** Plain data the writer stored in the header. */
  meta: Record<string, unknown>;
  format: number;
  schema: number;
  /** Events per rank, in file order (each rank's emission order). */
  byRank: Map<number, DDPEvent[]>;
  /** Per rank: [offset_ns onto the reference clock, error bound (-1 unknown)]. */
  clock: Map<number, [number, number]>;
  /** The file ended in a torn frame; everything before it was read. */
  truncated: boolean;
  /** Events that did not match the vocabulary, with the first few reasons. */
  rejected: number;
  rejectReasons: string[];
  /** Total events kept. */
  count: number;
}

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) {
      c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    }
    table[n] = c >>> 0;
  }
  return table;
})();

/**
 * Thrown by `quickDecode` where it leaves a payload to @msgpack/msgpack's `decode` (one
 * instance, never seen outside this module).
 */
class LeaveToDecode extends Error {}
const LEAVE = new LeaveToDecode('left to @msgpack/msgpack');

/** Bytes and position of the payload `quickDecode` is reading. */
interface Cursor {
  bytes: Uint8Array;
  view: DataView;
  pos: number;
}

/** Nesting `quickDecode` follows at most (deeper: left to `decode`). */
const QUICK_DEPTH = 64;

/** Short ASCII strings read before, by length then content (map keys, event types, dtypes). */
const ASCII_CACHE: Map<number, string>[] = Array.from({ length: 17 }, () => new Map());
const ASCII_DECODER = new TextDecoder();

/**
 * What `decode(payload, { useBigInt64: false })` returns, for the payloads a ddpviz writer
 * makes: maps with ASCII string keys, arrays, ASCII strings, numbers, booleans and nil. Anything
 * else (a non-ASCII string, bin, ext, a non-string or `__proto__` key, a length past the end,
 * trailing bytes, deep nesting) throws LEAVE, and the caller decodes the payload with
 * `decode` instead: the same values, the same errors. Linear in the payload; every length is
 * bounded by the bytes left before it sizes anything.
 */
function quickDecode(payload: Uint8Array): unknown {
  const at: Cursor = {
    bytes: payload,
    view: new DataView(payload.buffer, payload.byteOffset, payload.byteLength),
    pos: 0
  };
  const value = quickValue(at, 0);
  if (at.pos !== payload.length) {
    throw LEAVE;
  }
  return value;
}

function quickValue(at: Cursor, depth: number): unknown {
  const { bytes, view } = at;
  if (at.pos >= bytes.length) {
    throw LEAVE;
  }
  const head = bytes[at.pos++];
  if (head < 0x80) {
    return head;
  }
  if (head >= 0xe0) {
    return head - 0x100;
  }
  if (head < 0x90) {
    return quickMap(at, head - 0x80, depth);
  }
  if (head < 0xa0) {
    return quickArray(at, head - 0x90, depth);
  }
  if (head < 0xc0) {
    return quickString(at, head - 0xa0);
  }
  const need = QUICK_WIDTH[head - 0xc0];
  if (need < 0 || at.pos + need > bytes.length) {
    throw LEAVE;
  }
  const pos = at.pos;
  at.pos += need;
  switch (head) {
    case 0xc0:
      return null;
    case 0xc2:
      return false;
    case 0xc3:
      return true;
    case 0xca:
      return view.getFloat32(pos);
    case 0xcb:
      return view.getFloat64(pos);
    case 0xcc:
      return view.getUint8(pos);
    case 0xcd:
      return view.getUint16(pos);
    case 0xce:
      return view.getUint32(pos);
    case 0xcf:
      return view.getUint32(pos) * 4294967296 + view.getUint32(pos + 4);
    case 0xd0:
      return view.getInt8(pos);
    case 0xd1:
      return view.getInt16(pos);
    case 0xd2:
      return view.getInt32(pos);
    case 0xd3:
      return view.getInt32(pos) * 4294967296 + view.getUint32(pos + 4);
    case 0xd9:
      return quickString(at, view.getUint8(pos));
    case 0xda:
      return quickString(at, view.getUint16(pos));
    case 0xdb:
      return quickString(at, view.getUint32(pos));
    case 0xdc:
      return quickArray(at, view.getUint16(pos), depth);
    case 0xdd:
      return quickArray(at, view.getUint32(pos), depth);
    case 0xde:
      return quickMap(at, view.getUint16(pos), depth);
    case 0xdf:
      return quickMap(at, view.getUint32(pos), depth);
  }
  throw LEAVE;
}

/** Bytes after the head byte 0xc0 + i that `quickValue` reads; -1: left to `decode`. */
const QUICK_WIDTH = (() => {
  const width = new Int8Array(32).fill(-1);
  const known: [number, number][] = [
    [0xc0, 0],
    [0xc2, 0],
    [0xc3, 0],
    [0xca, 4],
    [0xcb, 8],
    [0xcc, 1],
    [0xcd, 2],
    [0xce, 4],
    [0xcf, 8],
    [0xd0, 1],
    [0xd1, 2],
    [0xd2, 4],
    [0xd3, 8],
    [0xd9, 1],
    [0xda, 2],
    [0xdb, 4],
    [0xdc, 2],
    [0xdd, 4],
    [0xde, 2],
    [0xdf, 4]
  ];
  for (const [head, n] of known) {
    width[head - 0xc0] = n;
  }
  return width;
})();

function quickArray(at: Cursor, size: number, depth: number): unknown[] {
  // every item takes a byte at least: a size past the end is left to decode (and its error)
  if (size > at.bytes.length - at.pos || depth >= QUICK_DEPTH) {
    throw LEAVE;
  }
  const out: unknown[] = [];
  for (let i = 0; i < size; i++) {
    out.push(quickValue(at, depth + 1));
  }
  return out;
}

function quickMap(at: Cursor, size: number, depth: number): Record<string, unknown> {
  if (2 * size > at.bytes.length - at.pos || depth >= QUICK_DEPTH) {
    throw LEAVE;
  }
  const out: Record<string, unknown> = {};
  for (let i = 0; i < size; i++) {
    const key = quickValue(at, depth + 1);
    if (typeof key !== 'string' || key === '__proto__') {
      throw LEAVE;
    }
    out[key] = quickValue(at, depth + 1);
  }
  return out;
}

/** An ASCII string of `length` bytes at the cursor (else LEAVE: decode reads UTF-8 its way). */
function quickString(at: Cursor, length: number): string {
  const { bytes } = at;
  const start = at.pos;
  const end = start + length;
  if (end > bytes.length) {
    throw LEAVE;
  }
  at.pos = end;
  if (length < ASCII_CACHE.length) {
    let code = 0;
    let hash = length;
    for (let i = start; i < end; i++) {
      const b = bytes[i];
      code |= b;
      hash = (Math.imul(hash, 31) + b) | 0;
    }
    if (code >= 0x80) {
      throw LEAVE;
    }
    const cache = ASCII_CACHE[length];
    const known = cache.get(hash);
    if (known !== undefined && sameAscii(known, bytes, start)) {
      return known;
    }
    const text = String.fromCharCode(...bytes.subarray(start, end));
    if (cache.size < 4096) {
      cache.set(hash, text);
    }
    return text;
  }
  for (let i = start; i < end; i++) {
    if (bytes[i] >= 0x80) {
      throw LEAVE;
    }
  }
  return ASCII_DECODER.decode(bytes.subarray(start, end));
}

function sameAscii(text: string, bytes: Uint8Array, start: number): boolean {
  for (let i = 0; i < text.length; i++) {
    if (text.charCodeAt(i) !== bytes[start + i]) {
      return false;
    }
  }
  return true;
}

/**
 * A frame's payload decoded: the value (or the error) of @msgpack/msgpack's
 * `decode(payload, { useBigInt64: false })`, read by `quickDecode` where it can (a writer's
 * payloads, in about half `decode`'s time), by `decode` otherwise.
 *
 * @param payload - a frame's msgpack bytes.
 */
export function decodePayload(payload: Uint8Array): unknown {
  try {
    return quickDecode(payload);
  } catch (err) {
    if (err !== LEAVE) {
      throw err;
    }
  }
  return decode(payload, { useBigInt64: false });
}

/** The bytes of a widget's Bytes trait or message buffer, in whichever form the host hands them. */
export function traceBytes(value: DataView | ArrayBuffer | Uint8Array | null): Uint8Array {
  if (value === null || value === undefined) {
    return new Uint8Array(0);
  }
  if (value instanceof Uint8Array) {
    return value;
  }
  if (value instanceof ArrayBuffer) {
    return new Uint8Array(value);
  }
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}

// CRC_TABLE advanced by 0-7 more zero bytes, 256 entries each: crc32 reads 8 bytes a step
// ("slicing-by-8")
const CRC_TABLES = (() => {
  const tables = new Uint32Array(8 * 256);
  tables.set(CRC_TABLE);
  for (let k = 1; k < 8; k++) {
    for (let n = 0; n < 256; n++) {
      const c = tables[(k - 1) * 256 + n];
      tables[k * 256 + n] = (c >>> 8) ^ CRC_TABLE[c & 0xff];
    }
  }
  return tables;
})();

/** zlib's crc32 (what Python's `zlib.crc32` computes). */
export function crc32(bytes: Uint8Array): number {
  const t = CRC_TABLES;
  const n = bytes.length;
  let crc = 0xffffffff;
  let i = 0;
  for (; i + 8 <= n; i += 8) {
    const low =
      crc ^ (bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24));
    crc =
      t[1792 + (low & 0xff)] ^
      t[1536 + ((low >>> 8) & 0xff)] ^
      t[1280 + ((low >>> 16) & 0xff)] ^
      t[1024 + (low >>> 24)] ^
      t[768 + bytes[i + 4]] ^
      t[512 + bytes[i + 5]] ^
      t[256 + bytes[i + 6]] ^
      t[bytes[i + 7]];
  }
  for (; i < n; i++) {
    crc = CRC_TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

type Scheduler = { yield?: () => Promise<void> };

/**
 * Give the page the event loop back (input, rendering), then go on: `scheduler.yield()` where
 * the browser has it, else a message to a MessageChannel, else a timer. (A timer set from
 * within a timer, five deep, waits at least 4 ms: a parse yielding every 30 ms idled up to
 * 4 ms at each of its yields.)
 */
export function yieldToPage(): Promise<void> {
  const scheduler = (globalThis as { scheduler?: Scheduler }).scheduler;
  if (typeof scheduler?.yield === 'function') {
    return scheduler.yield();
  }
  if (typeof MessageChannel === 'function') {
    return new Promise(resolve => {
      const channel = new MessageChannel();
      channel.port1.onmessage = () => {
        channel.port1.close();
        resolve();
      };
      channel.port2.postMessage(null);
    });
  }
  return new Promise(resolve => setTimeout(resolve, 0));
}

/**
 * `base64ToBytes` in slices of a million characters, giving the page the event loop back at
 * least every `sliceMs` (a 20 MB trace is 27 MB of base64).
 */
export async function base64ToBytesAsync(text: string, sliceMs = 30): Promise<Uint8Array> {
  const step = 1 << 20;
  const parts: Uint8Array[] = [];
  let carry = '';
  let start = performance.now();
  for (let i = 0; i < text.length; i += step) {
    const clean = carry + text.slice(i, i + step).replace(/\s+/g, '');
    const whole = clean.length - (clean.length % 4); // 4 characters are 3 bytes
    parts.push(base64ToBytes(clean.slice(0, whole)));
    carry = clean.slice(whole);
    if (performance.now() - start > sliceMs) {
      await yieldToPage();
      start = performance.now();
    }
  }
  if (carry.length > 0) {
    parts.push(base64ToBytes(carry));
  }
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The bytes of a base64 string (the Jupyter contents API's `format: "base64"`). */
export function base64ToBytes(text: string): Uint8Array {
  const binary = atob(text.replace(/\s+/g, ''));
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    out[i] = binary.charCodeAt(i);
  }
  return out;
}

/**
 * Parse a `.ddpviz` file.
 *
 * @param data - the whole file.
 * @param name - the file's name, for messages.
 * @returns the trace; raises TraceError when the file cannot be read.
 */
export function parseTrace(data: Uint8Array, name: string): ParsedTrace {
  const frames = readFrames(data, name);
  let step = frames.next();
  while (!step.done) {
    step = frames.next();
  }
  return step.value;
}

/**
 * Parse a `.ddpviz` file in slices: the page gets the event loop back at least every
 * `sliceMs` (between frames of at most 4,096 events), so a large trace does not freeze it.
 *
 * @param data - the whole file.
 * @param name - the file's name, for messages.
 * @param sliceMs - the longest stretch of parsing between two yields (about).
 * @returns the trace; rejects with TraceError when the file cannot be read.
 */
export async function parseTraceAsync(
  data: Uint8Array,
  name: string,
  sliceMs = 30
): Promise<ParsedTrace> {
  const frames = readFrames(data, name);
  let start = performance.now();
  let step = frames.next();
  while (!step.done) {
    if (performance.now() - start > sliceMs) {
      await yieldToPage();
      start = performance.now();
    }
    step = frames.next();
  }
  return step.value;
}

/** The parser itself: yields after every frame, returns the trace. */
function* readFrames(data: Uint8Array, name: string): Generator<void, ParsedTrace, void> {
  if (data.length < MAGIC.length || MAGIC.some((b, i) => data[i] !== b)) {
    throw new TraceError(
      `ddpviz: '${name}' is not a ddpviz trace (no DDPVIZ magic at its start).\n` +
        'Open a file written by Trace.save, TraceWriter or ddpviz.connect().'
    );
  }
  const trace: ParsedTrace = {
    meta: {},
    format: 0,
    schema: 0,
    byRank: new Map(),
    clock: new Map(),
    truncated: false,
    rejected: 0,
    rejectReasons: [],
    count: 0
  };
  const sawHeader = yield* readFramesInto(trace, data, MAGIC.length, false, name);
  if (!sawHeader) {
    throw new TraceError(
      `ddpviz: '${name}' has no header frame (empty trace file).\n` +
        'The writer died before writing anything; rerun the job.'
    );
  }
  return trace;
}

/**
 * Append frames that continue a parsed trace (event chunks and clock records with no magic
 * nor header: what a live TraceView sends, ddpviz/widgets/trace_feed.py) to it, in place.
 * Unlike a file's, a torn frame here is an error: a message arrives whole.
 *
 * @param trace - the trace the frames continue.
 * @param data - the frames.
 * @param name - the trace's name, for messages.
 */
export function appendFrames(trace: ParsedTrace, data: Uint8Array, name: string): void {
  const frames = readFramesInto(trace, data, 0, true, name);
  let step = frames.next();
  while (!step.done) {
    step = frames.next();
  }
  if (trace.truncated) {
    throw new TraceError(`ddpviz: '${name}': an update from the kernel ends in a torn frame.`);
  }
}

/** Read frames from `pos` into `trace`; the first is its header unless `sawHeader`. */
function* readFramesInto(
  trace: ParsedTrace,
  data: Uint8Array,
  pos: number,
  sawHeader: boolean,
  name: string
): Generator<void, boolean, void> {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  while (pos < data.length) {
    const where = pos;
    if (data.length - pos < FRAME_HEADER_BYTES) {
      trace.truncated = true;
      break;
    }
    const kind = view.getUint8(pos);
    const length = view.getUint32(pos + 1, true);
    const crc = view.getUint32(pos + 5, true);
    pos += FRAME_HEADER_BYTES;
    const payload = data.subarray(pos, pos + length);
    pos += length;
    if (payload.length < length || crc32(payload) !== crc) {
      if (pos >= data.length) {
        trace.truncated = true;
        break;
      }
      throw new TraceError(
        `ddpviz: '${name}' is corrupt: frame at byte ${where} fails its checksum.\n` +
          'The file was modified after writing; restore it from the original run.'
      );
    }
    if (sawHeader && kind === FRAME_KINDS.columns) {
      readColumns(trace, payload, where); // not msgpack past its head: columnsFrame.ts
      yield;
      continue;
    }
    let value: unknown;
    try {
      value = decodePayload(payload);
    } catch (err) {
      throw new TraceError(
        `ddpviz: '${name}': frame at byte ${where} does not decode: ${err}.\n` +
          'The file is damaged or was written by an incompatible ddpviz.'
      );
    }
    if (!sawHeader) {
      readHeader(trace, kind, value, name);
      sawHeader = true;
    } else if (kind === FRAME_KINDS.events) {
      readEvents(trace, value);
    } else if (kind === FRAME_KINDS.copy) {
      readCopies(trace, value);
    } else if (kind === FRAME_KINDS.clock) {
      if (Array.isArray(value) && value.length === 3 && value.every(Number.isFinite)) {
        const [rank, offset, error] = value as number[];
        trace.clock.set(rank, [offset, error]);
      }
    }
    // other kinds: records of a later minor format, skipped as trace.py does
    yield;
  }
  return sawHeader;
}

function readHeader(trace: ParsedTrace, kind: number, value: unknown, name: string): void {
  const header = value as { format?: unknown; schema?: unknown; meta?: unknown } | null;
  if (kind !== FRAME_KINDS.header || typeof header !== 'object' || header === null) {
    throw new TraceError(
      `ddpviz: '${name}': the first frame is not a header.\n` +
        'The file is damaged; restore it from the original run.'
    );
  }
  if (header.format !== 1 && header.format !== 2 && header.format !== FORMAT_VERSION) {
    throw new TraceError(
      `ddpviz: '${name}' is trace format ${header.format}; this viewer reads formats 1, 2 ` +
        `and ${FORMAT_VERSION}.\nUse the ddpviz version that wrote it.`
    );
  }
  if (header.schema !== SCHEMA_VERSION) {
    throw new TraceError(
      `ddpviz: '${name}' holds event schema ${header.schema}; this viewer reads schema ` +
        `${SCHEMA_VERSION}.\nUpdate ddpviz (pip install -U ddpviz) and reload the page.`
    );
  }
  trace.format = header.format;
  trace.schema = header.schema;
  if (typeof header.meta === 'object' && header.meta !== null) {
    trace.meta = header.meta as Record<string, unknown>;
  }
}

function readEvents(trace: ParsedTrace, value: unknown): void {
  if (!Array.isArray(value)) {
    reject(trace, 'an event frame that is not a list');
    return;
  }
  for (const item of value) {
    const event = asEvent(item);
    if (typeof event === 'string') {
      reject(trace, event);
      continue;
    }
    keep(trace, event);
  }
}

function keep(trace: ParsedTrace, event: DDPEvent, entries = -1): void {
  let events = trace.byRank.get(event.rank);
  if (events === undefined) {
    events = [];
    trace.byRank.set(event.rank, events);
  }
  events.push(event);
  trace.count++;
  if (COPY_SOURCES.has(event.type)) {
    sourcesOf(trace).events.set(`${event.rank}:${event.seq}`, [
      event,
      entries >= 0 ? entries : entriesOf(event)
    ]);
  }
}

function sourcesOf(trace: ParsedTrace): CopySources {
  let sources = copySources.get(trace);
  if (sources === undefined) {
    sources = { events: new Map(), copied: 0 };
    copySources.set(trace, sources);
  }
  return sources;
}

/** The entries of an event's list fields, one level of nesting counted (`copies.entries`). */
function entriesOf(event: DDPEvent): number {
  let n = 1;
  for (const value of Object.values(event)) {
    if (Array.isArray(value)) {
      n += value.length;
      for (const v of value) {
        if (Array.isArray(v)) {
          n += v.length;
        }
      }
    }
  }
  return n;
}

const isInt = (v: unknown, lo: number, hi: number): boolean =>
  typeof v === 'number' && Number.isInteger(v) && v >= lo && v <= hi;

/**
 * A COPY frame (See [Note: the COPY frame] in ddpviz/traces/fileformat.py): each entry
 * `[src_rank, src_seq, rank, step, t_ns, seq]` appends to `rank`'s events the event read
 * before as (src_rank, src_seq) with these four fields, its lists shared. An entry that is
 * malformed, out of limits or names no such event is rejected (counted), as a bad event is.
 */
function readCopies(trace: ParsedTrace, value: unknown): void {
  if (!Array.isArray(value) || value.length > MAX_COPIES) {
    reject(trace, `a copy frame that is not a list of at most ${MAX_COPIES} copies`);
    return;
  }
  const sources = sourcesOf(trace);
  for (const item of value) {
    if (!Array.isArray(item) || item.length !== 6) {
      reject(trace, 'a copy that is not [src_rank, src_seq, rank, step, t_ns, seq]');
      continue;
    }
    const [srcRank, srcSeq, rank, step, tNs, seq] = item as unknown[];
    if (
      !isInt(srcRank, 0, MAX_WORLD_SIZE - 1) ||
      !isInt(rank, 0, MAX_WORLD_SIZE - 1) ||
      !isInt(srcSeq, 0, Infinity) ||
      !isInt(seq, 0, Infinity) ||
      !isInt(step, -1, MAX_STEP) ||
      !isInt(tNs, -Infinity, Infinity)
    ) {
      reject(trace, "a copy's rank, step, t_ns or seq is out of ddpviz's limits or malformed");
      continue;
    }
    const source = sources.events.get(`${srcRank}:${srcSeq}`);
    if (source === undefined) {
      reject(trace, 'a copy of no earlier event that a copy may repeat');
      continue;
    }
    const [event, entries] = source;
    if (sources.copied + entries > MAX_COPIED) {
      reject(trace, `copies repeating more than ${MAX_COPIED} list entries in all`);
      continue;
    }
    sources.copied += entries;
    const copy = {
      ...event,
      rank: rank as number,
      step: step as number,
      t_ns: tNs as number,
      seq: seq as number
    } as DDPEvent;
    keep(trace, copy, entries);
  }
}

/**
 * Count `n` events of `trace` as rejected, keeping the first few distinct reasons.
 *
 * @param trace - the trace being read.
 * @param reason - why they were rejected.
 * @param n - how many events.
 */
export function reject(trace: ParsedTrace, reason: string, n = 1): void {
  trace.rejected += n;
  if (trace.rejectReasons.length < 5 && !trace.rejectReasons.includes(reason)) {
    trace.rejectReasons.push(reason);
  }
}
