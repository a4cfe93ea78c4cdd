/**
 * The advice panel: the bucket advisor's answer drawn, the recommendation in words, the
 * predicted step time against the bucket cap (plain SVG; the current setting a star, the
 * recommended one ringed) and the recommended bucket map. The advisor runs in Python
 * (ddpviz/advisor): the kernel (TraceView) or the report sends its numbers and words as
 * msgpack data (ddpviz/advisor/wire.py), checked here on arrival as a trace's events are;
 * nothing is computed here but the drawing. JupyterLab's file viewer has no kernel: it says
 * where to get the advice instead.
 */

import { decode } from '@msgpack/msgpack';

import { bucketBar } from './bucketBar';
import { h, note, s, section, ViewOptions } from './dom';
import { TraceModel } from './eventModel';
import { MAX_BUCKETS, MAX_NAME, MAX_PARAMS, MAX_TEXT, MAX_WORLD_SIZE } from './limits';
import { zoomable } from './zoom';

/** The wire version read (wire.py's WIRE_VERSION). */
export const ADVICE_VERSION = 1;
/** At most this many candidates and notes (wire.py's MAX_ROWS, MAX_NOTES). */
export const MAX_ADVICE_ROWS = 1024;
export const MAX_ADVICE_NOTES = 64;

/** One candidate's prediction (wire.py's SentRow). */
export interface AdviceRow {
  label: string;
  family: string;
  setting: string;
  cap_mb: number;
  step_ms: number;
  exposed_ms: number;
  buckets: number;
  current: boolean;
  recommended: boolean;
}

/** The recommended setting's bucket map (wire.py's SentMap). */
export interface AdviceMap {
  setting: string;
  rebuilt: boolean;
  buckets: number[][];
  bytes: number[];
  limits: number[];
}

/** The advisor's answer, or `error`: why it cannot advise (wire.py's SentAdvice). */
export interface Advice {
  version: number;
  error: string;
  /** The advisor is still at work on this run (a TraceView's kernel thread). */
  pending: boolean;
  /** The run's events the advice read (a live run's grow). */
  events: number;
  world_size: number;
  steps: number;
  first_step: number;
  last_step: number;
  measured_step_ms: number;
  contention: number;
  reason: string;
  recommended: string;
  rows: AdviceRow[];
  map: AdviceMap | null;
  notes: string[];
}

type Check = (v: unknown) => boolean;
const str =
  (most: number): Check =>
  v =>
    typeof v === 'string' && v.length <= most;
const int =
  (lo: number, hi: number): Check =>
  v =>
    typeof v === 'number' && Number.isInteger(v) && v >= lo && v <= hi;
const num: Check = v => typeof v === 'number';
const bool: Check = v => typeof v === 'boolean';
const list =
  (most: number, item: Check): Check =>
  v =>
    Array.isArray(v) && v.length <= most && v.every(item);
const struct =
  (fields: Record<string, Check>): Check =>
  v => {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) {
      return false;
    }
    const record = v as Record<string, unknown>;
    return Object.entries(fields).every(([k, check]) => check(record[k]));
  };

const ROW = struct({
  label: str(MAX_NAME),
  family: str(MAX_NAME),
  setting: str(MAX_TEXT),
  cap_mb: num,
  step_ms: num,
  exposed_ms: num,
  buckets: int(0, MAX_BUCKETS),
  current: bool,
  recommended: bool
});
const MAP = struct({
  setting: str(MAX_TEXT),
  rebuilt: bool,
  buckets: list(MAX_BUCKETS, list(MAX_PARAMS, int(0, MAX_PARAMS - 1))),
  bytes: list(MAX_BUCKETS, int(0, Number.MAX_SAFE_INTEGER)),
  limits: list(MAX_BUCKETS, v => typeof v === 'number' && v >= 0)
});
const ADVICE = struct({
  version: v => v === ADVICE_VERSION,
  error: str(MAX_TEXT),
  pending: bool,
  events: int(0, Number.MAX_SAFE_INTEGER),
  world_size: int(0, MAX_WORLD_SIZE),
  steps: int(0, Number.MAX_SAFE_INTEGER),
  first_step: int(-1, Number.MAX_SAFE_INTEGER),
  last_step: int(-1, Number.MAX_SAFE_INTEGER),
  measured_step_ms: num,
  contention: num,
  reason: str(MAX_TEXT),
  recommended: str(MAX_NAME),
  rows: list(MAX_ADVICE_ROWS, ROW),
  map: v => v === null || MAP(v),
  notes: list(MAX_ADVICE_NOTES, str(MAX_TEXT))
});

/**
 * The advisor's answer the kernel sent (msgpack), checked: null when none was sent (empty
 * bytes: the panel says where to get it); a one-line reason when it does not read (the panel
 * says so, never a wrong answer).
 */
export function adviceOf(bytes: Uint8Array): Advice | string | null {
  if (bytes.length === 0) {
    return null;
  }
  try {
    const value = decode(bytes, {
      useBigInt64: false,
      maxStrLength: 4 * MAX_TEXT,
      maxArrayLength: Math.max(MAX_PARAMS, MAX_BUCKETS),
      maxMapLength: 64,
      maxBinLength: 0,
      maxExtLength: 0
    });
    if (!ADVICE(value)) {
      throw new Error('not the advice this viewer reads (a field is missing or out of bounds)');
    }
    const advice = value as Advice;
    const map = advice.map;
    if (
      map !== null &&
      (map.bytes.length !== map.buckets.length ||
        map.limits.length !== map.buckets.length ||
        map.buckets.reduce((n, b) => n + b.length, 0) > MAX_PARAMS)
    ) {
      throw new Error('its bucket map is malformed');
    }
    return advice;
  } catch (err) {
    return String(err instanceof Error ? err.message : err);
  }
}

const FAMILIES: Record<string, [string, string]> = {
  // family: [legend, colour]
  cap: ['bucket_cap_mb = cap', '#4e79a7'],
  'first+cap': ['1 MiB first bucket + cap', '#f28e2b'],
  default: ["torch's default", '#59a14f'],
  layers: ['one bucket per layer group', '#b07aa1'],
  user: ['your candidates', '#9c755f']
};
const RECOMMENDED_COLOR = '#d62728';

const W = 640;
const H = 300;
const M = { l: 62, r: 16, t: 12, b: 40 };

/** A few round values in [lo, hi] (1, 2, 5 x 10^k steps). */
function ticks(lo: number, hi: number): number[] {
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map(m => m * mag).find(x => x >= raw) ?? 10 * mag;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

function ms(x: number): string {
  return `${x.toFixed(2)} ms`;
}

/** Predicted step time (ms) against the largest bucket cap (MiB, log scale). */
function chart(advice: Advice): Element {
  const rows = advice.rows.filter(
    r => Number.isFinite(r.cap_mb) && r.cap_mb > 0 && Number.isFinite(r.step_ms)
  );
  const svg = s('svg', {
    class: 'ddpviz-advice-chart',
    viewBox: `0 0 ${W} ${H}`,
    width: W,
    height: H,
    role: 'img',
    'aria-label': 'predicted step time per bucket setting'
  });
  if (rows.length === 0) {
    return svg;
  }
  let x0 = Math.log2(Math.min(...rows.map(r => r.cap_mb)));
  let x1 = Math.log2(Math.max(...rows.map(r => r.cap_mb)));
  const xPad = Math.max(0.3, (1 - (x1 - x0)) / 2); // (markers clear of the axes)
  x0 -= xPad;
  x1 += xPad;
  let y0 = Math.min(...rows.map(r => r.step_ms));
  let y1 = Math.max(...rows.map(r => r.step_ms));
  const pad = (y1 - y0 || Math.abs(y1) || 1) * 0.08;
  y0 -= pad;
  y1 += pad;
  const X = (cap: number) => M.l + ((Math.log2(cap) - x0) / (x1 - x0)) * (W - M.l - M.r);
  const Y = (v: number) => H - M.b - ((v - y0) / (y1 - y0)) * (H - M.t - M.b);
  const parts: Element[] = [];
  for (const v of ticks(y0, y1)) {
    parts.push(
      s('line', { class: 'ddpviz-grid', x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v) }),
      s('text', { x: M.l - 6, y: Y(v) + 4, 'text-anchor': 'end' }, String(v))
    );
  }
  const every = Math.max(1, Math.ceil((x1 - x0) / 10)); // at most ~10 labels: powers of 2
  for (let e = Math.ceil(x0); e <= Math.floor(x1); e += every) {
    const x = X(2 ** e);
    parts.push(
      s('line', { class: 'ddpviz-axis', x1: x, x2: x, y1: H - M.b, y2: H - M.b + 4 }),
      s(
        'text',
        { x, y: H - M.b + 16, 'text-anchor': 'middle' },
        String(Number((2 ** e).toPrecision(3)))
      )
    );
  }
  parts.push(
    s('line', { class: 'ddpviz-axis', x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }),
    s('line', { class: 'ddpviz-axis', x1: M.l, x2: M.l, y1: M.t, y2: H - M.b }),
    s(
      'text',
      { x: (M.l + W - M.r) / 2, y: H - 4, 'text-anchor': 'middle' },
      'bucket cap (MiB, largest entry of a list; log scale)'
    ),
    s(
      'text',
      {
        x: 12,
        y: (M.t + H - M.b) / 2,
        transform: `rotate(-90 12 ${(M.t + H - M.b) / 2})`,
        'text-anchor': 'middle'
      },
      'predicted step time (ms)'
    )
  );
  const families = new Map<string, AdviceRow[]>();
  for (const r of rows.filter(r => !r.current)) {
    families.set(r.family, [...(families.get(r.family) ?? []), r]);
  }
  for (const [family, members] of families) {
    const color = (FAMILIES[family] ?? FAMILIES.user)[1];
    members.sort((a, b) => a.cap_mb - b.cap_mb);
    if (family === 'cap' || family === 'first+cap') {
      parts.push(
        s('polyline', {
          points: members.map(r => `${X(r.cap_mb)},${Y(r.step_ms)}`).join(' '),
          fill: 'none',
          stroke: color,
          'stroke-width': 1.5
        })
      );
    }
    for (const r of members) {
      parts.push(
        s(
          'circle',
          {
            class: 'ddpviz-advice-point',
            cx: X(r.cap_mb),
            cy: Y(r.step_ms),
            r: 3.5,
            fill: color,
            'data-family': family,
            'data-label': r.label,
            'data-step-ms': r.step_ms
          },
          s(
            'title',
            {},
            `${r.label}: ${r.buckets} buckets, exposed comm ${ms(r.exposed_ms)}, ` +
              `predicted step ${ms(r.step_ms)}`
          )
        )
      );
    }
  }
  const current = rows.find(r => r.current);
  if (current !== undefined) {
    const [cx, cy] = [X(current.cap_mb), Y(current.step_ms)];
    const star = Array.from({ length: 10 }, (_, i) => {
      const a = (Math.PI / 5) * i - Math.PI / 2;
      const rr = i % 2 === 0 ? 8 : 3.5;
      return `${cx + rr * Math.cos(a)},${cy + rr * Math.sin(a)}`;
    }).join(' ');
    parts.push(
      s(
        'polygon',
        {
          class: 'ddpviz-advice-current',
          points: star,
          fill: 'currentColor',
          'data-step-ms': current.step_ms
        },
        s('title', {}, `current (${current.buckets} buckets): ${ms(current.step_ms)}`)
      ),
      s('text', { x: cx, y: cy - 11, 'text-anchor': 'middle' }, 'current')
    );
  }
  const rec = rows.find(r => r.recommended);
  if (rec !== undefined) {
    parts.push(
      s(
        'circle',
        {
          class: 'ddpviz-advice-recommended',
          cx: X(rec.cap_mb),
          cy: Y(rec.step_ms),
          r: 9,
          fill: 'none',
          stroke: RECOMMENDED_COLOR,
          'stroke-width': 2,
          'data-label': rec.label,
          'data-step-ms': rec.step_ms
        },
        s('title', {}, `recommended: ${rec.label}: ${ms(rec.step_ms)}`)
      )
    );
  }
  svg.append(...parts);
  return svg;
}

function legend(advice: Advice): HTMLElement {
  const seen = [...new Set(advice.rows.filter(r => !r.current).map(r => r.family))];
  return h(
    'ul',
    { class: 'ddpviz-advice-legend' },
    seen.map(f => {
      const [label, color] = FAMILIES[f] ?? [f, FAMILIES.user[1]];
      return h('li', {}, h('span', { style: `background: ${color}` }), label);
    }),
    h('li', {}, '★ current'),
    h('li', {}, h('span', { style: `border: 2px solid ${RECOMMENDED_COLOR}` }), 'recommended')
  );
}

/**
 * The panel for the advice sent (`adviceOf`'s answer), over the run's model (the recommended
 * map's parameters are the run's).
 */
export function renderAdvice(
  advice: Advice | string | null,
  model: TraceModel,
  options: ViewOptions,
  live = ''
): HTMLElement {
  const title = 'Bucket advice';
  if (advice === null) {
    return section(
      'advice',
      title,
      h(
        'p',
        { class: 'ddpviz-note', 'data-advice': 'needs-kernel' },
        'The bucket advisor runs in Python, which this viewer has none of: `ddpviz advise ' +
          "FILE` in a terminal prints its advice, and a notebook's " +
          '`ddpviz.Trace.load(FILE).view()` or the HTML report (`ddpviz report`) draw it here.'
      )
    );
  }
  if (typeof advice === 'string') {
    console.warn(`ddpviz: the bucket advice sent does not read (${advice}).`);
    return section(
      'advice',
      title,
      note(`ddpviz: the bucket advice sent does not read (${advice}); not shown.`, 'warning')
    );
  }
  if (advice.pending) {
    return section(
      'advice',
      title,
      h(
        'p',
        { class: 'ddpviz-note', 'data-advice': 'pending' },
        'The bucket advisor is at work on this run in the kernel (it replays every recorded ' +
          'step for each bucket setting: a few seconds for 20,000 events); its answer is ' +
          'drawn here when it comes.'
      )
    );
  }
  const soFar =
    live === 'running'
      ? h(
          'p',
          { class: 'ddpviz-note' },
          h('em', { class: 'ddpviz-so-far' }, 'So far: '),
          `of the run's first ${advice.events.toLocaleString('en')} events (the kernel asks ` +
            'the advisor again every so often while the run goes on, and once it ends).'
        )
      : null;
  if (advice.error !== '') {
    return section(
      'advice',
      title,
      soFar,
      h('p', { 'data-advice': 'refused' }, 'The bucket advisor cannot advise on this run:'),
      h('pre', { class: 'ddpviz-advice-error' }, advice.error)
    );
  }
  const steps =
    advice.first_step === advice.last_step
      ? `step ${advice.first_step}`
      : `steps ${advice.first_step}-${advice.last_step}`;
  const map = advice.map;
  const params = new Map(model.params.map(p => [p.index, p]));
  return section(
    'advice',
    title,
    soFar,
    h('p', { class: 'ddpviz-advice-reason', 'data-advice': 'advised' }, advice.reason),
    note(
      `${advice.world_size} ranks: ${advice.steps} recorded ${steps} replayed with each ` +
        `bucket setting (measured step ${ms(advice.measured_step_ms)}, contention ` +
        `${advice.contention}). Hover a point for its buckets and exposed communication.`
    ),
    chart(advice),
    legend(advice),
    map === null
      ? null
      : h(
          'div',
          { class: 'ddpviz-advice-map', 'data-buckets': map.buckets.length },
          h(
            'h4',
            {},
            `recommended buckets: ${map.setting}` +
              (map.rebuilt ? ' (after the rebuild in gradient-ready order)' : '') +
              ` · ${map.buckets.length} bucket${map.buckets.length === 1 ? '' : 's'}`
          ),
          zoomable(
            bucketBar(map.buckets, map.bytes, map.limits, params, options, false),
            'advice',
            options.picks
          )
        ),
    advice.notes.map(n => note(`note: ${n}`))
  );
}
