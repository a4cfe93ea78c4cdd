/**
 * Many ranks read as few: value groups, rank-range labels, percentiles, the slowest ranks.
 * The browser twin of ddpviz/model/rank_groups.py (tests/extension/test_rank_groups_mirror.py
 * runs both on the same inputs). No imports: pure functions.
 */

/** Above this many ranks the viewer shows groups and distributions, not a row per rank. */
export const MANY_RANKS = 16;

/** Sorted ranks as ranges: [0, 1, 2, 3, 5, 7, 8] -> '0-3, 5, 7, 8' (runs of 3 or more). */
export function rankLabel(ranks: Iterable<number>): string {
  const sorted = [...new Set(ranks)].sort((a, b) => a - b);
  const parts: string[] = [];
  let run: number[] = [];
  const flush = () => {
    if (run.length >= 3) {
      parts.push(`${run[0]}-${run[run.length - 1]}`);
    } else {
      parts.push(...run.map(String));
    }
    run = [];
  };
  for (const r of sorted) {
    if (run.length > 0 && r !== run[run.length - 1] + 1) {
      flush();
    }
    run.push(r);
  }
  flush();
  return parts.join(', ');
}

/** Ranks that share one value (compared by `key`). */
export interface ValueGroup<T> {
  value: T;
  /** Sorted ascending. */
  ranks: number[];
  label: string;
}

/**
 * Ranks grouped by equal keys, the largest group first (ties: the group with the lowest rank).
 *
 * @param values - [rank, value] pairs.
 * @param key - the string two values are equal by (default: JSON).
 */
export function valueGroups<T>(
  values: Iterable<[number, T]>,
  key: (v: T) => string = v => JSON.stringify(v)
): ValueGroup<T>[] {
  const byKey = new Map<string, { value: T; ranks: number[] }>();
  const sorted = [...values].sort((a, b) => a[0] - b[0]);
  for (const [rank, value] of sorted) {
    const k = key(value);
    const group = byKey.get(k);
    if (group === undefined) {
      byKey.set(k, { value, ranks: [rank] });
    } else {
      group.ranks.push(rank);
    }
  }
  return [...byKey.values()]
    .map(g => ({ value: g.value, ranks: g.ranks, label: rankLabel(g.ranks) }))
    .sort((a, b) => b.ranks.length - a.ranks.length || a.ranks[0] - b.ranks[0]);
}

/** The q-th percentile (0-100) of sorted values, linear between closest ranks (numpy's). */
export function percentile(ordered: number[], q: number): number {
  if (ordered.length === 0) {
    throw new Error('ddpviz: percentile of no values; pass at least one value');
  }
  const pos = ((ordered.length - 1) * q) / 100;
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, ordered.length - 1);
  return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo);
}

/** A number across ranks. */
export interface Spread {
  n: number;
  min: number;
  p10: number;
  p50: number;
  p90: number;
  max: number;
}

/** min, p10, median, p90, max; null for no values. */
export function spread(values: Iterable<number>): Spread | null {
  const ordered = [...values].sort((a, b) => a - b);
  if (ordered.length === 0) {
    return null;
  }
  return {
    n: ordered.length,
    min: ordered[0],
    p10: percentile(ordered, 10),
    p50: percentile(ordered, 50),
    p90: percentile(ordered, 90),
    max: ordered[ordered.length - 1]
  };
}

/** The k ranks with the largest values, largest first (ties: lowest rank first). */
export function slowest(values: Iterable<[number, number]>, k = 5): [number, number][] {
  return [...values].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, k);
}
