/**
 * Replay in the browser and the status line: the view's twin of ddpviz/widgets/
 * replay_controls.py and the dashboard's status header. A bar at the top of the view holds
 * "follow live" (live runs only), an iteration control (-1 = the constructor, then 0..last)
 * and a time slider of TIME_TICKS ticks over the run's span on the aligned clock, with a
 * readout. Moving either turns follow off: the time slider picks an instant (and the
 * iteration going on then); the iteration control jumps to the end of that iteration and the
 * hook timeline shows it (`Picks.step`). Every panel is then drawn from a model of the events
 * with aligned time <= the instant on each rank (`modelAt`, linear in the events; the full
 * model stands for "everything"). The cursor lives in the view's `picks` (`Picks.replay`), so
 * it survives a live view's redraws. All in the browser: it answers while the kernel is busy.
 */

import { DDPEvent, EventType } from './events';
import { h, Picks, ReplayCursor } from './dom';
import { TraceModel } from './eventModel';
import { formatRanges } from './rankGroups';
import { measured } from './stages';
import { TIMELINE_DRAWN } from './selection';
import { ParsedTrace } from './trace';

/** Positions of the time slider over the whole run (as replay_controls.TIME_TICKS). */
export const TIME_TICKS = 1000;
/** The step of every event the constructor emits. */
export const CONSTRUCTION = -1;

export type { ReplayCursor } from './dom';

/** The status header's phase after each event type (ddpviz/model/phases.py PHASES.status). */
export const STATUS_OF: Partial<Record<EventType, string>> = {
  ParamsBuilt: 'parameters built',
  VerificationStarted: 'verifying',
  VerificationPassed: 'verified',
  VerificationFailed: 'verification failed',
  BroadcastStarted: 'broadcasting',
  BroadcastChunkSent: 'broadcasting',
  BroadcastChunkDone: 'broadcasting',
  BroadcastFinished: 'broadcast done',
  BucketAssigned: 'buckets assigned',
  ForwardStarted: 'forward',
  BuffersSynced: 'forward',
  BucketsRebuilt: 'forward',
  BackwardStarted: 'backward',
  GradReady: 'backward',
  GradsSummarized: 'backward',
  BucketReady: 'backward',
  AllReduceLaunched: 'backward',
  AllReduceDone: 'backward',
  UnusedParametersFound: 'backward',
  BackwardComputed: 'backward',
  BackwardFinished: 'after backward',
  OptimizerStepStarted: 'optimizer step',
  OptimizerStepFinished: 'after optimizer step'
};

/** The debugger's traffic: counted, never part of DDP's life (event_model.DEBUGGER_EVENTS). */
const DEBUGGER_EVENTS = new Set<EventType>([
  'DebugArmed',
  'Parked',
  'Unparked',
  'Inspected',
  'Fetched',
  'CodeRan',
  'StacksTaken',
  'DebugRefused'
]);

/** The constructor's events whose latest says its phase (event_model._phases_at). */
const CONSTRUCTION_PHASED = new Set<EventType>([
  'ParamsBuilt',
  'VerificationStarted',
  'VerificationPassed',
  'VerificationFailed',
  'BroadcastStarted',
  'BroadcastFinished',
  'BucketAssigned',
  'BroadcastChunkSent'
]);

/** Whether `rank` has debugger events (most runs have none: no event is then looked up). */
function hasDebuggerEvents(model: TraceModel, rank: number): boolean {
  for (const type of DEBUGGER_EVENTS) {
    if (model.ofType(rank, type).length > 0) {
      return true;
    }
  }
  return false;
}

/** Each iteration's first and last instant over all ranks, and the run's span (aligned ns). */
export class ReplayIndex {
  constructor(readonly model: TraceModel) {
    for (const rank of model.ranks) {
      const offset = model.trace.clock.get(rank)?.[0] ?? 0; // (model.aligned's, once a rank)
      let step = NaN;
      let b: [number, number] | undefined;
      const debugged = hasDebuggerEvents(model, rank);
      for (const e of model.events(rank)) {
        if (debugged && DEBUGGER_EVENTS.has(e.type)) {
          continue;
        }
        const t = e.t_ns + offset;
        if (e.step !== step) {
          step = e.step; // (a rank's events come step after step: one lookup a step)
          b = this.bounds.get(step);
          if (b === undefined) {
            b = [t, t];
            this.bounds.set(step, b);
          }
        }
        const bounds = b as [number, number];
        bounds[0] = Math.min(bounds[0], t);
        bounds[1] = Math.max(bounds[1], t);
      }
    }
    for (const [, [t0, t1]] of this.bounds) {
      this.t0 = Math.min(this.t0, t0);
      this.t1 = Math.max(this.t1, t1);
    }
    this.starts = [...this.bounds.entries()]
      .map(([s, b]) => [b[0], s] as [number, number])
      .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    this.steps = [...this.bounds.keys()].filter(s => s >= 0).sort((a, b) => a - b);
  }

  /** step -> [first, last] aligned ns over all ranks. */
  readonly bounds = new Map<number, [number, number]>();
  t0 = Infinity;
  t1 = -Infinity;
  /** Iterations with at least one event (not the constructor's). */
  readonly steps: number[];
  private readonly starts: [number, number][];

  /** Whether there are events to replay. */
  get empty(): boolean {
    return !Number.isFinite(this.t0);
  }

  /** The iteration going on at `t`: the latest started by then; null before any event. */
  stepAt(t: number): number | null {
    let out: number | null = null;
    for (const [start, step] of this.starts) {
      if (start > t) {
        break;
      }
      out = out === null ? step : Math.max(out, step);
    }
    return out;
  }

  /** The instant `tick` (0..TIME_TICKS) of the slider stands for. */
  timeOf(tick: number): number {
    return this.t0 + Math.floor(((this.t1 - this.t0) * tick) / TIME_TICKS);
  }

  /** The slider's tick nearest to `t`. */
  tickOf(t: number): number {
    if (this.t1 <= this.t0) {
      return TIME_TICKS;
    }
    const tick = Math.round(((t - this.t0) * TIME_TICKS) / (this.t1 - this.t0));
    return Math.max(0, Math.min(TIME_TICKS, tick));
  }
}

/** `trace` with each rank's events up to aligned time `asOf` (linear; arrays are new). */
export function trimTrace(trace: ParsedTrace, asOf: number): ParsedTrace {
  const byRank = new Map<number, DDPEvent[]>();
  let count = 0;
  for (const [rank, events] of trace.byRank) {
    const offset = trace.clock.get(rank)?.[0] ?? 0;
    const kept = events.filter(e => e.t_ns + offset <= asOf);
    count += kept.length;
    byRank.set(rank, kept);
  }
  return { ...trace, byRank, count };
}

const indexes = new WeakMap<TraceModel, ReplayIndex>();
const trimmed = new WeakMap<TraceModel, { asOf: number; count: number; model: TraceModel }>();

/** The full model's replay index (computed once per model). */
export function indexOf(full: TraceModel): ReplayIndex {
  let index = indexes.get(full);
  if (index === undefined) {
    index = new ReplayIndex(full);
    indexes.set(full, index);
  }
  return index;
}

/** The model as of aligned time `asOf` (null, or after the last event: `full` itself). */
export function modelAt(full: TraceModel, asOf: number | null): TraceModel {
  const index = indexOf(full);
  if (asOf === null || index.empty || asOf >= index.t1) {
    return full;
  }
  const cached = trimmed.get(full);
  if (cached !== undefined && cached.asOf === asOf && cached.count === full.trace.count) {
    return cached.model;
  }
  const model = new TraceModel(trimTrace(full.trace, asOf));
  trimmed.set(full, { asOf, count: full.trace.count, model });
  return model;
}

/** Each rank's phase and iteration (event_model.status: its latest; at `asOf`: _phases_at). */
export function phasesAt(
  full: TraceModel,
  asOf: number | null
): { phases: Map<number, string>; steps: Map<number, number> } {
  const phases = new Map<number, string>();
  const steps = new Map<number, number>();
  for (const rank of full.ranks) {
    if (asOf === null) {
      // the latest event's phase (of those that say one), the highest iteration
      const events = full.events(rank);
      const debugged = hasDebuggerEvents(full, rank);
      let phase = 'waiting';
      for (let i = events.length - 1; i >= 0; i--) {
        const said = STATUS_OF[events[i].type];
        if (said !== undefined && !(debugged && DEBUGGER_EVENTS.has(events[i].type))) {
          phase = said;
          break;
        }
      }
      let step = CONSTRUCTION;
      for (const e of events) {
        if (e.step > step && !(debugged && DEBUGGER_EVENTS.has(e.type))) {
          step = e.step;
        }
      }
      phases.set(rank, phase);
      steps.set(rank, step);
      continue;
    }
    const events = full.events(rank).filter(e => !DEBUGGER_EVENTS.has(e.type));
    // an iteration counts from its first event on this rank (StepRecord.first)
    const first = new Map<number, number>();
    for (const e of events) {
      if (e.step >= 0 && !first.has(e.step)) {
        first.set(e.step, full.aligned(e));
      }
    }
    const started = [...first.entries()].filter(([, t]) => t <= asOf).map(([s]) => s);
    const step = started.length > 0 ? Math.max(...started) : CONSTRUCTION;
    steps.set(rank, step);
    if (step >= 0) {
      let phase = 'forward';
      let ended = false;
      for (const e of events) {
        if (e.step !== step || full.aligned(e) > asOf) {
          continue;
        }
        if (e.type === 'BackwardFinished') {
          ended = true;
        } else if (e.type === 'BackwardStarted') {
          phase = 'backward';
        }
      }
      phases.set(rank, ended ? 'after backward' : phase);
      continue;
    }
    let latest: DDPEvent | null = null;
    let at = -Infinity;
    for (const e of events) {
      const t = full.aligned(e);
      if (e.step < 0 && CONSTRUCTION_PHASED.has(e.type) && t <= asOf && t >= at) {
        latest = e;
        at = t;
      }
    }
    phases.set(rank, latest === null ? 'waiting' : (STATUS_OF[latest.type] ?? 'started'));
  }
  return { phases, steps };
}

/** What only the kernel knows of a live run (TraceView's `status` trait: trace_feed.py). */
export interface KernelStatus {
  label: string;
  runStatus: string;
  world: number | null;
  /** Ranks that sent events, and those that said goodbye (null: the kernel cannot tell). */
  connected: number | null;
  finished: number | null;
  dropped: number;
  rejected: number;
  lost: number;
}

function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : 0;
}

function text(value: unknown): string {
  return typeof value === 'string' ? value.slice(0, 200) : '';
}

/** The kernel's status trait, checked; null when there is none (not a live view). */
export function kernelStatusOf(value: unknown): KernelStatus | null {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return null;
  }
  const v = value as Record<string, unknown>;
  if (typeof v.run_status !== 'string') {
    return null;
  }
  const known = typeof v.connected === 'number';
  return {
    label: text(v.label),
    runStatus: text(v.run_status),
    world: typeof v.world === 'number' && v.world > 0 ? v.world : null,
    connected: known ? count(v.connected) : null,
    finished: known ? count(v.finished) : null,
    dropped: count(v.dropped),
    rejected: count(v.rejected),
    lost: count(v.lost)
  };
}

function ranksLabel(ranks: number[]): string {
  return (ranks.length === 1 ? 'rank ' : 'ranks ') + formatRanges(ranks, { run: 4, sep: ',' });
}

/** "ranks 0-3 backward; rank 4 broadcasting": ranks grouped by phase, in rank order. */
export function phaseGroups(phases: Map<number, string>): string {
  const groups = new Map<string, number[]>();
  for (const [rank, phase] of [...phases.entries()].sort((a, b) => a[0] - b[0])) {
    const g = groups.get(phase) ?? [];
    g.push(rank);
    groups.set(phase, g);
  }
  return [...groups.entries()].map(([p, rs]) => `${ranksLabel(rs)} ${p}`).join('; ');
}

/** Spans of the steps shorter than this give no rate (a few events 10 ns apart in a file
 * written by hand read as billions of events a second). */
const MIN_RATE_SPAN_NS = 10e6;

/** Events in the iterations a second (over the steps, as a finished run's status rate); 0
 * over a span too short to say a rate. */
function eventsPerSecond(model: TraceModel): number {
  const index = indexOf(model);
  let inSteps = 0;
  let start = Infinity;
  for (const rank of model.ranks) {
    const debugged = hasDebuggerEvents(model, rank);
    for (const e of model.events(rank)) {
      if (e.step >= 0 && !(debugged && DEBUGGER_EVENTS.has(e.type))) {
        inSteps++;
      }
    }
  }
  for (const [s, b] of index.bounds) {
    if (s >= 0) {
      start = Math.min(start, b[0]);
    }
  }
  if (index.empty || index.t1 - index.t0 < MIN_RATE_SPAN_NS) {
    return 0;
  }
  if (Number.isFinite(start) && index.t1 - start >= MIN_RATE_SPAN_NS) {
    return inSteps / ((index.t1 - start) / 1e9);
  }
  return Number.isFinite(start) ? 0 : model.trace.count / ((index.t1 - index.t0) / 1e9);
}

/**
 * The status line: the kernel's part (source, run status, ranks connected and finished,
 * dropped / rejected / lost) and what the model at the cursor says (phases, iterations,
 * events). Without a kernel status: "N of W ranks in the trace".
 */
export function renderStatusLine(
  full: TraceModel,
  shown: TraceModel,
  asOf: number | null,
  kernel: KernelStatus | null
): HTMLElement {
  const world =
    kernel?.world ??
    (shown.verification.reduce((n, v) => Math.max(n, v.worldSize), 0) || full.ranks.length);
  const { phases, steps } = phasesAt(full, asOf);
  const parts: (HTMLElement | string)[] = [];
  if (kernel !== null) {
    if (kernel.label) {
      parts.push(h('strong', {}, kernel.label));
    }
    if (kernel.runStatus) {
      parts.push(h('span', { class: 'ddpviz-status-run' }, `run ${kernel.runStatus}`));
    }
  }
  if (kernel !== null && kernel.connected !== null) {
    parts.push(
      h(
        'span',
        { class: 'ddpviz-status-ranks' },
        `${kernel.connected} of ${world} ranks connected, ${kernel.finished ?? 0} finished`
      )
    );
  } else {
    parts.push(
      h(
        'span',
        { class: 'ddpviz-status-ranks' },
        `${full.ranks.length} of ${world} ranks in the trace`
      )
    );
  }
  if (phases.size > 0) {
    parts.push(h('span', { class: 'ddpviz-status-phases' }, `phase: ${phaseGroups(phases)}`));
  }
  const iters = [...new Set(steps.values())].sort((a, b) => a - b);
  if (iters.length > 0) {
    const top = iters[iters.length - 1];
    parts.push(
      h(
        'span',
        { class: 'ddpviz-status-steps' },
        'iteration ' +
          (top < 0 ? 'constructor' : iters.length === 1 ? `${top}` : `${iters[0]}-${top}`)
      )
    );
  }
  const rate = eventsPerSecond(shown);
  parts.push(
    h(
      'span',
      { class: 'ddpviz-status-events' },
      `${shown.trace.count.toLocaleString('en')} events` +
        (rate > 0 ? ` (${Math.round(rate).toLocaleString('en')} events/s over the steps)` : '')
    )
  );
  const dropped = Math.max(shown.dropped, kernel?.dropped ?? 0);
  const rejected = Math.max(shown.trace.rejected, kernel?.rejected ?? 0);
  const lost = kernel?.lost ?? 0;
  const bad = dropped > 0 || rejected > 0 || lost > 0;
  parts.push(
    h(
      'span',
      {
        class: `ddpviz-status-losses${bad ? ' ddpviz-status-bad' : ''}`,
        'data-dropped': dropped,
        'data-rejected': rejected,
        'data-lost': lost
      },
      `${dropped.toLocaleString('en')} dropped · ${rejected.toLocaleString('en')} rejected` +
        (lost > 0 ? ` · ${lost.toLocaleString('en')} lost` : '')
    )
  );
  const line = h('div', {
    class: 'ddpviz-status',
    role: 'status',
    'data-ranks': full.ranks.length,
    'data-world': world,
    'data-connected': kernel?.connected ?? undefined,
    'data-finished': kernel?.finished ?? undefined,
    'data-run-status': kernel?.runStatus || undefined
  });
  parts.forEach((p, i) => {
    if (i > 0) {
      line.append(' · ');
    }
    line.append(p);
  });
  return line;
}

/** A drag longer than this is taken as over (a release outside the page never came). */
const MAX_DRAG_MS = 10_000;

/** Whether a replay control of the view is being dragged (a host holds its redraws). */
export function dragging(picks: Picks): boolean {
  const started = picks.replay?.dragStarted;
  return started !== undefined && performance.now() - started < MAX_DRAG_MS;
}

const nextFrame: (f: () => void) => void =
  typeof requestAnimationFrame === 'function'
    ? f => void requestAnimationFrame(f)
    : f => void setTimeout(f, 16);

function ms(ns: number): string {
  return (ns / 1e6).toLocaleString('en', { maximumFractionDigits: 1, minimumFractionDigits: 1 });
}

/**
 * Fill `root` with the replay bar, the status line and the panels `draw` makes of the model
 * at the cursor; moving a control redraws the status line and panels (at most once per
 * animation frame), never the bar.
 *
 * @param root - the view's element.
 * @param full - the model of everything received.
 * @param picks - the view's picks: the cursor is kept in `picks.replay`.
 * @param live - "running" while a live run goes on (then "follow live" shows), else "".
 * @param kernel - the kernel's status of a live run, or null.
 * @param draw - the panels of a model.
 */
export function mountReplay(
  root: HTMLElement,
  full: TraceModel,
  picks: Picks,
  live: string,
  kernel: KernelStatus | null,
  draw: (model: TraceModel) => HTMLElement[]
): void {
  const index = indexOf(full);
  const running = live === 'running';
  const cursor: ReplayCursor = picks.replay ?? { follow: running, step: null, asOf: null };
  if (!running && cursor.follow) {
    cursor.follow = false; // the run ended while followed: everything
  }
  picks.replay = cursor;
  const top = index.steps.length > 0 ? index.steps[index.steps.length - 1] : CONSTRUCTION;

  const follow = h('input', {
    type: 'checkbox',
    class: 'ddpviz-replay-follow'
  }) as HTMLInputElement;
  follow.checked = cursor.follow;
  const stepInput = h('input', {
    type: 'range',
    class: 'ddpviz-replay-step',
    min: CONSTRUCTION,
    max: top,
    step: 1,
    'aria-label': 'replay iteration'
  }) as HTMLInputElement;
  const timeInput = h('input', {
    type: 'range',
    class: 'ddpviz-replay-time',
    min: 0,
    max: TIME_TICKS,
    step: 1,
    'aria-label': 'replay time'
  }) as HTMLInputElement;
  const readout = h('span', { class: 'ddpviz-replay-readout', 'aria-live': 'polite' });
  const bar = h(
    'div',
    { class: 'ddpviz-replay' },
    running ? h('label', {}, follow, ' follow live') : null,
    h('label', {}, 'iteration ', stepInput),
    h('label', {}, 'time ', timeInput),
    readout
  );
  const status = h('div', { class: 'ddpviz-status-holder' });
  const panels = h('div', { class: 'ddpviz-panels' });
  root.append(bar, status, panels);
  if (index.empty) {
    stepInput.disabled = timeInput.disabled = true;
  }

  const shownStep = (): number => (cursor.follow || cursor.step === null ? top : cursor.step);
  const asOf = (): number | null => (cursor.follow ? null : cursor.asOf);

  const syncBar = () => {
    stepInput.value = String(shownStep());
    const at = asOf();
    timeInput.value = String(at === null ? TIME_TICKS : index.tickOf(at));
    follow.checked = cursor.follow;
    const where = shownStep() === CONSTRUCTION ? 'constructor' : `iteration ${shownStep()}`;
    readout.textContent = index.empty
      ? 'no events yet'
      : cursor.follow
        ? `live · ${ms(index.t1 - index.t0)} ms so far`
        : `t = ${(((at ?? index.t1) - index.t0) / 1e6).toLocaleString('en', {
            minimumFractionDigits: 3,
            maximumFractionDigits: 3
          })} ms of ${ms(index.t1 - index.t0)} ms · ${where}`;
    bar.dataset.follow = String(cursor.follow);
    bar.dataset.step = String(shownStep());
    bar.dataset.asOf = at === null ? '' : String(at);
    bar.dataset.tick = timeInput.value;
  };

  let drawn = 0;
  const redraw = () => {
    const at = asOf();
    const model = modelAt(full, at);
    status.replaceChildren(measured('status', () => renderStatusLine(full, model, at, kernel)));
    panels.replaceChildren(...draw(model));
    panels.dataset.asOf = at === null ? '' : String(at);
    panels.dataset.step = String(shownStep());
    panels.dataset.events = String(model.trace.count);
    panels.dataset.draws = String(++drawn);
    // the selection (selection.ts, on the root) is applied again to the new panels
    panels.dispatchEvent(new CustomEvent(TIMELINE_DRAWN, { bubbles: true }));
  };
  let pending = false;
  const schedule = () => {
    syncBar();
    if (!pending) {
      pending = true; // a drag redraws at most once per animation frame
      nextFrame(() => {
        pending = false;
        redraw();
      });
    }
  };

  const seekStep = (step: number) => {
    cursor.follow = false;
    cursor.step = step;
    const b = index.bounds.get(step);
    cursor.asOf = b === undefined ? null : b[1];
    if (step >= 0) {
      picks.step = String(step); // the hook timeline shows that iteration
    }
    schedule();
  };
  const seekTime = (tick: number) => {
    cursor.follow = false;
    cursor.asOf = index.timeOf(tick);
    const step = index.stepAt(cursor.asOf);
    if (step !== null) {
      cursor.step = step;
      if (step >= 0) {
        picks.step = String(step);
      }
    }
    schedule();
  };
  bar.addEventListener('pointerdown', event => {
    if ((event.target as Element | null)?.closest('input[type="range"]')) {
      cursor.dragStarted = performance.now();
      const end = () => {
        cursor.dragStarted = undefined;
        document.removeEventListener('pointerup', end);
        document.removeEventListener('pointercancel', end);
      };
      document.addEventListener('pointerup', end);
      document.addEventListener('pointercancel', end);
    }
  });
  stepInput.addEventListener('input', () => seekStep(Number(stepInput.value)));
  timeInput.addEventListener('input', () => seekTime(Number(timeInput.value)));
  follow.addEventListener('change', () => {
    if (follow.checked) {
      cursor.follow = true;
      cursor.asOf = null;
      cursor.step = null;
      schedule();
    } else {
      seekStep(shownStep());
    }
  });
  syncBar();
  redraw();
}
