/**
 * Who made each bucket's all-reduce wait: the viewer's copy of ddpviz/_diagnose/straggler.py's
 * `who_waited` and `wait_rows` (tests/extension/test_waits_mirror.py runs both on the same
 * inputs). On each recorded step, the rank whose AllReduceLaunched (BucketReady where a rank
 * recorded no launch) of a bucket came last made that all-reduce wait, for the time since the
 * launch before it; within the two ranks' clock uncertainty, nobody is blamed. Pure and
 * import-free (transpiled alone by the mirror test).
 */

/** Offsets known from wall clocks only (error -1): NTP's error assumed, as in straggler.py. */
export const UNKNOWN_CLOCK_ERROR_NS = 10_000_000;
export const MAX_STEPS = 4096;
export const MAX_CELLS = 1 << 23;
/** Above this many ranks the view shows the top ranks and one row for the others. */
export const MANY_RANKS = 16;
export const TOP_RANKS = 8;

/** One rank's times, on the aligned clock (t_ns + the rank's offset). */
export interface RankTimes {
  rank: number;
  /** Steps of its ForwardStarted events. */
  forwardSteps: number[];
  /** [step, bucket, t] of its AllReduceLaunched events (or BucketReady without any). */
  launches: [number, number, number][];
  /** [step, t] of its BackwardFinished events, in order. */
  ends: [number, number][];
  /** Its clock offset's error bound in ns (-1: unknown). */
  error: number;
}

export interface WaitFold {
  ranks: number[];
  buckets: number[];
  /** [rank index][bucket index]: steps in which the rank launched the bucket last. */
  nLast: number[][];
  /** [rank index][bucket index]: total time the others waited for it (ns). */
  waitNs: number[][];
  /** Steps with every rank's launch of at least one bucket. */
  steps: number;
  /** Bucket-steps within the clock uncertainty (blamed on nobody). */
  unsure: number;
  /** The largest clock uncertainty of a rank (ns). */
  maxError: number;
}

export interface WaitRow {
  /** One rank, or (the last row above MANY_RANKS) every rank not shown on its own. */
  ranks: number[];
  others: boolean;
  nLast: number[];
  waitNs: number[];
}

function uniqueSorted(xs: Iterable<number>): number[] {
  return [...new Set(xs)].sort((a, b) => a - b);
}

/** numpy's median: the mean of the two middle values of an even count. */
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/** Per rank: |median over steps of (its end of backward - the ranks' median)|. */
function endSkew(times: RankTimes[], steps: number[]): number[] {
  const index = new Map(steps.map((s, i) => [s, i]));
  const grid = times.map(rt => {
    const row = new Array<number>(steps.length).fill(NaN);
    for (const [step, t] of rt.ends) {
      const i = index.get(step);
      if (i !== undefined) {
        row[i] = t; // the last one of the step wins
      }
    }
    return row;
  });
  const cols = steps.map((_, j) => j).filter(j => grid.every(row => !Number.isNaN(row[j])));
  if (times.length < 2 || cols.length === 0) {
    return times.map(() => 0);
  }
  const mid = cols.map(j => median(grid.map(row => row[j])));
  return grid.map(row => Math.abs(median(cols.map((j, c) => row[j] - mid[c]))));
}

/** The rank x bucket "who made the all-reduce wait" table (straggler.py `who_waited`). */
export function whoWaited(input: RankTimes[]): WaitFold {
  const times = [...input].sort((a, b) => a.rank - b.rank);
  const ranks = times.map(t => t.rank);
  const nR = ranks.length;
  let t0 = Infinity;
  for (const rt of times) {
    for (const [, t] of rt.ends) {
      t0 = Math.min(t0, t);
    }
    for (const [, , t] of rt.launches) {
      t0 = Math.min(t0, t);
    }
  }
  const steps = uniqueSorted(times.flatMap(t => t.forwardSteps).filter(s => s >= 0)).slice(
    -MAX_STEPS
  );
  const skew = endSkew(times, steps);
  const errors = times.map((rt, i) =>
    Math.max(rt.error < 0 ? UNKNOWN_CLOCK_ERROR_NS : rt.error, skew[i])
  );
  const launched = times.flatMap(rt => rt.launches).filter(([s]) => s >= 0);
  const buckets = uniqueSorted(launched.map(([, b]) => b));
  let bSteps = uniqueSorted(launched.map(([s]) => s));
  const perStep = Math.max(1, nR * Math.max(1, buckets.length));
  const keep = Math.min(bSteps.length, MAX_STEPS, Math.floor(MAX_CELLS / perStep));
  bSteps = keep > 0 ? bSteps.slice(bSteps.length - keep) : [];
  if (nR * buckets.length > MAX_CELLS) {
    bSteps = [];
  }
  const nS = bSteps.length;
  const nB = buckets.length;
  const sIndex = new Map(bSteps.map((s, i) => [s, i]));
  const bIndex = new Map(buckets.map((b, i) => [b, i]));
  const cube = new Float64Array(nR * nS * nB).fill(NaN);
  times.forEach((rt, r) => {
    for (const [s, b, t] of rt.launches) {
      const i = sIndex.get(s);
      const j = bIndex.get(b);
      if (i !== undefined && j !== undefined) {
        cube[(r * nS + i) * nB + j] = t - t0;
      }
    }
  });
  const nLast = ranks.map(() => new Array<number>(nB).fill(0));
  const waitNs = ranks.map(() => new Array<number>(nB).fill(0));
  let stepsSeen = 0;
  let unsure = 0;
  for (let i = 0; i < nS && nR >= 2; i++) {
    let any = false;
    for (let j = 0; j < nB; j++) {
      let last = -1;
      let second = -1;
      let valid = true;
      for (let r = 0; r < nR; r++) {
        const t = cube[(r * nS + i) * nB + j];
        if (Number.isNaN(t)) {
          valid = false;
          break;
        }
        // ties: the higher rank index is later (numpy's stable argsort, last two)
        if (last < 0 || t >= cube[(last * nS + i) * nB + j]) {
          second = last;
          last = r;
        } else if (second < 0 || t >= cube[(second * nS + i) * nB + j]) {
          second = r;
        }
      }
      if (!valid) {
        continue;
      }
      any = true;
      const wait = cube[(last * nS + i) * nB + j] - cube[(second * nS + i) * nB + j];
      if (wait > errors[last] + errors[second]) {
        nLast[last][j] += 1;
        waitNs[last][j] += wait;
      } else {
        unsure += 1;
      }
    }
    if (any) {
      stepsSeen += 1;
    }
  }
  return {
    ranks,
    buckets,
    nLast,
    waitNs,
    steps: stepsSeen,
    unsure,
    maxError: errors.length ? Math.max(...errors) : 0
  };
}

/**
 * The rows of the view (straggler.py `wait_rows`): one per rank up to `many` ranks; above,
 * the `top` ranks that caused most wait, then every other rank in one row.
 */
export function waitRows(fold: WaitFold, many = MANY_RANKS, top = TOP_RANKS): WaitRow[] {
  const nR = fold.ranks.length;
  const totals = fold.waitNs.map(row => row.reduce((a, b) => a + b, 0));
  let keep: number[];
  let rest: number[] = [];
  if (nR <= many) {
    keep = fold.ranks.map((_, i) => i);
  } else {
    const order = totals.map((_, i) => i).sort((a, b) => totals[b] - totals[a] || a - b);
    keep = order
      .slice(0, top)
      .filter(i => totals[i] > 0)
      .sort((a, b) => a - b);
    const kept = new Set(keep);
    rest = fold.ranks.map((_, i) => i).filter(i => !kept.has(i));
  }
  const rows: WaitRow[] = keep.map(i => ({
    ranks: [fold.ranks[i]],
    others: false,
    nLast: [...fold.nLast[i]],
    waitNs: [...fold.waitNs[i]]
  }));
  if (rest.length) {
    rows.push({
      ranks: rest.map(i => fold.ranks[i]),
      others: true,
      nLast: fold.buckets.map((_, j) => rest.reduce((n, i) => n + fold.nLast[i][j], 0)),
      waitNs: fold.buckets.map((_, j) => rest.reduce((n, i) => n + fold.waitNs[i][j], 0))
    });
  }
  return rows;
}
