// Copyright (c) ddpviz contributors. Distributed under the terms of the BSD-3-Clause license.
/**
 * The bounds on everything a trace may declare: the same numbers as `ddpviz/limits.py`
 * (tests/extension/test_limits_mirror.py keeps them equal). An event beyond them, or whose
 * nested values have the wrong shape, is rejected (counted, never shown), so a hostile trace
 * cannot size the page or throw while a panel renders.
 */

export const MAX_WORLD_SIZE = 131072;
export const MAX_PARAMS = 1048576;
export const MAX_BUCKETS = 1048576;
export const MAX_CHUNKS = 65536;
export const MAX_DIMS = 64;
export const MAX_STEP = 1099511627776;
export const MAX_NAME = 4096;
export const MAX_TEXT = 65536;
export const MAX_LINES = 1024;

/** A check of one value: true when it is within its bounds and well formed inside. */
export type LimitCheck = (value: unknown) => boolean;
type Check = LimitCheck;

const int =
  (lo: number, hi: number): Check =>
  v =>
    typeof v === 'number' && Number.isInteger(v) && v >= lo && v <= hi;
const nonNegative: Check = v => typeof v === 'number' && Number.isFinite(v) && v >= 0;
const str =
  (max: number): Check =>
  v =>
    typeof v === 'string' && v.length <= max;
const list =
  (max: number, item: Check): Check =>
  v => {
    if (!Array.isArray(v) || v.length > max) {
      return false;
    }
    for (const x of v) {
      if (!item(x)) {
        return false;
      }
    }
    return true;
  };
const struct = (fields: Record<string, Check>, optional = false): Check => {
  const entries = Object.entries(fields);
  return v => {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) {
      return false;
    }
    const record = v as Record<string, unknown>;
    for (const [k, check] of entries) {
      if (!(optional && record[k] === undefined) && !check(record[k])) {
        return false;
      }
    }
    return true;
  };
};

const rank = int(0, MAX_WORLD_SIZE - 1);
const ranks = list(MAX_WORLD_SIZE, rank);
const name = str(MAX_NAME);
const names = list(MAX_PARAMS, name);
const param = int(0, MAX_PARAMS - 1);
const bucket = int(0, MAX_BUCKETS - 1);
const chunk = int(0, MAX_CHUNKS - 1);
const rankValues = list(
  MAX_WORLD_SIZE,
  v => Array.isArray(v) && v.length === 2 && name(v[0]) && ranks(v[1])
);
// [lo, hi] runs of ranks, lo <= hi (a finding's groups per tensor)
const rankSpans = list(
  MAX_WORLD_SIZE,
  v => Array.isArray(v) && v.length === 2 && rank(v[0]) && rank(v[1]) && v[0] <= v[1]
);
const heldBy = list(
  MAX_WORLD_SIZE,
  v => Array.isArray(v) && v.length === 2 && name(v[0]) && rankSpans(v[1])
);
const tensorGroups = list(
  MAX_LINES,
  v => Array.isArray(v) && v.length === 2 && name(v[0]) && heldBy(v[1])
);

// ParamsBuilt's params, or UnusedParametersFound's (indexes)
const paramIndexes = list(MAX_PARAMS, param);
const paramInfos = list(
  MAX_PARAMS,
  struct({
    index: param,
    name,
    shape: list(MAX_DIMS, nonNegative),
    dtype: name,
    device: name
  })
);

/** Field name -> its check, for every event field with a bound (by name, as in limits.py). */
const FIELDS: Record<string, Check> = {
  rank,
  step: int(-1, MAX_STEP),
  seq: nonNegative,
  world_size: int(1, MAX_WORLD_SIZE),
  n_params: int(0, MAX_PARAMS),
  n_buffers: int(0, MAX_PARAMS),
  src: rank,
  n_tensors: int(0, 2 * MAX_PARAMS),
  n_chunks: int(0, MAX_CHUNKS),
  chunk,
  param,
  bucket,
  nbytes: nonNegative,
  total_bytes: nonNegative,
  count: nonNegative,
  digest: name,
  dtype: name,
  device: name,
  buffers: names,
  ignored: names,
  names,
  params: v => paramIndexes(v) || paramInfos(v),
  grad_ready_order: list(MAX_PARAMS, param),
  buckets: list(MAX_BUCKETS, list(MAX_PARAMS, param)),
  limits: list(MAX_BUCKETS, nonNegative),
  mismatches: list(
    2 * MAX_PARAMS + 2,
    struct({ kind: name, index: int(-1, MAX_PARAMS - 1), name, field: name, values: rankValues })
  ),
  finding: struct({ kind: name, severity: name, title: str(MAX_TEXT) }) as Check
};

const FINDING_OPTIONAL: Check = struct(
  {
    ranks,
    param: int(-1, MAX_PARAMS - 1),
    name,
    field: name,
    bucket: int(-1, MAX_BUCKETS - 1),
    step: int(-1, MAX_STEP),
    values: rankValues,
    detail: list(MAX_LINES, str(MAX_TEXT)),
    fix: str(MAX_TEXT),
    world_size: int(0, MAX_WORLD_SIZE),
    tensors: tensorGroups
  },
  true
);

// FIELDS as a list, made once (outOfLimits checks them in this order)
const FIELD_LIST = Object.entries(FIELDS);

/**
 * Null when every bounded field of `event` (already checked for its kinds) is within the
 * limits and well formed inside; else the first offending field, as `Type.field`.
 */
export function outOfLimits(type: string, event: Record<string, unknown>): string | null {
  for (const [field, check] of FIELD_LIST) {
    if (field in event && !check(event[field])) {
      return `${type}.${field}`;
    }
  }
  if (type === 'FindingReported' && !FINDING_OPTIONAL(event.finding)) {
    return `${type}.finding`;
  }
  return null;
}

/**
 * The check `outOfLimits` applies to an event field of this name, or null for a field with
 * no bound (for `finding`, its required fields; `findingInLimits` checks the optional ones).
 *
 * @param field - an event field's name.
 */
export function fieldLimit(field: string): LimitCheck | null {
  return Object.prototype.hasOwnProperty.call(FIELDS, field) ? FIELDS[field] : null;
}

/**
 * True when the optional fields of a FindingReported's `finding` are within the limits (what
 * `outOfLimits` checks after the fields, for that type only).
 *
 * @param finding - the event's `finding`.
 */
export function findingInLimits(finding: unknown): boolean {
  return FINDING_OPTIONAL(finding);
}
