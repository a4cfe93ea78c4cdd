/**
 * The trace viewer's DOM: a summary, the bucket map, verification results, broadcast progress,
 * the hook timeline of one iteration, findings and event counts, rendered from a TraceModel.
 * Plain DOM and SVG (no plotting library), so a trace opens fast and with no kernel.
 */

import { bucketColor } from './colors';
import { Mismatch } from './events';
import { BucketMapGroup, paramBytes, Timeline, TraceModel } from './model';

/** What the settings change about rendering. */
export interface ViewOptions {
  /** A key of PALETTES. */
  scheme: string;
  /** At most this many marks in the hook timeline. */
  maxEvents: number;
}

type Attrs = Record<string, string | number | boolean | undefined>;
type Child = Node | string | null | undefined | false;
/** A child, or an array of them: arrays are passed as is, never spread into a call (100,000
 * ranks or buckets would overflow the stack). */
type Children = Child | Child[];

/** An HTML element with attributes (`class`, `title`, `data-*`, ...) and children. */
function h(tag: string, attrs: Attrs = {}, ...children: Children[]): HTMLElement {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

function appendAll(el: Element, children: Children[]): void {
  for (const c of children) {
    if (Array.isArray(c)) {
      for (const x of c) {
        if (x !== null && x !== undefined && x !== false) {
          el.append(x);
        }
      }
    } else if (c !== null && c !== undefined && c !== false) {
      el.append(c);
    }
  }
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element with attributes and children. */
function s(tag: string, attrs: Attrs = {}, ...children: Children[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

function setAttrs(el: Element, attrs: Attrs): void {
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== false) {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
}

/** 1536 -> "1.5 KiB"; 2**62 and more (torch's sys.maxsize) -> "unlimited" (as ddpviz/units.py). */
export function humanBytes(n: number): string {
  if (n >= 2 ** 62) {
    return 'unlimited';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = n;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${units[u]}`;
}

/** [3] -> "rank 3"; [0, 1, 2] -> "ranks 0,1,2"; runs of 4 or more as "a-b" (as findings.py). */
export function formatRanks(ranks: number[]): string {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts: string[] = [];
  let run: number[] = [];
  const flush = () => {
    if (run.length >= 4) {
      parts.push(`${run[0]}-${run[run.length - 1]}`);
    } else {
      for (const r of run) {
        parts.push(String(r));
      }
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
  if (parts.length === 0) {
    return 'no rank';
  }
  return (sorted.length === 1 ? 'rank ' : 'ranks ') + parts.join(',');
}

function section(kind: string, title: string, ...children: Children[]): HTMLElement {
  const el = h(
    'section',
    { class: `ddpviz-section ddpviz-${kind}`, 'data-section': kind },
    h('h3', {}, title)
  );
  appendAll(el, children);
  return el;
}

function note(text: string, kind = 'note'): HTMLElement {
  return h('p', { class: `ddpviz-${kind}` }, text);
}

/**
 * Render a whole trace.
 *
 * @param model - the trace's model.
 * @param name - the file name shown as the title.
 * @param options - colour scheme and event limit.
 */
export function renderTrace(model: TraceModel, name: string, options: ViewOptions): HTMLElement {
  return h(
    'div',
    { class: 'ddpviz-trace' },
    guarded('summary', 'Summary', () => renderSummary(model, name)),
    guarded('findings', 'Findings', () => renderFindings(model)),
    guarded('buckets', 'Bucket map', () => renderBuckets(model, options)),
    guarded('verification', 'Verification', () => renderVerification(model)),
    guarded('broadcast', 'State broadcast', () => renderBroadcast(model)),
    guarded('timeline', 'Hook timeline', () => renderTimelineSection(model, options)),
    guarded('counts', 'Events', () => renderCounts(model))
  );
}

/**
 * One panel; if drawing it throws (a malformed trace that decoding let through), a warning
 * in its place instead of a blank viewer: the other panels still draw.
 */
function guarded(kind: string, title: string, draw: () => HTMLElement | null): HTMLElement | null {
  try {
    return draw();
  } catch (err) {
    return section(
      kind,
      title,
      note(
        `ddpviz: this panel could not be drawn from this trace (${err}); the others are shown.`,
        'warning'
      )
    );
  }
}

/** The error shown instead of a trace that does not load. */
export function renderError(message: string): HTMLElement {
  return h(
    'div',
    { class: 'ddpviz-trace' },
    h('pre', { class: 'ddpviz-error', 'data-section': 'error' }, message)
  );
}

function renderSummary(model: TraceModel, name: string): HTMLElement {
  const t = model.trace;
  const meta = Object.entries(t.meta).filter(([, v]) => v !== null && v !== '');
  const el = h(
    'div',
    {
      class: 'ddpviz-summary',
      'data-section': 'summary',
      'data-ranks': model.ranks.length,
      'data-events': t.count
    },
    h('h2', {}, name),
    h(
      'p',
      {},
      `${model.ranks.length} rank${model.ranks.length === 1 ? '' : 's'} · ${t.count} events · ` +
        `${model.steps.length} iteration${model.steps.length === 1 ? '' : 's'} with a backward` +
        ` · trace format ${t.format}, event schema ${t.schema}`
    )
  );
  if (meta.length > 0) {
    const rows = meta.map(([k, v]) => {
      const text = typeof v === 'string' ? v : JSON.stringify(v);
      return h(
        'tr',
        {},
        h('th', {}, k),
        h('td', {}, text.length > 120 ? text.slice(0, 117) + '...' : text)
      );
    });
    el.append(h('table', { class: 'ddpviz-meta' }, h('tbody', {}, rows)));
  }
  if (t.truncated) {
    el.append(
      note(
        'The file ends in a torn frame: the writer stopped mid-write. Everything before it ' +
          'is shown; events after the last flush are lost.',
        'warning'
      )
    );
  }
  if (t.rejected > 0) {
    el.append(
      note(
        `${t.rejected} events did not match this viewer's event vocabulary and are not ` +
          `shown (${t.rejectReasons.join('; ')}). Update ddpviz and reload the page.`,
        'warning'
      )
    );
  }
  if (model.dropped > 0) {
    el.append(
      note(
        `The transport dropped ${model.dropped} events: what follows may be incomplete.`,
        'warning'
      )
    );
  }
  return el;
}

function renderFindings(model: TraceModel): HTMLElement | null {
  if (model.findings.length === 0) {
    return null;
  }
  const items = model.findings.map(f =>
    h(
      'li',
      { class: `ddpviz-finding ddpviz-${f.severity}`, 'data-severity': f.severity },
      h('strong', {}, `${f.severity}: `),
      f.title,
      f.ranks && f.ranks.length > 0 ? ` (${formatRanks(f.ranks)})` : '',
      f.values && f.values.length > 0
        ? h('pre', {}, f.values.map(([v, rs]) => `${formatRanks(rs)}: ${v}`).join('\n'))
        : null,
      f.fix ? h('div', { class: 'ddpviz-fix' }, f.fix) : null
    )
  );
  return section('findings', 'Findings', h('ul', {}, items));
}

function mapTitle(group: BucketMapGroup): string {
  const what = group.rebuilt
    ? `Rebuilt in gradient-ready order (from iteration ${group.step})`
    : 'Constructor map (iteration 0)';
  const n = group.buckets.reduce((k, b) => k + b.length, 0);
  return (
    `${what} · ${formatRanks(group.ranks)} · ${group.buckets.length} ` +
    `bucket${group.buckets.length === 1 ? '' : 's'} · ${n} parameters`
  );
}

function renderBuckets(model: TraceModel, options: ViewOptions): HTMLElement {
  if (model.bucketMaps.length === 0) {
    return section('buckets', 'Bucket map', note('No BucketAssigned events in this trace.'));
  }
  const params = new Map(model.params.map(p => [p.index, p]));
  const maps: HTMLElement[] = [];
  for (const rebuilt of [false, true]) {
    const groups = model.bucketMaps.filter(g => g.rebuilt === rebuilt);
    if (groups.length > 1) {
      maps.push(
        note(
          `Ranks disagree on the ${rebuilt ? 'rebuilt' : 'constructor'} bucket map ` +
            `(${groups.map(g => formatRanks(g.ranks)).join(' vs ')}): their gradients ` +
            'are all-reduced in different groupings, which hangs or corrupts training.',
          'warning'
        )
      );
    }
    for (const group of groups) {
      const buckets = group.buckets.map((indices, b) => {
        const bytes = group.bytes[b];
        const color = bucketColor(options.scheme, b);
        const segments = indices.map((i, k) => {
          const p = params.get(i);
          const label = p
            ? `param ${i} ${p.name}: (${p.shape.join(', ')}) ${p.dtype}, ${humanBytes(paramBytes(p))}`
            : `param ${i}`;
          return h('span', {
            class: 'ddpviz-param',
            'data-param': i,
            title: label,
            style:
              `flex-grow: ${p ? Math.max(paramBytes(p), 1) : 1}; background: ${color}; ` +
              `opacity: ${k % 2 === 0 ? 1 : 0.72}`
          });
        });
        const limit = group.limits[b];
        return h(
          'div',
          {
            class: 'ddpviz-bucket',
            'data-bucket': b,
            'data-params': indices.length,
            'data-bytes': bytes,
            title:
              `bucket ${b}: ${indices.length} parameters, ${humanBytes(bytes)}` +
              (limit !== undefined ? ` (limit ${humanBytes(limit)})` : ''),
            style: `flex-grow: ${Math.max(bytes, 1)}`
          },
          h('div', { class: 'ddpviz-params' }, segments),
          h(
            'div',
            { class: 'ddpviz-bucket-label' },
            `b${b} · ${indices.length} · ${humanBytes(bytes)}`
          )
        );
      });
      maps.push(
        h(
          'div',
          {
            class: 'ddpviz-bucketmap',
            'data-rebuilt': String(group.rebuilt),
            'data-ranks': group.ranks.join(','),
            'data-buckets': group.buckets.length
          },
          h('h4', {}, mapTitle(group)),
          h('div', { class: 'ddpviz-bar' }, buckets)
        )
      );
    }
  }
  return section(
    'buckets',
    'Bucket map',
    note(
      'Buckets in reduction order (bucket 0 is all-reduced first); width is gradient bytes, ' +
        'each segment one parameter (hover for name, shape, dtype).'
    ),
    maps
  );
}

function mismatchText(m: Mismatch): string {
  const what =
    m.kind === 'count'
      ? `number of ${m.name}`
      : m.kind === 'device'
        ? 'device'
        : `${m.kind} ${m.index} '${m.name}'`;
  const values = m.values.map(([v, rs]) => `  ${formatRanks(rs)}: ${v}`).join('\n');
  return `${what} differs in ${m.field}:\n${values}`;
}

function renderVerification(model: TraceModel): HTMLElement {
  const rows = model.verification.filter(r => r.status !== 'absent');
  if (rows.length === 0) {
    return section('verification', 'Verification', note('No verification events in this trace.'));
  }
  const statusText = {
    passed: 'passed',
    failed: 'failed',
    running: 'started, never finished',
    absent: 'not run'
  };
  const table = h(
    'table',
    { class: 'ddpviz-table' },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        ...['rank', 'result', 'world size', 'parameters', 'buffers', 'digest / mismatches'].map(t =>
          h('th', {}, t)
        )
      )
    ),
    h(
      'tbody',
      {},
      model.verification.map(r =>
        h(
          'tr',
          { 'data-rank': r.rank, 'data-status': r.status },
          h('td', {}, String(r.rank)),
          h(
            'td',
            {},
            h('span', { class: `ddpviz-badge ddpviz-${r.status}` }, statusText[r.status])
          ),
          h('td', {}, r.worldSize ? String(r.worldSize) : ''),
          h('td', {}, r.status === 'absent' ? '' : String(r.nParams)),
          h('td', {}, r.status === 'absent' ? '' : String(r.nBuffers)),
          h(
            'td',
            { class: 'ddpviz-mono' },
            r.status === 'failed'
              ? `${r.mismatches.length} mismatch${r.mismatches.length === 1 ? '' : 'es'}`
              : r.digest.slice(0, 16)
          )
        )
      )
    )
  );
  const seen = new Set<string>();
  const details: HTMLElement[] = [];
  for (const r of model.verification) {
    for (const m of r.mismatches) {
      const text = mismatchText(m);
      if (!seen.has(text)) {
        seen.add(text);
        details.push(h('pre', { class: 'ddpviz-mismatch', 'data-field': m.field }, text));
      }
    }
  }
  return section('verification', 'Verification', table, details);
}

function renderBroadcast(model: TraceModel): HTMLElement {
  if (model.broadcast.length === 0) {
    return section('broadcast', 'State broadcast', note('No broadcast events in this trace.'));
  }
  const rows = model.broadcast.map(b =>
    h(
      'div',
      {
        class: 'ddpviz-progress-row',
        'data-rank': b.rank,
        'data-done': b.bytesDone,
        'data-total': b.totalBytes
      },
      h('span', { class: 'ddpviz-progress-label' }, `rank ${b.rank} ← ${b.src}`),
      h('progress', { max: Math.max(b.totalBytes, 1), value: b.bytesDone }),
      h(
        'span',
        { class: 'ddpviz-progress-text' },
        `${b.chunksDone}/${b.nChunks} chunks · ${humanBytes(b.bytesDone)} of ` +
          `${humanBytes(b.totalBytes)}` +
          (b.seconds === null ? ' · unfinished' : ` · ${(b.seconds * 1000).toFixed(2)} ms`)
      )
    )
  );
  return section('broadcast', 'State broadcast', rows);
}

function renderTimelineSection(model: TraceModel, options: ViewOptions): HTMLElement {
  if (model.steps.length === 0) {
    return section('timeline', 'Hook timeline', note('No backward passes in this trace.'));
  }
  const select = h(
    'select',
    { class: 'ddpviz-step-select', 'aria-label': 'iteration' },
    model.steps.map(step => h('option', { value: step }, `iteration ${step}`))
  ) as HTMLSelectElement;
  select.value = String(model.steps[model.steps.length - 1]);
  const holder = h('div', { class: 'ddpviz-timeline-holder' });
  const draw = () => {
    holder.replaceChildren(
      renderTimeline(model.timeline(Number(select.value), options.maxEvents), options)
    );
  };
  select.addEventListener('change', draw);
  draw();
  return section(
    'timeline',
    'Hook timeline',
    h('div', { class: 'ddpviz-toolbar' }, h('label', {}, 'Show ', select)),
    holder
  );
}

const WIDTH = 960;
const LEFT = 64;
const RIGHT = 16;
const ROW = 58;

function renderTimeline(tl: Timeline, options: ViewOptions): HTMLElement {
  const span = tl.t1 - tl.t0;
  const x = (t: number) => LEFT + ((t - tl.t0) / span) * (WIDTH - LEFT - RIGHT);
  const height = tl.rows.length * ROW + 28;
  const svg = s('svg', {
    class: 'ddpviz-timeline',
    viewBox: `0 0 ${WIDTH} ${height}`,
    width: '100%',
    'data-step': tl.step,
    'data-grads': tl.rows.reduce((n, r) => n + r.grads.length, 0),
    'data-allreduces': tl.rows.reduce((n, r) => n + r.allreduces.length, 0),
    role: 'img'
  });
  let buckets = 0;
  tl.rows.forEach((row, i) => {
    const y = i * ROW + 4;
    svg.append(s('text', { x: 4, y: y + 30, class: 'ddpviz-lane-label' }, `rank ${row.rank}`));
    svg.append(
      s('line', {
        x1: LEFT,
        x2: WIDTH - RIGHT,
        y1: y + ROW - 6,
        y2: y + ROW - 6,
        class: 'ddpviz-lane-rule'
      })
    );
    for (const p of row.phases) {
      svg.append(
        s(
          'rect',
          {
            class: `ddpviz-phase ddpviz-phase-${p.name}${p.finished ? '' : ' ddpviz-unfinished'}`,
            x: x(p.start),
            y: y,
            width: Math.max(x(p.end) - x(p.start), 1),
            height: 9
          },
          s(
            'title',
            {},
            `${p.name}: ${((p.end - p.start) / 1e6).toFixed(3)} ms${p.finished ? '' : ' (unfinished)'}`
          )
        )
      );
    }
    for (const g of row.grads) {
      buckets = Math.max(buckets, g.bucket + 1);
      svg.append(
        s(
          'line',
          {
            class: 'ddpviz-grad',
            x1: x(g.t),
            x2: x(g.t),
            y1: y + 14,
            y2: y + 32,
            stroke: bucketColor(options.scheme, g.bucket),
            'data-param': g.param,
            'data-bucket': g.bucket
          },
          s(
            'title',
            {},
            `param ${g.param} ready (bucket ${g.bucket}) at ${((g.t - tl.t0) / 1e6).toFixed(3)} ms`
          )
        )
      );
    }
    for (const a of row.allreduces) {
      buckets = Math.max(buckets, a.bucket + 1);
      svg.append(
        s(
          'rect',
          {
            class: `ddpviz-allreduce${a.finished ? '' : ' ddpviz-unfinished'}`,
            x: x(a.start),
            y: y + 36,
            width: Math.max(x(a.end) - x(a.start), 2),
            height: 12,
            fill: bucketColor(options.scheme, a.bucket),
            'data-bucket': a.bucket
          },
          s(
            'title',
            {},
            `${a.name}: ${humanBytes(a.nbytes)}, ${((a.end - a.start) / 1e6).toFixed(3)} ms` +
              (a.finished ? '' : ' (never completed)')
          )
        )
      );
    }
  });
  const axisY = tl.rows.length * ROW + 8;
  for (let k = 0; k <= 4; k++) {
    const t = tl.t0 + (span * k) / 4;
    svg.append(s('line', { x1: x(t), x2: x(t), y1: axisY - 4, y2: axisY, class: 'ddpviz-axis' }));
    svg.append(
      s(
        'text',
        {
          x: x(t),
          y: axisY + 14,
          class: 'ddpviz-axis-label',
          'text-anchor': k === 0 ? 'start' : k === 4 ? 'end' : 'middle'
        },
        `${((t - tl.t0) / 1e6).toFixed(2)} ms`
      )
    );
  }
  const legend = h(
    'div',
    { class: 'ddpviz-legend' },
    h(
      'span',
      { class: 'ddpviz-legend-item' },
      h('i', { class: 'ddpviz-swatch ddpviz-phase' }),
      'forward / backward'
    ),
    h(
      'span',
      { class: 'ddpviz-legend-item' },
      'ticks: gradient hooks, bars: bucket all-reduces, coloured by bucket:'
    ),
    Array.from({ length: Math.min(buckets, 10) }, (_, b) =>
      h(
        'span',
        { class: 'ddpviz-legend-item' },
        h('i', { class: 'ddpviz-swatch', style: `background: ${bucketColor(options.scheme, b)}` }),
        `b${b}`
      )
    )
  );
  const grads = tl.rows.reduce((n, r) => n + r.grads.length, 0);
  const ars = tl.rows.reduce((n, r) => n + r.allreduces.length, 0);
  const caption = note(
    `Iteration ${tl.step}: ${grads} gradient hooks and ${ars} all-reduces on ` +
      `${tl.rows.length} rank${tl.rows.length === 1 ? '' : 's'}, ` +
      `${((tl.t1 - tl.t0) / 1e6).toFixed(2)} ms.` +
      (tl.shown < tl.total
        ? ` Showing ${tl.shown} of ${tl.total} marks (the maxEvents setting).`
        : '')
  );
  return h('div', {}, caption, svg as unknown as HTMLElement, legend);
}

function renderCounts(model: TraceModel): HTMLElement {
  const perRank = model.ranks.map(r => model.counts(r));
  const types = new Set<string>();
  perRank.forEach(c => c.forEach((_, t) => types.add(t)));
  const rows = [...types].map(t =>
    h(
      'tr',
      { 'data-type': t },
      h('th', {}, t),
      perRank.map(c => h('td', {}, String(c.get(t as never) ?? 0)))
    )
  );
  return section(
    'counts',
    'Events',
    h(
      'table',
      { class: 'ddpviz-table ddpviz-counts' },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          h('th', {}, 'event'),
          model.ranks.map(r => h('th', {}, `rank ${r}`))
        )
      ),
      h('tbody', {}, rows)
    )
  );
}
