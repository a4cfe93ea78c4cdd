/**
 * Many ranks read as few: value groups, rank-range labels, percentiles, the slowest ranks.
 * The browser twin of ddpviz/model/rank_groups.py (tests/extension/test_rank_groups_mirror.py
 * runs both on the same inputs). No imports: pure functions.
 */

/** Above this many ranks the viewer shows groups and distributions, not a row per rank. */
export const MANY_RANKS = 16;

/**
 * Numbers (ranks, steps) in ascending order as ranges: [7, 0, 1, 2, 3, 5, 8] -> '0-3, 5, 7, 8'.
 * Every range label in the viewer is spelled here (as format_ranges in ddpviz/findings.py).
 *
 * @param numbers - the numbers, in any order.
 * @param run - a run of this many or more consecutive numbers reads 'a-b'.
 * @param most - past this many items '...' follows (default: all items).
 * @param sep - between items.
 */
export function formatRanges(
  numbers: Iterable<number>,
  { run = 3, most = Infinity, sep = ', ' }: { run?: number; most?: number; sep?: string } = {}
): string {
  const parts: string[] = [];
  let streak: number[] = [];
  const flush = () => {
    if (streak.length >= run) {
      parts.push(`${streak[0]}-${streak[streak.length - 1]}`);
    } else {
      parts.push(...streak.map(String));
    }
    streak = [];
  };
  for (const n of [...numbers].sort((a, b) => a - b)) {
    if (streak.length > 0 && n !== streak[streak.length - 1] + 1) {
      flush();
    }
    streak.push(n);
  }
  flush();
  return parts.length > most ? parts.slice(0, most).join(sep) + sep + '...' : parts.join(sep);
}

/** Sorted ranks as ranges: [0, 1, 2, 3, 5, 7, 8] -> '0-3, 5, 7, 8' (runs of 3 or more). */
export function rankLabel(ranks: Iterable<number>): string {
  return formatRanges(new Set(ranks));
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
export function percentile(ordered: ArrayLike<number>, q: number): number {
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
  // (a typed array sorts numbers natively, without calling a comparator per comparison)
  const ordered = Float64Array.from(values).sort();
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
