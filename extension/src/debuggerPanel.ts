/**
 * The debugger panel of a TraceView with a debugger (ddpviz/widgets/debugger_wire.py): the
 * status line, the buttons pause / resume / step bucket / step step / abort, the break row,
 * the break set, the inspect row, the message line, the last inspect's table (ranks side by
 * side) and what the last resume or step printed. It draws the kernel's `debugger_state`
 * (JSON data, never markup: every string is written as text through h()) and sends commands
 * as `{kind: 'debugger', op, ...}` messages, which the kernel checks and carries out with the
 * Debugger's own functions.
 *
 * With a debugger, a click on a bucket in the hook timeline or the bucket map also sets a
 * break before that bucket's all-reduce at the step in the break row; while the ranks are
 * parked the timeline marks where (`g.ddpviz-stop` per lane, the bucket's hooks outlined:
 * `rect.ddpviz-stop-bucket`) and the bucket map outlines the bucket (`ddpviz-stop-bucket`).
 */

import { h, Picks, s } from './dom';
import { TIMELINE_GEOMETRY } from './hookTimeline';
import { TIMELINE_DRAWN } from './selection';

/** Where one rank is parked (its own monotonic clock). */
export interface RankPark {
  rank: number;
  step: number;
  point: string;
  bucket: number;
  t_ns: number;
  reason: string;
}

export interface StopState {
  step: number;
  point: string;
  bucket: number;
  where: string;
  agreed: boolean;
  text: string;
  groups: { step: number; point: string; bucket: number; ranks: number[]; label: string }[];
  ranks: RankPark[];
  params: string[];
}

export interface InspectResult {
  title: string;
  all_equal: boolean;
  columns: string[];
  rows: string[][];
  notes: string[];
}

/** The kernel's debugger state (debugger_wire.DebuggerWire.state). */
export interface DebuggerState {
  status: string;
  stopped: boolean;
  agreed: boolean;
  stop: StopState | null;
  breaks_text: string;
  next_step: number;
  params: string[];
  message: string;
  error: boolean;
  result: InspectResult | null;
  output: string;
}

/** The most characters of debugger state read (the kernel bounds every part far below). */
const MAX_STATE = 8 << 20;

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function str(x: unknown): string {
  return typeof x === 'string' ? x : '';
}

function int(x: unknown, otherwise = 0): number {
  return typeof x === 'number' && Number.isSafeInteger(x) ? x : otherwise;
}

function strings(x: unknown): string[] {
  return Array.isArray(x) ? x.filter((v): v is string => typeof v === 'string') : [];
}

/** The model's `debugger_state`, read and checked; null when the view has no debugger. */
export function debuggerStateOf(text: unknown): DebuggerState | null {
  if (typeof text !== 'string' || text === '' || text.length > MAX_STATE) {
    return null;
  }
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return null;
  }
  if (!isObject(v)) {
    return null;
  }
  const stop = isObject(v.stop) ? v.stop : null;
  const result = isObject(v.result) ? v.result : null;
  return {
    status: str(v.status),
    stopped: v.stopped === true,
    agreed: v.agreed === true,
    stop:
      stop === null
        ? null
        : {
            step: int(stop.step),
            point: str(stop.point),
            bucket: int(stop.bucket, -1),
            where: str(stop.where),
            agreed: stop.agreed === true,
            text: str(stop.text),
            groups: (Array.isArray(stop.groups) ? stop.groups : []).filter(isObject).map(g => ({
              step: int(g.step),
              point: str(g.point),
              bucket: int(g.bucket, -1),
              ranks: (Array.isArray(g.ranks) ? g.ranks : []).map(r => int(r, -1)),
              label: str(g.label)
            })),
            ranks: (Array.isArray(stop.ranks) ? stop.ranks : []).filter(isObject).map(r => ({
              rank: int(r.rank, -1),
              step: int(r.step),
              point: str(r.point),
              bucket: int(r.bucket, -1),
              t_ns: int(r.t_ns),
              reason: str(r.reason)
            })),
            params: strings(stop.params)
          },
    breaks_text: str(v.breaks_text),
    next_step: int(v.next_step),
    params: strings(v.params),
    message: str(v.message),
    error: v.error === true,
    result:
      result === null
        ? null
        : {
            title: str(result.title),
            all_equal: result.all_equal === true,
            columns: strings(result.columns),
            rows: (Array.isArray(result.rows) ? result.rows : []).map(strings),
            notes: strings(result.notes)
          },
    output: str(v.output)
  };
}

/** What the user typed or chose in the panel, kept across redraws (per view). */
export interface DebuggerInputs {
  step?: string;
  where?: string;
  bucket?: string;
  name?: string;
  what?: string;
  inspectBucket?: string;
}

const INPUTS = new WeakMap<Picks, DebuggerInputs>();

/** The panel's inputs of the view whose picks these are. */
export function inputsOf(picks: Picks): DebuggerInputs {
  let inputs = INPUTS.get(picks);
  if (inputs === undefined) {
    inputs = {};
    INPUTS.set(picks, inputs);
  }
  return inputs;
}

export type Send = (message: Record<string, unknown>) => void;

const WHERE: [string, string][] = [
  ['bucket', "before bucket's all-reduce"],
  ['forward', 'before forward'],
  ['after_backward', 'after backward (all-reduced)'],
  ['optimizer_step', 'after optimizer step']
];
const WHAT = [
  'value',
  'grad',
  'grad_before_allreduce',
  'bucket_buffer',
  'bucket_grads',
  'optimizer_state'
];

const RED = '#b42318';
const AMBER = '#8a5300';
const GREEN = '#1a7f37';

/** The step a break row sets: what the user typed, else the kernel's next_step()+1. */
function breakStep(state: DebuggerState, inputs: DebuggerInputs): string {
  return inputs.step ?? String(state.next_step);
}

function button(label: string, tip: string, send: Send, op: string, extra = ''): HTMLElement {
  const b = h(
    'button',
    { type: 'button', class: `ddpviz-debugger-button ${extra}`.trim(), title: tip, 'data-op': op },
    label
  );
  b.addEventListener('click', () => send({ kind: 'debugger', op }));
  return b;
}

function select(
  options: [string, string][],
  value: string,
  label: string,
  change: (v: string) => void
): HTMLSelectElement {
  const el = h(
    'select',
    { 'aria-label': label },
    options.map(([v, text]) => h('option', { value: v }, text))
  ) as HTMLSelectElement;
  el.value = value;
  el.addEventListener('change', () => change(el.value));
  return el;
}

function input(attrs: Record<string, string>, value: string, change: (v: string) => void) {
  const el = h('input', attrs) as HTMLInputElement;
  el.value = value;
  el.addEventListener('input', () => change(el.value));
  return el;
}

/** An integer field's value for a command (NaN-free: the kernel refuses what is not one). */
function asInt(text: string): number | string {
  const t = text.trim();
  return /^\d{1,15}$/.test(t) ? Number(t) : t;
}

/** The panel for `state`; `inputs` keeps what the user typed, `send` carries commands. */
export function renderDebuggerPanel(
  state: DebuggerState,
  inputs: DebuggerInputs,
  send: Send
): HTMLElement {
  const stop = state.stop;
  const color = stop === null ? '#555' : stop.agreed ? GREEN : AMBER;
  const status = h(
    'div',
    {
      class: 'ddpviz-debugger-status',
      'data-stopped': String(state.stopped),
      style: 'font-size:12px;background:rgb(127 127 127 / 10%);padding:3px 6px;border-radius:3px'
    },
    h('b', {}, 'debugger'),
    ' · ',
    h('span', { style: `color:${color}` }, state.status),
    stop !== null && stop.text !== ''
      ? h('div', { class: 'ddpviz-debugger-where' }, stop.text)
      : null
  );
  const buttons = h(
    'div',
    { class: 'ddpviz-debugger-buttons', style: 'display:flex;gap:4px;margin:4px 0' },
    button('pause', 'stop every rank at the next step', send, 'pause'),
    button('resume', 'let every rank go on', send, 'resume'),
    button('step bucket', "go on to before the next bucket's all-reduce", send, 'step_bucket'),
    button('step step', 'go on to before the next forward', send, 'step_step'),
    button('abort', 'end every rank (traces saved)', send, 'abort')
  );
  const step = input(
    {
      type: 'number',
      min: '0',
      class: 'ddpviz-debugger-step',
      'aria-label': 'break step',
      style: 'width:90px'
    },
    breakStep(state, inputs),
    v => (inputs.step = v)
  );
  const where = select(WHERE, inputs.where ?? 'bucket', 'break where', v => (inputs.where = v));
  const bucket = input(
    {
      type: 'number',
      min: '0',
      class: 'ddpviz-debugger-bucket',
      'aria-label': 'break bucket',
      style: 'width:70px'
    },
    inputs.bucket ?? '0',
    v => (inputs.bucket = v)
  );
  const breakAt = h('button', { type: 'button', 'data-op': 'break_at' }, 'break at');
  breakAt.addEventListener('click', () => {
    const at = inputs.where ?? 'bucket';
    send({
      kind: 'debugger',
      op: 'break_at',
      step: asInt(breakStep(state, inputs)),
      where: at,
      ...(at === 'bucket' ? { bucket: asInt(inputs.bucket ?? '0') } : {})
    });
  });
  const breakRow = h(
    'div',
    { class: 'ddpviz-debugger-break', style: 'display:flex;gap:4px;align-items:center' },
    h('label', {}, 'step ', step),
    where,
    h('label', {}, 'bucket ', bucket),
    breakAt,
    button('clear breaks', 'remove every break', send, 'clear')
  );
  const breaks = h(
    'div',
    { class: 'ddpviz-debugger-breaks', style: 'font-size:11px;color:#555' },
    `breaks: ${state.breaks_text || 'none'}`
  );
  const listId = `ddpviz-params-${Math.random().toString(36).slice(2, 10)}`;
  const name = input(
    {
      type: 'text',
      list: listId,
      placeholder: 'parameter name',
      'aria-label': 'parameter name',
      class: 'ddpviz-debugger-name',
      style: 'width:220px'
    },
    inputs.name ?? '',
    v => (inputs.name = v)
  );
  const names = h(
    'datalist',
    { id: listId },
    state.params.map(p => h('option', { value: p }))
  );
  const what = select(
    WHAT.map(w => [w, w.replace(/_/g, ' ')]),
    inputs.what ?? 'grad',
    'inspect what',
    v => (inputs.what = v)
  );
  const inspectBucket = input(
    {
      type: 'number',
      min: '0',
      'aria-label': 'inspect bucket',
      class: 'ddpviz-debugger-inspect-bucket',
      style: 'width:70px'
    },
    inputs.inspectBucket ?? '0',
    v => (inputs.inspectBucket = v)
  );
  const inspect = h('button', { type: 'button', 'data-op': 'inspect' }, 'inspect');
  inspect.addEventListener('click', () => {
    const w = inputs.what ?? 'grad';
    send(
      w === 'bucket_buffer' || w === 'bucket_grads'
        ? { kind: 'debugger', op: 'inspect', what: w, bucket: asInt(inputs.inspectBucket ?? '0') }
        : { kind: 'debugger', op: 'inspect', what: w, name: inputs.name ?? '' }
    );
  });
  const inspectRow = h(
    'div',
    {
      class: 'ddpviz-debugger-inspect',
      style: 'display:flex;gap:4px;align-items:center;margin-top:4px'
    },
    name,
    names,
    what,
    h('label', {}, 'bucket ', inspectBucket),
    inspect
  );
  const message =
    state.message === ''
      ? null
      : h(
          'div',
          {
            class: `ddpviz-debugger-message${state.error ? ' ddpviz-debugger-error' : ''}`,
            style: `font-size:12px;white-space:pre-wrap;color:${state.error ? RED : '#555'}`
          },
          state.message
        );
  return h(
    'section',
    { class: 'ddpviz-section ddpviz-debugger', 'data-section': 'debugger' },
    status,
    buttons,
    breakRow,
    breaks,
    inspectRow,
    message,
    state.result === null ? null : renderResult(state.result),
    state.output === ''
      ? null
      : h(
          'pre',
          {
            class: 'ddpviz-debugger-output',
            style: 'font-size:11px;max-height:240px;overflow:auto;margin:4px 0'
          },
          state.output
        )
  );
}

/** The last inspect: a row per rank (or per group), the verdict, the notes. */
function renderResult(r: InspectResult): HTMLElement {
  const [verdict, ...notes] = r.notes;
  return h(
    'div',
    { class: 'ddpviz-debugger-result', style: 'font-size:12px;margin-top:4px' },
    h('b', {}, r.title),
    h(
      'table',
      { style: 'font-size:11px' },
      h(
        'tr',
        {},
        r.columns.map(c => h('th', { style: 'text-align:left' }, c))
      ),
      r.rows.map(row =>
        h(
          'tr',
          {},
          row.map(cell => h('td', { style: 'font-family:monospace;white-space:pre' }, cell))
        )
      )
    ),
    verdict === undefined
      ? null
      : h('div', { style: `color:${r.all_equal ? GREEN : RED}` }, verdict),
    notes.map(n => h('div', {}, n))
  );
}

/**
 * Make a click on a bucket (an all-reduce, a gradient mark or a bucket summary of the hook
 * timeline, or a bucket of the bucket map) set a break before that bucket's all-reduce at the
 * break row's step, while the view has a debugger (`state()` not null). Linked selection
 * (selection.ts) still answers the same click.
 */
export function listenForBucketClicks(
  el: HTMLElement,
  state: () => DebuggerState | null,
  inputs: DebuggerInputs,
  send: Send
): void {
  el.addEventListener('click', event => {
    const now = state();
    const target = event.target as Element | null;
    if (now === null || target === null) {
      return;
    }
    const hit =
      target.closest('.ddpviz-bucketmap .ddpviz-bucket') ??
      target.closest('svg.ddpviz-timeline [data-bucket]');
    if (hit === null || !el.contains(hit) || hit.closest('.ddpviz-advice')) {
      return;
    }
    const bucket = Number(hit.getAttribute('data-bucket'));
    if (!Number.isSafeInteger(bucket) || bucket < 0) {
      return;
    }
    inputs.where = 'bucket';
    inputs.bucket = String(bucket);
    send({
      kind: 'debugger',
      op: 'break_at',
      step: asInt(breakStep(now, inputs)),
      where: 'bucket',
      bucket,
      clicked: true
    });
  });
}

/**
 * Mark where the ranks are parked in the views under `root` (none: clear every mark): on the
 * hook timeline drawn at the stop's step (or, for a stop before a forward, at the latest
 * step drawn before it) a mark per lane at the rank's park time (aligned with `clock`, the
 * trace's offsets) and the bucket's hooks outlined; in the bucket maps in effect, the bucket.
 */
export function markStop(
  root: HTMLElement,
  state: DebuggerState | null,
  clock: Map<number, [number, number]>
): void {
  root.querySelectorAll('.ddpviz-stop, .ddpviz-stop-bucket, .ddpviz-paused').forEach(m => {
    if (m.classList.contains('ddpviz-bucket')) {
      m.classList.remove('ddpviz-stop-bucket');
      (m as HTMLElement).style.outline = '';
    } else {
      m.remove();
    }
  });
  const stop = state?.stop ?? null;
  if (stop === null) {
    return;
  }
  const label =
    stop.agreed || stop.groups.length === 0
      ? stop.where
      : `${stop.where} (${stop.groups[0].label})`;
  root.querySelectorAll<SVGElement>('svg.ddpviz-timeline').forEach(svg => {
    const drawn = Number(svg.getAttribute('data-step'));
    const holder = svg.closest('[data-section="timeline"]');
    const steps = [...(holder?.querySelectorAll('.ddpviz-step-select option') ?? [])].map(o =>
      Number(o.getAttribute('value'))
    );
    const latest = steps.length > 0 ? Math.max(...steps) : drawn;
    if (drawn !== stop.step && !(drawn < stop.step && drawn === latest)) {
      return;
    }
    markTimeline(svg, stop, clock, drawn === stop.step);
    const paused = h(
      'p',
      { class: 'ddpviz-paused', style: `color:${AMBER};font-size:12px;margin:2px 0` },
      `⏸ paused at ${label}` +
        (drawn === stop.step ? '' : ` (drawn: step ${drawn}, the last one run)`)
    );
    svg.parentElement?.insertBefore(paused, svg);
  });
  if (stop.point !== 'bucket') {
    return;
  }
  const maps = [...root.querySelectorAll('.ddpviz-bucketmap')].filter(
    m => !m.closest('.ddpviz-advice')
  );
  const rebuilt = maps.filter(
    m =>
      m.getAttribute('data-rebuilt') === 'true' && Number(m.getAttribute('data-step')) <= stop.step
  );
  const inForce = rebuilt.length > 0 ? rebuilt : maps.filter(m => !rebuilt.includes(m));
  for (const map of inForce) {
    map.querySelectorAll<HTMLElement>(`.ddpviz-bucket[data-bucket="${stop.bucket}"]`).forEach(b => {
      b.classList.add('ddpviz-stop-bucket');
      b.style.outline = `2px solid ${AMBER}`;
    });
  }
}

function markTimeline(
  svg: SVGElement,
  stop: StopState,
  clock: Map<number, [number, number]>,
  atStep: boolean
): void {
  const { width, left, right, row } = TIMELINE_GEOMETRY;
  const t0 = Number(svg.getAttribute('data-t0'));
  const t1 = Number(svg.getAttribute('data-t1'));
  const x = (t: number) => {
    const at = t1 > t0 ? left + ((t - t0) / (t1 - t0)) * (width - left - right) : width - right;
    return Math.min(Math.max(at, left), width - right);
  };
  for (const park of stop.ranks) {
    const lane = svg.querySelector(`.ddpviz-lane-label[data-rank="${park.rank}"]`);
    if (lane === null) {
      continue;
    }
    const y = Number(lane.getAttribute('y')) - 30; // the lane's top (hookTimeline.ts)
    const t = park.t_ns + (clock.get(park.rank)?.[0] ?? 0);
    const at = atStep && park.t_ns > 0 ? x(t) : width - right;
    const g = s(
      'g',
      {
        class: 'ddpviz-stop',
        'data-rank': park.rank,
        'data-step': park.step,
        'data-point': park.point,
        'data-stop-bucket': park.bucket
      },
      s('title', {}, `rank ${park.rank} parked at step ${park.step}, ${park.point}`),
      s('line', {
        x1: at,
        x2: at,
        y1: y - 2,
        y2: y + row - 6,
        stroke: AMBER,
        'stroke-width': 2,
        'stroke-dasharray': '4 2'
      }),
      s('path', { d: `M${at - 5} ${y - 6} L${at + 5} ${y - 6} L${at} ${y}`, fill: AMBER })
    );
    svg.append(g);
    if (park.point === 'bucket' && atStep) {
      const hooks = [
        ...svg.querySelectorAll(
          `[data-rank="${park.rank}"][data-bucket="${park.bucket}"]:is(.ddpviz-grad, ` +
            '.ddpviz-grad-summary)'
        )
      ];
      const xs = hooks.flatMap(m =>
        m.tagName === 'line'
          ? [Number(m.getAttribute('x1'))]
          : [
              Number(m.getAttribute('x')),
              Number(m.getAttribute('x')) + Number(m.getAttribute('width'))
            ]
      );
      const lo = xs.length > 0 ? Math.min(...xs) : at - 3;
      const hi = xs.length > 0 ? Math.max(...xs) : at;
      svg.append(
        s('rect', {
          class: 'ddpviz-stop-bucket',
          'data-rank': park.rank,
          'data-bucket': park.bucket,
          x: lo - 2,
          y: y + 12,
          width: Math.max(hi - lo + 4, 4),
          height: 22,
          fill: 'none',
          stroke: AMBER,
          'stroke-width': 1.5,
          'pointer-events': 'none'
        })
      );
    }
  }
}

/** What a view's model gives the panel (anywidget's model; typed loosely on purpose). */
interface DebuggedModel {
  get(name: never): unknown;
  on(event: string, callback: (...args: any[]) => void): void;
  off(event: string, callback: (...args: any[]) => void): void;
  send?(content: unknown, callbacks?: unknown, buffers?: ArrayBuffer[]): void;
}

function stateIn(model: DebuggedModel): DebuggerState | null {
  return debuggerStateOf((model.get as (name: string) => unknown).call(model, 'debugger_state'));
}

function sender(model: DebuggedModel): Send {
  return message => model.send?.(message);
}

/**
 * The debugger panel of `model`'s view (null: the view has no debugger), with the park
 * marked in `content` (the run's panels, drawn with `clock`'s offsets).
 */
export function debuggerPanelFor(
  model: DebuggedModel,
  picks: Picks,
  content: HTMLElement,
  clock: Map<number, [number, number]> | undefined
): HTMLElement | null {
  const state = stateIn(model);
  if (state === null) {
    return null;
  }
  markStop(content, state, clock ?? new Map());
  return renderDebuggerPanel(state, inputsOf(picks), sender(model));
}

/** The panel's focused field (by its label) and caret, to give back after a redraw. */
export function focusedField(el: HTMLElement): [string, number | null] | null {
  const active = document.activeElement;
  if (
    !(active instanceof HTMLElement) ||
    !el.contains(active) ||
    !active.closest('.ddpviz-debugger')
  ) {
    return null;
  }
  const label = active.getAttribute('aria-label');
  const caret = active instanceof HTMLInputElement ? active.selectionStart : null;
  return label === null ? null : [label, caret];
}

export function refocus(el: HTMLElement, focus: [string, number | null] | null): void {
  if (focus === null) {
    return;
  }
  const field = [...el.querySelectorAll<HTMLElement>('.ddpviz-debugger [aria-label]')].find(
    f => f.getAttribute('aria-label') === focus[0]
  );
  field?.focus();
  if (field instanceof HTMLInputElement && focus[1] !== null) {
    try {
      field.setSelectionRange(focus[1], focus[1]);
    } catch {
      // (a number field has no caret to set)
    }
  }
}

/**
 * Follow a view's debugger: `redraw` on each change of its state, clicks on buckets set
 * breaks, and a timeline redrawn (another iteration picked) is marked again. Returns what
 * stops it.
 */
export function watchDebugger(
  model: DebuggedModel,
  el: HTMLElement,
  picks: Picks,
  clock: () => Map<number, [number, number]> | undefined,
  redraw: () => void
): () => void {
  model.on('change:debugger_state', redraw);
  listenForBucketClicks(el, () => stateIn(model), inputsOf(picks), sender(model));
  const remark = () => {
    const state = stateIn(model);
    if (state !== null) {
      markStop(el, state, clock() ?? new Map());
    }
  };
  el.addEventListener(TIMELINE_DRAWN, remark);
  return () => {
    model.off('change:debugger_state', redraw);
    el.removeEventListener(TIMELINE_DRAWN, remark);
  };
}
