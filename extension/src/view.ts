/**
 * The trace viewer's DOM: a summary, findings, replica agreement (replicas.ts), the bucket map,
 * verification results, broadcast progress, the hook timeline of one iteration, who made the
 * all-reduce wait, the bucket advisor's answer where a kernel sent it (advice.ts) and event
 * counts, rendered from a TraceModel.
 * Plain DOM and SVG (no plotting library), so a trace opens fast and with no kernel. With many
 * ranks (more than MANY_RANKS) ranks in the same state share one row labelled with their rank
 * ranges, and the hook timeline draws distributions across ranks with the slowest named and
 * one picked rank's lane against them.
 */

import { Advice, renderAdvice } from './advice';
import { bucketBar } from './bucketBar';
import { Finding, Mismatch } from './events';
import { h, humanBytes, note, section, ViewOptions } from './dom';
import { BroadcastRow, BucketMapGroup, TraceModel } from './eventModel';
import { formatRanges, MANY_RANKS, spread, valueGroups } from './rankGroups';
import { renderTimelineSection } from './hookTimeline';
import { renderTraceActions } from './perfetto';
import { renderReplicas } from './replicas';
import { measured } from './stages';
import { KernelStatus, mountReplay } from './replay';
import { linkSelection, selectionStatus } from './selection';
import { waitRows } from './straggler';
import { reportedLine, verdict, verdictLine } from './verdict';
import { renderVerificationMatrix } from './verificationMatrix';
import { zoomable } from './zoom';

export { humanBytes } from './dom';
export type { ViewOptions } from './dom';

/** [3] -> "rank 3"; [0, 1, 2] -> "ranks 0,1,2"; runs of 4 or more as "a-b" (as findings.py). */
export function formatRanks(ranks: number[]): string {
  if (ranks.length === 0) {
    return 'no rank';
  }
  return (ranks.length === 1 ? 'rank ' : 'ranks ') + formatRanges(ranks, { run: 4, sep: ',' });
}

/**
 * Render a whole trace.
 *
 * @param model - the trace's model.
 * @param name - the file name shown as the title.
 * @param options - colour scheme and event limit.
 * @param diagnosis - diagnose()'s findings, where a kernel sent them; null: the ranks' own
 *   (no kernel); a string: a kernel sent them and they did not read (why).
 * @param live - "running" while a live run goes on, then how it ended; "": not live.
 * @param advice - the bucket advisor's answer a kernel sent (advice.ts's adviceOf); null:
 *   none (the file viewer, which has no kernel, says where to get it).
 * @param kernel - a live view's status from its kernel (replay.ts's kernelStatusOf), or null.
 */
export function renderTrace(
  model: TraceModel,
  name: string,
  options: ViewOptions,
  sent: Finding[] | null | string = null,
  live = '',
  advice: Advice | string | null = null,
  kernel: KernelStatus | null = null
): HTMLElement {
  // the replay cursor and the other picks live in options.picks (a view's own if none)
  const picks = options.picks ?? {};
  const opts: ViewOptions = { ...options, picks };
  const root = h('div', { class: 'ddpviz-trace' });
  const diagnosis = typeof sent === 'string' ? null : sent;
  // the panels, of the model as of the replay's cursor (replay.ts): down to the hook
  // timeline, then those below it
  const first = (m: TraceModel) => [
    guarded('verdict', 'Verdict', () => renderVerdict(m, sent, live)),
    guarded('summary', 'Summary', () => renderSummary(m, name)),
    guarded('findings', 'Findings', () => renderFindings(diagnosis ?? m.findings)),
    guarded('replicas', 'Replicas', () => renderReplicas(diagnosis ?? m.findings)),
    guarded('buckets', 'Bucket map', () => renderBuckets(m, opts)),
    guarded('verification', 'Verification', () => renderVerification(m)),
    guarded('broadcast', 'State broadcast', () => renderBroadcast(m)),
    guarded('timeline', 'Hook timeline', () => renderTimelineSection(m, opts))
  ];
  const rest = (m: TraceModel) => [
    guarded('waits', 'Who made the all-reduce wait', () => renderWaits(m)),
    guarded('advice', 'Bucket advice', () => renderAdvice(advice, m, opts, live)),
    guarded('counts', 'Events', () => renderCounts(m))
  ];
  let later = options.drawLater === true;
  mountReplay(root, model, picks, live, kernel, m => {
    const drawn = first(m).filter(isElement);
    if (!later || drawn.length === 0) {
      root.dataset.panels = 'all';
      return [...drawn, ...rest(m).filter(isElement)];
    }
    // The first drawing: the panels below the timeline (a wait table folded from every
    // launch, the advice, the counts) come after the first paint, so the screen the view
    // opens on shows sooner. (Only the first: a redraw that dropped them for a frame would
    // shorten the page under a user scrolled down to them.)
    later = false;
    const anchor = drawn[drawn.length - 1];
    root.dataset.panels = 'first';
    afterPaint(() => {
      const holder = anchor.parentElement;
      // (else the view was drawn again meanwhile: a live view's next drawing replaced this
      // one, or the replay drew every panel again)
      if (root.parentNode !== null && holder !== null && anchor.nextSibling === null) {
        holder.append(...rest(m).filter(isElement));
        root.dataset.panels = 'all';
      }
    });
    return drawn;
  });
  // a bucket highlights its parameters in the maps and the timeline (kept in picks; one
  // picked before this drawing, a live view's, is picked again: after the panels are drawn)
  linkSelection(root, picks);
  return root;
}

function isElement(el: HTMLElement | null): el is HTMLElement {
  return el !== null;
}

type PostTask = (fn: () => void, options: { priority: string }) => Promise<void>;

/**
 * Call `fn` once the page has painted what it holds now: in a task after the next frame, of
 * background priority where the browser has `scheduler.postTask` (input and the page's other
 * tasks go first).
 */
function afterPaint(fn: () => void): void {
  const scheduler = (globalThis as { scheduler?: { postTask?: PostTask } }).scheduler;
  const later = () => {
    if (typeof scheduler?.postTask === 'function') {
      void scheduler.postTask(fn, { priority: 'background' });
    } else {
      setTimeout(fn, 0);
    }
  };
  if (typeof requestAnimationFrame === 'function') {
    requestAnimationFrame(later);
  } else {
    later();
  }
}

/**
 * One panel; if drawing it throws (a malformed trace that decoding let through), a warning
 * in its place instead of a blank viewer: the other panels still draw.
 */
function guarded(kind: string, title: string, draw: () => HTMLElement | null): HTMLElement | null {
  try {
    return measured(`panel:${kind}`, draw);
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

/** Shown while a trace is being read (large ones take a few seconds). */
export function renderLoading(name: string): HTMLElement {
  return h(
    'div',
    { class: 'ddpviz-trace' },
    h('p', { class: 'ddpviz-loading', 'data-section': 'loading' }, `Reading ${name}...`)
  );
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
    renderTraceActions(t, name),
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

/**
 * The verdict first, as `ddpviz diagnose` and the report lead with theirs. With `diagnosis`
 * (diagnose()'s findings, computed in a kernel: the TraceView widget), of those; else of the
 * findings the ranks reported while the job ran (what this file holds), said as such, since
 * diagnose reads more from the events (hangs, stragglers, replica checks) than a viewer
 * without a kernel: none of those is "healthy", only "no problems reported by the ranks". A
 * diagnosis that was sent and did not read (a string: why) gives no verdict at all. `live`
 * "running": a run still going, whose verdict is one so far.
 */
function renderVerdict(
  model: TraceModel,
  diagnosis: Finding[] | null | string,
  live: string
): HTMLElement {
  if (typeof diagnosis === 'string') {
    return h(
      'div',
      {
        class: 'ddpviz-verdict',
        'data-section': 'verdict',
        'data-verdict': 'unknown',
        'data-scope': 'unreadable',
        'data-live': live || undefined
      },
      h('strong', {}, 'verdict unknown: '),
      `diagnose()'s findings came with this view but did not read here (${diagnosis}). ` +
        'Run `ddpviz diagnose` on the run for them; the findings below are only those the ' +
        'ranks reported while the job ran.'
    );
  }
  const severities = (diagnosis ?? model.findings).map(f => f.severity);
  const running = live === 'running';
  return h(
    'div',
    {
      class: 'ddpviz-verdict',
      'data-section': 'verdict',
      'data-verdict': verdict(severities),
      'data-scope': diagnosis !== null ? 'diagnose' : 'reported',
      'data-live': live || undefined
    },
    running ? h('em', { class: 'ddpviz-so-far' }, 'So far: ') : null,
    h('strong', {}, diagnosis !== null ? verdictLine(severities) : reportedLine(severities)),
    ' ',
    h(
      'span',
      { class: 'ddpviz-verdict-scope' },
      diagnosis !== null
        ? running
          ? 'What `ddpviz diagnose` finds in the events received so far (in Python, again ' +
            "every few seconds while the run goes on): the ranks' own findings, hangs, " +
            'stragglers and replica checks.'
          : 'What `ddpviz diagnose` finds in this run (in Python, when this view was made' +
            (live ? ' and when the run ended' : '') +
            "): the ranks' own findings, hangs, stragglers and replica checks."
        : 'Of the findings the ranks reported while the job ran; `ddpviz diagnose` on the ' +
            "run's folder also reads hangs, stragglers and replica checks from the events."
    )
  );
}

function renderFindings(findings: Finding[]): HTMLElement | null {
  if (findings.length === 0) {
    return null;
  }
  const items = findings.map(f =>
    h(
      'li',
      { class: `ddpviz-finding ddpviz-${f.severity}`, 'data-severity': f.severity },
      h('strong', {}, `${f.severity}: `),
      f.title,
      f.ranks && f.ranks.length > 0 ? ` (${formatRanks(f.ranks)})` : '',
      f.values && f.values.length > 0
        ? h('pre', {}, f.values.map(([v, rs]) => `${formatRanks(rs)}: ${v}`).join('\n'))
        : null,
      // further lines: where each rank is in code (its stack), the likely cause and sizes
      // (replicas_diverged), the backend's error, as findings.py prints them
      f.detail && f.detail.length > 0
        ? h('pre', { class: 'ddpviz-finding-detail' }, f.detail.join('\n'))
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
      maps.push(
        h(
          'div',
          {
            class: 'ddpviz-bucketmap',
            'data-rebuilt': String(group.rebuilt),
            'data-step': group.step,
            'data-ranks': group.ranks.join(','),
            'data-buckets': group.buckets.length
          },
          h('h4', {}, mapTitle(group)),
          zoomable(
            bucketBar(group.buckets, group.bytes, group.limits, params, options),
            `${group.rebuilt ? 'rebuilt' : 'constructor'} ${group.ranks.join(',')}`,
            options.picks
          )
        )
      );
    }
  }
  return section(
    'buckets',
    'Bucket map',
    note(
      'Buckets in reduction order (bucket 0 is all-reduced first); width is gradient bytes, ' +
        'each segment one parameter (hover for name, shape, dtype; zoom in with + or ' +
        'Ctrl + wheel where segments are too thin). Click a bucket (or a gradient mark in ' +
        'the hook timeline) to highlight its parameters in every map, the timeline and the ' +
        'verification matrix; click a parameter row of the matrix to highlight that one.'
    ),
    selectionStatus(),
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
  // parameter x rank: is the model the same on every rank? (verificationMatrix.ts)
  const matrix = renderVerificationMatrix(model);
  const rows = model.verification.filter(r => r.status !== 'absent');
  if (rows.length === 0) {
    return section(
      'verification',
      'Verification',
      matrix,
      note('No verification events in this trace.')
    );
  }
  const statusText = {
    passed: 'passed',
    failed: 'failed',
    running: 'started, never finished',
    absent: 'not run'
  };
  const many = model.verification.length > MANY_RANKS;
  // Many ranks: one row per group of ranks with the same outcome (the lowest rank's row shown).
  const groups = valueGroups(
    model.verification.map(r => [r.rank, r] as [number, typeof r]),
    r =>
      JSON.stringify([r.status, r.worldSize, r.nParams, r.nBuffers, r.digest, r.mismatches.length])
  ).sort((a, b) => a.ranks[0] - b.ranks[0]);
  const shown = many
    ? groups.map(g => ({ row: g.value, label: `${g.label} (${g.ranks.length})`, ranks: g.ranks }))
    : model.verification.map(r => ({ row: r, label: String(r.rank), ranks: [r.rank] }));
  const table = h(
    'table',
    { class: 'ddpviz-table', 'data-grouped': String(many) },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        ...[
          many ? 'ranks' : 'rank',
          'result',
          'world size',
          'parameters',
          'buffers',
          'digest / mismatches'
        ].map(t => h('th', {}, t))
      )
    ),
    h(
      'tbody',
      {},
      shown.map(({ row: r, label, ranks }) =>
        h(
          'tr',
          {
            'data-rank': r.rank,
            'data-ranks': many ? label : undefined,
            'data-count': ranks.length,
            'data-status': r.status
          },
          h('td', {}, label),
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
  return section('verification', 'Verification', matrix, table, details);
}

function broadcastText(b: BroadcastRow, withTime = true): string {
  return (
    `${b.chunksDone}/${b.nChunks} chunks · ${humanBytes(b.bytesDone)} of ` +
    `${humanBytes(b.totalBytes)}` +
    (b.seconds === null
      ? ' · unfinished'
      : withTime
        ? ` · ${(b.seconds * 1000).toFixed(2)} ms`
        : '')
  );
}

function renderBroadcast(model: TraceModel): HTMLElement {
  if (model.broadcast.length === 0) {
    return section('broadcast', 'State broadcast', note('No broadcast events in this trace.'));
  }
  if (model.broadcast.length > MANY_RANKS) {
    return renderBroadcastGroups(model.broadcast);
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
      h('span', { class: 'ddpviz-progress-text' }, broadcastText(b))
    )
  );
  return section('broadcast', 'State broadcast', rows);
}

/** Many ranks: percentiles of progress, then one bar per group of ranks in the same state. */
function renderBroadcastGroups(rows: BroadcastRow[]): HTMLElement {
  const fraction = (b: BroadcastRow) => (b.totalBytes > 0 ? b.bytesDone / b.totalBytes : 1);
  const done = spread(rows.map(b => fraction(b) * 100));
  const times = spread(rows.filter(b => b.seconds !== null).map(b => (b.seconds ?? 0) * 1000));
  const pct = (x: number) => `${x.toFixed(0)}%`;
  const summary =
    done === null
      ? ''
      : `Done across ${done.n} ranks: min ${pct(done.min)}, p10 ${pct(done.p10)}, median ` +
        `${pct(done.p50)}, p90 ${pct(done.p90)}, max ${pct(done.max)}` +
        (times === null
          ? ''
          : ` · took (ms, ${times.n} finished): median ${times.p50.toFixed(2)}, p90 ` +
            `${times.p90.toFixed(2)}, max ${times.max.toFixed(2)}`);
  const groups = valueGroups(
    rows.map(b => [b.rank, b] as [number, BroadcastRow]),
    b =>
      JSON.stringify([
        b.src,
        b.src === b.rank,
        b.totalBytes,
        b.nChunks,
        b.chunksDone,
        b.bytesDone,
        b.seconds === null
      ])
  ).sort((a, b) => fraction(b.value) - fraction(a.value) || a.ranks[0] - b.ranks[0]);
  const bars = groups.map(g =>
    h(
      'div',
      {
        class: 'ddpviz-progress-row',
        'data-ranks': g.label,
        'data-count': g.ranks.length,
        'data-done': g.value.bytesDone,
        'data-total': g.value.totalBytes
      },
      h(
        'span',
        { class: 'ddpviz-progress-label', title: `ranks ${g.label}` },
        `${g.ranks.length} × ranks ${g.label.length > 40 ? g.label.slice(0, 39) + '…' : g.label}` +
          ` ← ${g.value.src}`
      ),
      h('progress', { max: Math.max(g.value.totalBytes, 1), value: g.value.bytesDone }),
      h('span', { class: 'ddpviz-progress-text' }, broadcastText(g.value, g.ranks.length === 1))
    )
  );
  return section(
    'broadcast',
    'State broadcast',
    h('p', { class: 'ddpviz-broadcast-summary' }, summary),
    bars
  );
}

/** ns for people, as ddpviz.units.human_duration: '2.35 s', '12.3 ms', '45 µs'. */
function duration(ns: number): string {
  const sec = ns / 1e9;
  if (sec >= 1 || sec === 0) {
    return sec < 100 ? `${sec.toFixed(2)} s` : `${sec.toFixed(0)} s`;
  }
  return sec >= 1e-3
    ? `${Number((sec * 1e3).toPrecision(3))} ms`
    : `${Number((sec * 1e6).toPrecision(3))} µs`;
}

/**
 * Rank x bucket: in how many recorded steps each rank launched each bucket's all-reduce last,
 * and how long the others waited for it (straggler.ts). Above MANY_RANKS, the ranks that caused
 * most wait get a row each and the others share one.
 */
function renderWaits(model: TraceModel): HTMLElement {
  const fold = model.waits();
  if (fold.steps === 0) {
    return section(
      'waits',
      'Who made the all-reduce wait',
      note(
        "No step with every rank's all-reduce launches in this trace (they come with " +
          "watch's guard, or on the steps Recording.every samples)."
      )
    );
  }
  const rows = waitRows(fold);
  const peak = Math.max(1, ...rows.flatMap(r => r.waitNs));
  const body = rows.map(r =>
    h(
      'tr',
      { 'data-ranks': r.ranks.join(',') },
      h('th', {}, (r.others ? 'other ' : '') + formatRanks(r.ranks)),
      r.nLast.map((n, j) => {
        const shade = Math.round(235 - (150 * r.waitNs[j]) / peak);
        return h(
          'td',
          { style: `background: rgb(255, ${shade}, ${shade})`, 'data-last': n },
          n ? `${n} · ${duration(r.waitNs[j])}` : ''
        );
      })
    )
  );
  return section(
    'waits',
    'Who made the all-reduce wait',
    h(
      'table',
      { class: 'ddpviz-table ddpviz-waits-table' },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          h('th', {}, 'rank'),
          fold.buckets.map(b => h('th', {}, `b${b}`))
        )
      ),
      h('tbody', {}, body)
    ),
    note(
      `${fold.steps} steps with every rank's launches; cell: steps in which the rank ` +
        'launched the bucket last · total time the others waited for it; ' +
        `${fold.unsure} bucket-steps within the clock uncertainty ` +
        `(+-${duration(fold.maxError)} a rank) attributed to nobody.`
    )
  );
}

function renderCounts(model: TraceModel): HTMLElement {
  const counted = model.ranks.map(r => model.counts(r));
  const types = new Set<string>();
  counted.forEach(c => c.forEach((_, t) => types.add(t)));
  // Many ranks: one column per group of ranks with the same counts.
  const many = model.ranks.length > MANY_RANKS;
  const groups = valueGroups(
    model.ranks.map((r, i) => [r, counted[i]] as [number, (typeof counted)[number]]),
    c => JSON.stringify([...types].map(t => c.get(t as never) ?? 0))
  ).sort((a, b) => a.ranks[0] - b.ranks[0]);
  const perRank = many ? groups.map(g => g.value) : counted;
  const heads = many
    ? groups.map(g => (g.ranks.length === 1 ? `rank ${g.label}` : `ranks ${g.label}`))
    : model.ranks.map(r => `rank ${r}`);
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
          heads.map(t => h('th', {}, t))
        )
      ),
      h('tbody', {}, rows)
    )
  );
}
