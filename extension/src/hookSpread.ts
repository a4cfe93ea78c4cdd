/**
 * One iteration across many ranks as distributions (the viewer's twin of
 * ddpviz/model/hook_spread.py): per bucket, when its last gradient hook fired and when its
 * all-reduce ran, as spreads over ranks; and the ranks whose backward compute ended last.
 * Times are ns after the window start `t0` (aligned clocks).
 */
import { TimelineRow } from './eventModel';
import { Spread, slowest, spread } from './rankGroups';

/** One bucket across ranks. */
export interface BucketSpread {
  bucket: number;
  /** The bucket's last gradient hook per rank (its gradients are all ready then). */
  ready: Spread | null;
  launched: Spread | null;
  done: Spread | null;
  /** Launch to done, ns. */
  took: Spread | null;
  /** The rank whose bucket was ready last. */
  latestRank: number | null;
}

/** A rank whose last gradient hook came late. */
export interface Straggler {
  rank: number;
  /** Its last hook, ns after t0. */
  computeEnd: number;
  /** After the median rank's last hook, ms. */
  behindMs: number;
}

export interface TimelineSpread {
  nRanks: number;
  /** Last gradient hook per rank, ns after t0. */
  computeEnd: Spread | null;
  buckets: BucketSpread[];
  slowest: Straggler[];
}

/**
 * Distributions across `rows` (every rank's lane of one iteration, from `timelineRows`).
 *
 * @param rows - the lanes; @param t0 - the window start; @param k - stragglers named.
 */
export function timelineSpread(rows: TimelineRow[], t0: number, k = 5): TimelineSpread {
  const ready = new Map<number, Map<number, number>>();
  const launched = new Map<number, number[]>();
  const done = new Map<number, number[]>();
  const took = new Map<number, number[]>();
  const ends: [number, number][] = [];
  const push = (m: Map<number, number[]>, b: number, v: number) => {
    const list = m.get(b);
    if (list === undefined) {
      m.set(b, [v]);
    } else {
      list.push(v);
    }
  };
  for (const row of rows) {
    let end = -Infinity;
    for (const g of row.grads) {
      end = Math.max(end, g.t);
      let perRank = ready.get(g.bucket);
      if (perRank === undefined) {
        perRank = new Map();
        ready.set(g.bucket, perRank);
      }
      perRank.set(row.rank, Math.max(perRank.get(row.rank) ?? -Infinity, g.t - t0));
    }
    for (const g of row.summaries) {
      end = Math.max(end, g.last);
    }
    if (Number.isFinite(end)) {
      ends.push([row.rank, end - t0]);
    }
    for (const a of row.allreduces) {
      push(launched, a.bucket, a.start - t0);
      if (a.finished) {
        push(done, a.bucket, a.end - t0);
        push(took, a.bucket, a.end - a.start);
      }
    }
  }
  const buckets = [...new Set([...ready.keys(), ...launched.keys()])].sort((a, b) => a - b);
  const computeEnd = spread(ends.map(([, v]) => v));
  const median = computeEnd === null ? 0 : computeEnd.p50;
  return {
    nRanks: rows.length,
    computeEnd,
    buckets: buckets.map(b => {
      const perRank = ready.get(b) ?? new Map<number, number>();
      const latest = slowest(perRank.entries(), 1);
      return {
        bucket: b,
        ready: spread(perRank.values()),
        launched: spread(launched.get(b) ?? []),
        done: spread(done.get(b) ?? []),
        took: spread(took.get(b) ?? []),
        latestRank: latest.length > 0 ? latest[0][0] : null
      };
    }),
    slowest: slowest(ends, k).map(([rank, v]) => ({
      rank,
      computeEnd: v,
      behindMs: (v - median) / 1e6
    }))
  };
}
