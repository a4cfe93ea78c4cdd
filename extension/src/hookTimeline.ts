/**
 * The hook timeline panel (the viewer's twin of ddpviz/widgets/hook_timeline.py): one
 * iteration's lanes (phases, gradient hooks, all-reduces per rank) and, with many ranks, the
 * distribution across ranks with the slowest ranks named and one picked rank's lane against it
 * (see hookSpread.ts).
 */

import { bucketColor } from './colors';
import { appendAll, h, humanBytes, note, s, section, ViewOptions } from './dom';
import { Finding } from './events';
import { Timeline, TraceModel } from './eventModel';
import { formatRanges, MANY_RANKS } from './rankGroups';
import { TimelineSpread, timelineSpread } from './hookSpread';
import { selectionStatus, TIMELINE_DRAWN } from './selection';

export function renderTimelineSection(model: TraceModel, options: ViewOptions): HTMLElement {
  if (model.steps.length === 0) {
    return section('timeline', 'Hook timeline', note('No backward passes in this trace.'));
  }
  const select = h(
    'select',
    { class: 'ddpviz-step-select', 'aria-label': 'iteration' },
    model.steps.map(step => h('option', { value: step }, `iteration ${step}`))
  ) as HTMLSelectElement;
  // open where a NaN/Inf began, if the trace has such a finding; else the last iteration
  const nan = model.findings.filter(isNonfinite);
  const first = nan.length > 0 ? Math.min(...nan.map(f => f.step ?? -1)) : -1;
  select.value = String(model.steps.includes(first) ? first : model.steps[model.steps.length - 1]);
  const picks = options.picks;
  if (picks?.step !== undefined && model.steps.includes(Number(picks.step))) {
    select.value = picks.step; // what the user picked before this drawing (a live view)
  }
  const holder = h('div', { class: 'ddpviz-timeline-holder' });
  const many = model.ranks.length > MANY_RANKS;
  const rankSelect = h('select', {
    class: 'ddpviz-rank-select',
    'aria-label': 'rank drawn'
  }) as HTMLSelectElement;
  const draw = () => {
    drawLanes();
    // a bucket selected in the view is highlighted in the new drawing too (selection.ts)
    holder.dispatchEvent(new CustomEvent(TIMELINE_DRAWN, { bubbles: true }));
  };
  const drawLanes = () => {
    const step = Number(select.value);
    const origin = nanOrigin(nan, step);
    if (!many) {
      holder.replaceChildren(
        ...(origin ? [origin] : []),
        renderTimeline(model.timeline(step, options.maxEvents), options)
      );
      return;
    }
    const all = model.timelineRows(step);
    const sp = timelineSpread(all.rows, all.t0);
    const picked = rankSelect.value || picks?.rank || '';
    const named = new Set(sp.slowest.map(x => x.rank));
    rankSelect.replaceChildren();
    appendAll(rankSelect, [
      h('option', { value: 'slowest' }, 'the slowest rank'),
      sp.slowest.map(x =>
        h(
          'option',
          { value: x.rank },
          `rank ${x.rank}: last hook +${x.behindMs.toFixed(3)} ms after the median`
        )
      ),
      all.rows
        .filter(r => !named.has(r.rank))
        .map(r => h('option', { value: r.rank }, `rank ${r.rank}`))
    ]);
    const ranks = all.rows.map(r => String(r.rank));
    rankSelect.value = picked !== '' && ranks.includes(picked) ? picked : 'slowest';
    const chosen =
      rankSelect.value === 'slowest'
        ? sp.slowest.length > 0
          ? sp.slowest[0].rank
          : all.rows[0]?.rank
        : Number(rankSelect.value);
    const lanes = chosen === undefined ? [] : [chosen];
    holder.replaceChildren(
      ...(origin ? [origin] : []),
      renderTimeline(model.timeline(step, options.maxEvents, lanes), options, sp)
    );
  };
  select.addEventListener('change', () => {
    if (picks) {
      picks.step = select.value;
    }
    draw();
  });
  rankSelect.addEventListener('change', () => {
    if (picks) {
      picks.rank = rankSelect.value;
    }
    draw();
  });
  draw();
  return section(
    'timeline',
    'Hook timeline',
    h(
      'div',
      { class: 'ddpviz-toolbar' },
      h('label', {}, 'Show ', select),
      many ? h('label', {}, ' lane of ', rankSelect) : null,
      selectionStatus()
    ),
    holder
  );
}

/** A finding about where a NaN/Inf began (findings.py's nonfinite kinds). */
function isNonfinite(f: Finding): boolean {
  return f.kind === 'nonfinite_gradient' || f.kind === 'nonfinite_parameter';
}

/** Where a NaN/Inf began at this iteration: each such finding's title and per-rank values. */
function nanOrigin(findings: Finding[], step: number): HTMLElement | null {
  const here = findings.filter(f => f.step === step);
  if (here.length === 0) {
    return null;
  }
  return h(
    'div',
    { class: 'ddpviz-nan-origin' },
    here.map(f =>
      h(
        'div',
        {},
        h('strong', {}, `⚠ NaN/Inf: ${f.title}`),
        f.values && f.values.length > 0
          ? h(
              'pre',
              {},
              f.values
                .map(([v, rs]) => `rank${rs.length > 1 ? 's' : ''} ${rs.join(',')}: ${v}`)
                .join('\n')
            )
          : null
      )
    )
  );
}

const BAND = 78;

/** Many ranks: the distribution band drawn above the picked rank's lane. */
function drawSpread(svg: SVGElement, sp: TimelineSpread, xr: (t: number) => number): void {
  const ms = (t: number) => (t / 1e6).toFixed(3);
  svg.append(s('text', { x: 4, y: 14, class: 'ddpviz-lane-label' }, `${sp.nRanks} ranks`));
  svg.append(s('text', { x: 4, y: 30, class: 'ddpviz-spread-label' }, 'last hook'));
  svg.append(s('text', { x: 4, y: 50, class: 'ddpviz-spread-label' }, 'ready'));
  svg.append(s('text', { x: 4, y: 68, class: 'ddpviz-spread-label' }, 'all-reduce'));
  const e = sp.computeEnd;
  if (e !== null) {
    svg.append(
      s(
        'g',
        { class: 'ddpviz-spread-end' },
        s(
          'title',
          {},
          `last gradient hook across ${e.n} ranks (ms): min ${ms(e.min)}, p10 ${ms(e.p10)}, ` +
            `median ${ms(e.p50)}, p90 ${ms(e.p90)}, max ${ms(e.max)}`
        ),
        s('line', { x1: xr(e.min), x2: xr(e.max), y1: 26, y2: 26, class: 'ddpviz-whisker' }),
        s('rect', {
          x: xr(e.p10),
          y: 21,
          width: Math.max(xr(e.p90) - xr(e.p10), 1),
          height: 10,
          class: 'ddpviz-band'
        }),
        s('line', { x1: xr(e.p50), x2: xr(e.p50), y1: 19, y2: 33, class: 'ddpviz-median' })
      )
    );
  }
  // Per bucket: ready p10-p90 with the median tick; all-reduce from the median launch to the
  // median done, whisker over done p10-p90. Thousands of buckets stay thousands of elements
  // at most (one per bucket and row), drawn once per iteration.
  for (const b of sp.buckets) {
    const row = b.bucket & 1;
    if (b.ready !== null) {
      const r = b.ready;
      svg.append(
        s(
          'rect',
          {
            class: 'ddpviz-spread-ready',
            x: xr(r.p10),
            y: 40 + 7 * row,
            width: Math.max(xr(r.p90) - xr(r.p10), 1),
            height: 6,
            'data-bucket': b.bucket
          },
          s(
            'title',
            {},
            `bucket ${b.bucket} ready (ms): p10 ${ms(r.p10)}, median ${ms(r.p50)}, p90 ` +
              `${ms(r.p90)}; last on rank ${b.latestRank}`
          )
        )
      );
      svg.append(
        s('line', { x1: xr(r.p50), x2: xr(r.p50), y1: 38, y2: 55, class: 'ddpviz-median' })
      );
    }
    if (b.launched !== null && b.done !== null) {
      const y = 58 + 7 * row;
      svg.append(
        s(
          'rect',
          {
            class: 'ddpviz-spread-allreduce',
            x: xr(b.launched.p50),
            y,
            width: Math.max(xr(b.done.p50) - xr(b.launched.p50), 1),
            height: 6,
            'data-bucket': b.bucket
          },
          s(
            'title',
            {},
            `bucket ${b.bucket} all-reduce, median launch to median done; took (ms) median ` +
              `${b.took === null ? '-' : ms(b.took.p50)}, p90 ` +
              `${b.took === null ? '-' : ms(b.took.p90)}; done p10 ${ms(b.done.p10)} - p90 ` +
              `${ms(b.done.p90)}`
          )
        )
      );
      svg.append(
        s('line', {
          x1: xr(b.done.p10),
          x2: xr(b.done.p90),
          y1: y + 3,
          y2: y + 3,
          class: 'ddpviz-whisker'
        })
      );
    }
  }
}

const WIDTH = 960;
const LEFT = 64;
const RIGHT = 16;
const ROW = 58;
/** The drawing's geometry, for marks drawn over it (debuggerPanel.ts's park marks). */
export const TIMELINE_GEOMETRY = { width: WIDTH, left: LEFT, right: RIGHT, row: ROW };

function renderTimeline(tl: Timeline, options: ViewOptions, sp?: TimelineSpread): HTMLElement {
  const span = tl.t1 - tl.t0;
  const x = (t: number) => LEFT + ((t - tl.t0) / span) * (WIDTH - LEFT - RIGHT);
  const top = sp === undefined ? 0 : BAND;
  const height = top + tl.rows.length * ROW + 28;
  const svg = s('svg', {
    class: 'ddpviz-timeline',
    viewBox: `0 0 ${WIDTH} ${height}`,
    width: '100%',
    'data-step': tl.step,
    'data-t0': tl.t0,
    'data-t1': tl.t1,
    'data-grads': tl.rows.reduce((n, r) => n + r.grads.length, 0),
    'data-allreduces': tl.rows.reduce((n, r) => n + r.allreduces.length, 0),
    role: 'img'
  });
  if (sp !== undefined) {
    drawSpread(svg, sp, t => x(tl.t0 + t));
  }
  let buckets = 0;
  tl.rows.forEach((row, i) => {
    const y = top + i * ROW + 4;
    svg.append(
      s(
        'text',
        { x: 4, y: y + 30, class: 'ddpviz-lane-label', 'data-rank': row.rank },
        `rank ${row.rank}`
      )
    );
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
            'data-bucket': g.bucket,
            'data-rank': row.rank
          },
          s(
            'title',
            {},
            `param ${g.param} ready (bucket ${g.bucket}) at ${((g.t - tl.t0) / 1e6).toFixed(3)} ms`
          )
        )
      );
    }
    for (const g of row.summaries) {
      buckets = Math.max(buckets, g.bucket + 1);
      svg.append(
        s(
          'rect',
          {
            class: 'ddpviz-grad-summary',
            x: x(g.first),
            y: y + 14,
            width: Math.max(x(g.last) - x(g.first), 1),
            height: 18,
            fill: bucketColor(options.scheme, g.bucket),
            'fill-opacity': 0.55,
            'data-bucket': g.bucket,
            'data-rank': row.rank,
            'data-first': g.first,
            'data-last': g.last
          },
          s(
            'title',
            {},
            `bucket ${g.bucket}: ${g.nGrads} gradients ready over ` +
              `${((g.last - g.first) / 1e6).toFixed(3)} ms, ${humanBytes(g.nbytes)} ` +
              '(per-bucket summary; per-parameter hooks not recorded)'
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
            'data-bucket': a.bucket,
            'data-rank': row.rank
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
  const axisY = top + tl.rows.length * ROW + 8;
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
      'forward / backward / optimizer step (sampled steps)'
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
      `${tl.rows.length} rank${tl.rows.length === 1 ? '' : 's'}` +
      (sp === undefined ? '' : ` (the lane drawn below the distribution of ${sp.nRanks})`) +
      `, ${((tl.t1 - tl.t0) / 1e6).toFixed(2)} ms.` +
      (tl.shown < tl.total
        ? ` Showing ${tl.shown} of ${tl.total} marks (the maxEvents setting).`
        : '')
  );
  const summarized = tl.rows.filter(r => r.summaries.length > 0 && r.grads.length === 0);
  const detail =
    summarized.length === 0
      ? null
      : h(
          'p',
          { class: 'ddpviz-summary-note', 'data-ranks': summarized.map(r => r.rank).join(',') },
          summaryNote(tl.step, tl.fullSteps)
        );
  if (sp === undefined) {
    return h('div', {}, caption, detail, svg as unknown as HTMLElement, legend);
  }
  const e = sp.computeEnd;
  const slow = h(
    'p',
    {
      class: 'ddpviz-slowest',
      'data-ranks': sp.slowest.map(x => x.rank).join(',')
    },
    e === null
      ? 'No gradient hooks in this iteration.'
      : `Last gradient hook across ${e.n} ranks: median ${(e.p50 / 1e6).toFixed(3)} ms ` +
          `(p10 ${(e.p10 / 1e6).toFixed(3)}, p90 ${(e.p90 / 1e6).toFixed(3)}, max ` +
          `${(e.max / 1e6).toFixed(3)}). Slowest: ` +
          sp.slowest.map(x => `rank ${x.rank} (+${x.behindMs.toFixed(3)} ms)`).join(', ') +
          '.'
  );
  const spreadLegend = note(
    'Across ranks: last hook (box p10-p90, whisker min-max, tick median); per bucket the ' +
      'ready time p10-p90 (tick median) and the all-reduce from its median launch to its ' +
      'median done (whisker: done p10-p90). Below: the lane of the rank picked above.'
  );
  return h('div', {}, slow, caption, detail, svg as unknown as HTMLElement, spreadLegend, legend);
}

/** [0, 1, 2, 100] -> '0-2, 100'; runs of 3 or more as a-b; past `most` items '...'. */
function stepList(steps: number[], most = 8): string {
  return formatRanges(steps, { most });
}

/** The line said over a step whose gradients were recorded per bucket only. */
function summaryNote(step: number, fullSteps: number[]): string {
  const recorded =
    fullSteps.length > 0
      ? `per-parameter hooks recorded on steps ${stepList(fullSteps)}`
      : 'no step has per-parameter hooks';
  return (
    `Step ${step}: per-bucket summaries; ${recorded} (Recording(every=1): every step). ` +
    'Each bucket is drawn from its first to its last gradient ready.'
  );
}
