// Copyright (c) ddpviz contributors. Distributed under the terms of the BSD-3-Clause license.
/**
 * The COLUMNS frame (kind 6) of a `.ddpviz` file, as `ddpviz/traces/columnframe.py` writes and
 * reads it ([Note: the COLUMNS frame] there): a run of one rank's hot events as little-endian
 * integer columns. Its payload is a head, the msgpack array `[rank, rows, widths, strings]`,
 * then the columns `kind` (u8), `step`, `t_ns`, `seq`, `a`, `b`, `s`, each `rows` signed
 * integers of its width in `widths` (1, 2, 4 or 8 bytes), exactly that many bytes. Row i is one
 * event of `rank`, after every event of the frames before it:
 *
 *     kind  type               a       b        s      c           d          e
 *     0     GradReady          param   bucket   -1     0           0          0
 *     1     BucketReady        bucket  0        -1     0           0          0
 *     2     AllReduceDone      bucket  0        -1     0           0          0
 *     3     AllReduceLaunched  bucket  nbytes   dtype  0           0          0
 *     4-6   ForwardStarted, BackwardStarted, BackwardFinished: a to e 0, s -1
 *     7     GradsSummarized    bucket  n_grads  -1     first_t_ns  last_t_ns  nbytes
 *
 * (dtype: an index into `strings`.) A frame has 6 widths (columns step to s; kinds 0-6) or 9
 * (a wide frame: the columns `c`, `d`, `e` follow `s`, and rows may be of kind 7; format 3).
 * A row's event is the plain object a msgpack event map of the same fields decodes to (keys in
 * the Python struct's order, 64-bit values as the nearest double, as `decodePayload` reads
 * them). A frame that breaks a rule (a bound of limits.ts / limits.py, the table above, the
 * payload's length) is damage: its rows are counted as rejected events with a reason, as other
 * bad frames are, and none of them is kept. Linear in the payload.
 */

import type { DDPEvent } from './events';
import { MAX_BUCKETS, MAX_NAME, MAX_PARAMS, MAX_STEP, MAX_WORLD_SIZE } from './limits';
import { decodePayload, ParsedTrace, reject } from './trace';

/** Rows of one COLUMNS frame at most (`columnframe.MAX_COLUMN_ROWS`). */
export const MAX_COLUMN_ROWS = 1048576;

/** Dtype strings of one COLUMNS frame at most (`columnframe.MAX_COLUMN_STRINGS`). */
export const MAX_COLUMN_STRINGS = 4096;

/** The event type of each kind code of a COLUMNS frame (`columnframe.TYPES`). */
export const COLUMN_TYPES = [
  'GradReady',
  'BucketReady',
  'AllReduceDone',
  'AllReduceLaunched',
  'ForwardStarted',
  'BackwardStarted',
  'BackwardFinished',
  'GradsSummarized'
] as const;

/** `limits.MAX_COUNT` (2^62): the bound of a sequence number and of a time in ns, +-. */
const MAX_COUNT = 4611686018427387904;
/** `limits.MAX_BYTES` (2^63 - 1, not a double: every non-negative int64 is within it). */
const MAX_BYTES = '9223372036854775807';

const LAUNCHED = 3;
const SUMMARIZED = 7;
/** The widths a frame has: columns step to s, or step to e (`columnframe.NARROW`, `WIDE`). */
const NARROW = 6;
const WIDE = 9;
const NAMES = ['step', 't_ns', 'seq', 'a', 'b', 's', 'c', 'd', 'e'] as const;
// per kind code: the largest a and b (0: the type has no such field); the smallest is 0
const A_MAX = [
  MAX_PARAMS - 1,
  MAX_BUCKETS - 1,
  MAX_BUCKETS - 1,
  MAX_BUCKETS - 1,
  0,
  0,
  0,
  MAX_BUCKETS - 1
];
const B_MAX = [MAX_BUCKETS - 1, 0, 0, Infinity, 0, 0, 0, MAX_PARAMS];
// c, d and e: 0 but for a GradsSummarized (first_t_ns and last_t_ns within +-MAX_COUNT,
// nbytes any non-negative int64)

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** A COLUMNS frame that breaks the format: what is wrong, and the events it rejects. */
class Damage extends Error {
  constructor(
    readonly what: string,
    readonly rows: number
  ) {
    super(what);
  }
}

/**
 * Read the COLUMNS frame `payload` (at byte `where` of its file) into `trace`: its rows
 * appended to their rank's events; or, when it breaks a rule, its rows (1 if the head cannot
 * say how many) counted as rejected with the reason. Never throws on any payload.
 *
 * @param trace - the trace being read.
 * @param payload - the frame's payload (its checksum already verified).
 * @param where - the frame's byte offset, for the reason.
 */
export function readColumns(trace: ParsedTrace, payload: Uint8Array, where: number): void {
  let events: DDPEvent[];
  let rank: number;
  try {
    [rank, events] = decodeColumns(payload);
  } catch (err) {
    const damage = err instanceof Damage ? err : new Damage(String(err), 1);
    reject(trace, `a COLUMNS frame at byte ${where}: ${damage.what}`, damage.rows);
    return;
  }
  const kept = trace.byRank.get(rank);
  if (kept === undefined) {
    trace.byRank.set(rank, events);
  } else {
    for (let i = 0; i < events.length; i++) {
      kept.push(events[i]);
    }
  }
  trace.count += events.length;
}

/**
 * The rank and the events of a COLUMNS frame's payload, every rule of the format checked in
 * columnframe.py's order; throws Damage (with the rows to count) at the first one broken.
 *
 * @param payload - the frame's payload.
 */
export function decodeColumns(payload: Uint8Array): [number, DDPEvent[]] {
  const end = headEnd(payload);
  let head: unknown;
  try {
    head = decodePayload(payload.subarray(0, end));
  } catch (err) {
    throw new Damage(`its head does not decode: ${err}`, 1);
  }
  const [rank, rows, widths, strings] = head as [number, number, number[], string[]];
  const counted = isInt(rows, 1, MAX_COLUMN_ROWS) ? rows : 1; // the events a damage rejects
  if (!isInt(rank, 0, MAX_WORLD_SIZE - 1)) {
    throw new Damage(`rank ${rank} is out of [0, ${MAX_WORLD_SIZE - 1}]`, counted);
  }
  for (let i = 0; i < strings.length; i++) {
    const text = strings[i];
    if (typeof text !== 'string' || (text.length > MAX_NAME && codePoints(text) > MAX_NAME)) {
      throw new Damage(`string ${i} is longer than ${MAX_NAME} characters`, counted);
    }
  }
  if (!isInt(rows, 1, MAX_COLUMN_ROWS)) {
    throw new Damage(`it holds ${rows} rows, not 1 to ${MAX_COLUMN_ROWS}`, 1);
  }
  let rowBytes = 1;
  for (const w of widths) {
    if (w !== 1 && w !== 2 && w !== 4 && w !== 8) {
      throw new Damage(`column widths [${widths}]: each must be 1, 2, 4 or 8`, rows);
    }
    rowBytes += w;
  }
  const need = end + rows * rowBytes;
  if (payload.length !== need) {
    throw new Damage(`${payload.length} bytes where its head says ${need}`, rows);
  }
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const kind = payload.subarray(end, end + rows);
  const nTypes = widths.length === WIDE ? COLUMN_TYPES.length : SUMMARIZED;
  for (let i = 0; i < rows; i++) {
    if (kind[i] >= nTypes) {
      throw new Damage(
        `kind ${kind[i]} at row ${i}: a row's kind is 0 to ${nTypes - 1} in a frame of ` +
          `${widths.length} widths`,
        rows
      );
    }
  }
  // the first byte of the columns step, t_ns, seq, a, b, s (and c, d, e; kind's is `end`)
  const at = [end + rows];
  for (let c = 1; c < widths.length; c++) {
    at.push(at[c - 1] + rows * widths[c - 1]);
  }
  const col = (c: number, i: number): number => intAt(view, at[c] + i * widths[c], widths[c]);
  // the value of column c at row i exactly, for a message
  const exact = (c: number, i: number): string =>
    widths[c] === 8 ? view.getBigInt64(at[c] + 8 * i, true).toString() : String(col(c, i));
  // true when column c at row i is outside [-MAX_COUNT, MAX_COUNT] though its double is not
  const past = (c: number, i: number, v: number): boolean =>
    (v === MAX_COUNT || v === -MAX_COUNT) && pastCount(view, at[c] + 8 * i);
  for (const [c, lo, hi] of [
    [0, -1, MAX_STEP],
    [1, -MAX_COUNT, MAX_COUNT],
    [2, 0, MAX_COUNT]
  ]) {
    for (let i = 0; i < rows; i++) {
      const v = col(c, i);
      if (v < lo || v > hi || past(c, i, v)) {
        const bounds = `[${BigInt(lo)}, ${BigInt(hi)}]`; // (2^62 exactly, not 4611686018427388000)
        throw new Damage(`${NAMES[c]} = ${exact(c, i)} at row ${i}, out of ${bounds}`, rows);
      }
    }
  }
  const nStrings = strings.length;
  for (let i = 0; i < rows; i++) {
    if (kind[i] !== LAUNCHED && col(5, i) !== -1) {
      throw new Damage(
        `s = ${exact(5, i)} at row ${i}, on a row that is not an AllReduceLaunched (its s is -1)`,
        rows
      );
    }
  }
  for (let i = 0; i < rows; i++) {
    const v = col(5, i);
    if (kind[i] === LAUNCHED && !(v >= 0 && v < nStrings)) {
      throw new Damage(
        `s (AllReduceLaunched's dtype) = ${exact(5, i)} at row ${i}, out of [0, ${nStrings - 1}]`,
        rows
      );
    }
  }
  for (const [c, highs] of [
    [3, A_MAX],
    [4, B_MAX]
  ] as [number, number[]][]) {
    for (let i = 0; i < rows; i++) {
      const v = col(c, i);
      const k = kind[i];
      if (v < 0 || v > highs[k]) {
        const hi = highs[k] === Infinity ? MAX_BYTES : highs[k];
        throw new Damage(
          `${NAMES[c]} = ${exact(c, i)} at row ${i}, out of [0, ${hi}] for a ${COLUMN_TYPES[k]}`,
          rows
        );
      }
    }
  }
  for (let c = 6; c < widths.length; c++) {
    for (let i = 0; i < rows; i++) {
      const v = col(c, i);
      const k = kind[i];
      let bounds = '[0, 0]';
      if (k === SUMMARIZED && c < 8) {
        if (v >= -MAX_COUNT && v <= MAX_COUNT && !past(c, i, v)) {
          continue;
        }
        bounds = `[${-BigInt(MAX_COUNT)}, ${BigInt(MAX_COUNT)}]`;
      } else if (k === SUMMARIZED) {
        if (v >= 0) {
          continue;
        }
        bounds = `[0, ${MAX_BYTES}]`;
      } else if (v === 0) {
        continue;
      }
      throw new Damage(
        `${NAMES[c]} = ${exact(c, i)} at row ${i}, out of ${bounds} for a ${COLUMN_TYPES[k]}`,
        rows
      );
    }
  }
  return [rank, rowEvents(rank, rows, kind, view, at, widths, strings)];
}

/** The events of checked columns, each a literal of its type's keys in Python's order. */
function rowEvents(
  rank: number,
  rows: number,
  kind: Uint8Array,
  view: DataView,
  at: number[],
  widths: number[],
  strings: string[]
): DDPEvent[] {
  const [pStep, pT, pSeq, pA, pB, pS, pC, pD, pE] = at;
  const [wStep, wT, wSeq, wA, wB, wS, wC, wD, wE] = widths;
  const out: DDPEvent[] = [];
  for (let i = 0; i < rows; i++) {
    const step = intAt(view, pStep + i * wStep, wStep);
    const t = intAt(view, pT + i * wT, wT);
    const seq = intAt(view, pSeq + i * wSeq, wSeq);
    switch (kind[i]) {
      case 0:
        out.push({
          type: 'GradReady',
          rank,
          step,
          t_ns: t,
          seq,
          param: intAt(view, pA + i * wA, wA),
          bucket: intAt(view, pB + i * wB, wB)
        });
        break;
      case 1:
      case 2:
        out.push({
          type: kind[i] === 1 ? 'BucketReady' : 'AllReduceDone',
          rank,
          step,
          t_ns: t,
          seq,
          bucket: intAt(view, pA + i * wA, wA)
        });
        break;
      case 3:
        out.push({
          type: 'AllReduceLaunched',
          rank,
          step,
          t_ns: t,
          seq,
          bucket: intAt(view, pA + i * wA, wA),
          nbytes: intAt(view, pB + i * wB, wB),
          dtype: strings[intAt(view, pS + i * wS, wS)]
        });
        break;
      case 4:
        out.push({ type: 'ForwardStarted', rank, step, t_ns: t, seq });
        break;
      case 5:
        out.push({ type: 'BackwardStarted', rank, step, t_ns: t, seq });
        break;
      case 6:
        out.push({ type: 'BackwardFinished', rank, step, t_ns: t, seq });
        break;
      default:
        out.push({
          type: 'GradsSummarized',
          rank,
          step,
          t_ns: t,
          seq,
          bucket: intAt(view, pA + i * wA, wA),
          n_grads: intAt(view, pB + i * wB, wB),
          first_t_ns: intAt(view, pC + i * wC, wC),
          last_t_ns: intAt(view, pD + i * wD, wD),
          nbytes: intAt(view, pE + i * wE, wE)
        });
    }
  }
  return out;
}

/**
 * The little-endian signed integer of `width` (1, 2, 4 or 8) bytes at `p`: an 8-byte one as
 * the nearest double, as `decodePayload` reads an int64 (high word x 2^32 + low word).
 */
function intAt(view: DataView, p: number, width: number): number {
  switch (width) {
    case 1:
      return view.getInt8(p);
    case 2:
      return view.getInt16(p, true);
    case 4:
      return view.getInt32(p, true);
    default:
      return view.getInt32(p + 4, true) * 4294967296 + view.getUint32(p, true);
  }
}

/** Whether the int64 at `p` is outside [-MAX_COUNT, MAX_COUNT] exactly (2^62 = 2^30 x 2^32). */
function pastCount(view: DataView, p: number): boolean {
  const hi = view.getInt32(p + 4, true);
  return (
    hi > 0x40000000 || hi < -0x40000000 || (hi === 0x40000000 && view.getUint32(p, true) !== 0)
  );
}

const isInt = (v: unknown, lo: number, hi: number): v is number =>
  typeof v === 'number' && Number.isInteger(v) && v >= lo && v <= hi;

/** The characters of `text` as Python counts them (code points: a surrogate pair is one). */
function codePoints(text: string): number {
  let n = text.length;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xdc00 && c <= 0xdfff && i > 0) {
      const before = text.charCodeAt(i - 1);
      if (before >= 0xd800 && before <= 0xdbff) {
        n--;
      }
    }
  }
  return n;
}

/**
 * Where the head (a msgpack array of 4: two ints, an array of 6 or 9 ints, an array of at most
 * MAX_COLUMN_STRINGS strings, each valid UTF-8) ends, as columnframe.py's `_head_end` finds
 * it; Damage when the bytes are not of that shape. Reads only the head's own bytes.
 */
function headEnd(bytes: Uint8Array): number {
  let p = expectArray(bytes, 0, 4);
  p = skipInt(bytes, p);
  const rowsAt = p;
  p = skipInt(bytes, p);
  try {
    return headRest(bytes, p);
  } catch (err) {
    // past `rows`: the events to reject, when it is a count a frame may hold
    const rows = decodePayload(bytes.subarray(rowsAt, p));
    throw err instanceof Damage && isInt(rows, 1, MAX_COLUMN_ROWS)
      ? new Damage(err.what, rows)
      : err;
  }
}

/** `headEnd` past `rows`, from `p`: the widths and the strings. */
function headRest(bytes: Uint8Array, p: number): number {
  const [first, widths] = arrayAt(bytes, p);
  if (widths !== NARROW && widths !== WIDE) {
    throw new Damage(
      `its head holds an array of ${widths} where the format has ${NARROW} or ${WIDE}`,
      1
    );
  }
  p = first;
  for (let i = 0; i < widths; i++) {
    p = skipInt(bytes, p);
  }
  const [start, n] = arrayAt(bytes, p);
  if (n > MAX_COLUMN_STRINGS) {
    throw new Damage(`${n} strings, over the ${MAX_COLUMN_STRINGS} a frame may hold`, 1);
  }
  p = start;
  for (let i = 0; i < n; i++) {
    p = skipString(bytes, p);
  }
  return p;
}

function byteAt(bytes: Uint8Array, p: number): number {
  if (p >= bytes.length) {
    throw new Damage('its head is cut short', 1);
  }
  return bytes[p];
}

/** The big-endian unsigned integer of `size` bytes after the byte at `p`. */
function sizeAt(bytes: Uint8Array, p: number, size: number): number {
  if (p + 1 + size > bytes.length) {
    throw new Damage('its head is cut short', 1);
  }
  let n = 0;
  for (let i = 1; i <= size; i++) {
    n = n * 256 + bytes[p + i];
  }
  return n;
}

function expectArray(bytes: Uint8Array, p: number, n: number): number {
  const [next, got] = arrayAt(bytes, p);
  if (got !== n) {
    throw new Damage(`its head holds an array of ${got} where the format has ${n}`, 1);
  }
  return next;
}

function arrayAt(bytes: Uint8Array, p: number): [number, number] {
  const b = byteAt(bytes, p);
  if (b >= 0x90 && b <= 0x9f) {
    return [p + 1, b & 15];
  }
  if (b === 0xdc || b === 0xdd) {
    const size = b === 0xdc ? 2 : 4;
    return [p + 1 + size, sizeAt(bytes, p, size)];
  }
  throw new Damage(`its head has byte 0x${hex(b)} at ${p} where the format has an array`, 1);
}

function skipInt(bytes: Uint8Array, p: number): number {
  const b = byteAt(bytes, p);
  if (b < 0x80 || b >= 0xe0) {
    return p + 1;
  }
  if (b >= 0xcc && b <= 0xd3) {
    const next = p + 1 + (1 << ((b - 0xcc) & 3));
    if (next > bytes.length) {
      throw new Damage('its head is cut short', 1);
    }
    return next;
  }
  throw new Damage(`its head has byte 0x${hex(b)} at ${p} where the format has an integer`, 1);
}

function skipString(bytes: Uint8Array, p: number): number {
  const b = byteAt(bytes, p);
  let start: number;
  let length: number;
  if (b >= 0xa0 && b <= 0xbf) {
    start = p + 1;
    length = b & 31;
  } else if (b >= 0xd9 && b <= 0xdb) {
    const size = 1 << (b - 0xd9);
    start = p + 1 + size;
    length = sizeAt(bytes, p, size);
  } else {
    throw new Damage(`its head has byte 0x${hex(b)} at ${p} where the format has a string`, 1);
  }
  const end = start + length;
  if (end > bytes.length) {
    throw new Damage('its head is cut short', 1);
  }
  for (let i = start; i < end; i++) {
    if (bytes[i] >= 0x80) {
      // not ASCII: valid UTF-8, as msgspec requires (decodePayload would replace a bad byte)
      try {
        UTF8.decode(bytes.subarray(start, end));
      } catch {
        throw new Damage(`its head has a string at ${p} that is not valid UTF-8`, 1);
      }
      break;
    }
  }
  return end;
}

function hex(b: number): string {
  return b.toString(16).padStart(2, '0');
}
