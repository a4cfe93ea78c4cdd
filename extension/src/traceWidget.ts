/**
 * The trace view as an anywidget: the JupyterLab viewer's components (parse, model, view) in
 * any notebook host that renders anywidget (JupyterLab, Notebook 7, marimo, VS Code, Colab).
 * The kernel sends the run as one `.ddpviz` file in a binary buffer (ddpviz/widgets/
 * trace_view.py), diagnose()'s findings and the bucket advisor's answer beside it (advice.ts),
 * never markup; a live run's new events
 * come as frames appended to it (liveTrace.ts). Everything after that, the iteration and rank
 * pickers included, runs in the browser, so the view answers while the kernel is busy; a
 * redraw (at most one per animation frame) keeps what the user picked and the scroll.
 *
 * Bundled on its own (build-widget.js) into ddpviz/widgets/static/trace_view.js: it must not
 * import JupyterLab or Lumino, which a host other than JupyterLab does not have.
 */

import { decode } from '@msgpack/msgpack';

import { adviceOf } from './advice';
import { DEFAULT_SCHEME } from './colors';
import { debuggerPanelFor, focusedField, refocus, watchDebugger } from './debuggerPanel';
import { TraceModel } from './eventModel';
import { h, note, Picks } from './dom';
import { asEvent, Finding } from './events';
import { MAX_WORLD_SIZE } from './limits';
import { LiveModel, LiveTrace, liveTraceOf } from './liveTrace';
import { dragging, kernelStatusOf } from './replay';
import { measured, measureSince } from './stages';
import { parseTraceAsync, TraceError, traceBytes } from './trace';

export { traceBytes } from './trace';
import { renderError, renderLoading, renderTrace } from './view';

/** What the view needs of anywidget's model (its AnyModel, typed here to keep it dependency-free). */
export interface WidgetModel {
  get(name: 'trace' | 'diagnosis' | 'advice'): DataView | ArrayBuffer | Uint8Array | null;
  get(name: 'name'): string;
  get(name: 'scheme'): string;
  get(name: 'max_events'): number;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

/** The most findings a diagnosis may hold (diagnose() groups its findings; a run has few). */
export const MAX_DIAGNOSIS = 4096;

/**
 * diagnose()'s findings, sent by the kernel as msgpack FindingReported events (each checked
 * as the trace's own are); null when none were sent (empty bytes); when they were sent but do
 * not read, why not (a string): the view then says that the verdict is unknown, never the
 * verdict of the ranks' own findings in its place (they hold no hang, straggler or replica
 * verdict: "healthy" there could be wrong).
 */
export function diagnosisOf(bytes: Uint8Array): Finding[] | null | string {
  if (bytes.length === 0) {
    return null;
  }
  try {
    // (a finding names up to a world of ranks; the findings themselves are counted below)
    const value = decode(bytes, {
      useBigInt64: false,
      maxArrayLength: Math.max(MAX_DIAGNOSIS, MAX_WORLD_SIZE)
    });
    if (!Array.isArray(value)) {
      throw new Error('not a list');
    }
    if (value.length > MAX_DIAGNOSIS) {
      throw new Error(`${value.length} findings, over the ${MAX_DIAGNOSIS} a view reads`);
    }
    return value.map(item => {
      const event = asEvent(item);
      if (typeof event === 'string' || event.type !== 'FindingReported') {
        throw new Error(typeof event === 'string' ? event : `a ${event.type}`);
      }
      return event.finding;
    });
  } catch (err) {
    console.warn(`ddpviz: the kernel's diagnosis does not read (${err}).`);
    return String(err instanceof Error ? err.message : err);
  }
}

/**
 * Draw the model's trace into `el`: the viewer's panels, or its error for a bad trace. The
 * trace is parsed in slices (parseTraceAsync, as the file viewer does), so a large one does
 * not freeze the page; "Reading ..." shows meanwhile. A draw started while an earlier one
 * still parses supersedes it (`isCurrent`).
 */
export async function draw(
  model: WidgetModel,
  el: HTMLElement,
  isCurrent: () => boolean = () => true
): Promise<void> {
  const name = model.get('name') || 'trace';
  const bytes = traceBytes(model.get('trace'));
  el.replaceChildren(renderLoading(name));
  if (bytes.length === 0) {
    return;
  }
  const options = {
    scheme: model.get('scheme') || DEFAULT_SCHEME,
    maxEvents: model.get('max_events') || 20000,
    drawLater: true
  };
  let content: HTMLElement;
  try {
    const start = performance.now();
    const parsed = await parseTraceAsync(bytes, name);
    measureSince('parse', start);
    if (!isCurrent()) {
      return;
    }
    const diagnosis = diagnosisOf(traceBytes(model.get('diagnosis')));
    const advice = adviceOf(traceBytes(model.get('advice')));
    const full = measured('model', () => new TraceModel(parsed));
    content = measured('panels', () => renderTrace(full, name, options, diagnosis, '', advice));
  } catch (err) {
    content = renderError(
      err instanceof TraceError
        ? err.message
        : `ddpviz: '${name}' could not be drawn: ${err}.\nLoad it in Python with ` +
            'ddpviz.Trace.load to see the full error.'
    );
  }
  if (isCurrent()) {
    el.replaceChildren(content);
  }
}

/** Elements a run was drawn into (the first drawing of a view puts some panels after paint). */
const drawnIn = new WeakSet<HTMLElement>();

/**
 * Draw what a model's live trace holds into `el`: a line on the run's state (live, how it
 * ended), the kernel's notice if any, then the viewer's panels, keeping `picks` (the user's
 * iteration and rank) and the scroll of `el` and of its panels.
 */
export function paint(live: LiveTrace, model: LiveModel, el: HTMLElement, picks: Picks): void {
  const started = performance.now();
  const name = model.get('name') || 'trace';
  const state = model.get('live') || '';
  const notice = model.get('notice') || '';
  let content: HTMLElement;
  if (live.error !== null) {
    const err = live.error;
    content = renderError(
      err instanceof TraceError
        ? err.message
        : `ddpviz: '${name}' could not be drawn: ${err}.\nLoad it in Python with ` +
            'ddpviz.Trace.load to see the full error.'
    );
  } else if (live.parsed === null) {
    content = renderLoading(name);
  } else {
    const options = {
      scheme: model.get('scheme') || DEFAULT_SCHEME,
      maxEvents: model.get('max_events') || 20000,
      picks,
      drawLater: !drawnIn.has(el)
    };
    drawnIn.add(el);
    const diagnosis = diagnosisOf(traceBytes(model.get('diagnosis')));
    const advice = adviceOf(traceBytes(model.get('advice')));
    const kernel = kernelStatusOf(model.get('status'));
    const parsed = live.parsed;
    const full = measured('model', () => new TraceModel(parsed));
    content = measured('panels', () =>
      renderTrace(full, name, options, diagnosis, state, advice, kernel)
    );
  }
  const lines = [
    state === ''
      ? null
      : h(
          'p',
          { class: 'ddpviz-live', 'data-live': state, 'data-events': live.total },
          state === 'running'
            ? `Live: ${live.total.toLocaleString('en')} events so far; new ones are added ` +
                'as the ranks send them.'
            : `The run ended (${state}): ${live.total.toLocaleString('en')} events.`
        ),
    live.total < model.get('events_sent')
      ? note(
          `Showing ${live.total.toLocaleString('en')} of the ` +
            `${model.get('events_sent').toLocaleString('en')} events the kernel sent: the ` +
            'rest is asked of the kernel (a page reloaded, a saved notebook), which answers ' +
            'when it is not busy with a cell.',
          'warning'
        )
      : null,
    notice === '' ? null : note(notice, 'warning')
  ].filter((x): x is HTMLElement => x !== null);
  const scroll = scrolled(el);
  // a debugger's panel above the run's panels, the park marked in them (debuggerPanel.ts)
  const panel = debuggerPanelFor(model, picks, content, live.parsed?.clock);
  const focus = focusedField(el);
  el.replaceChildren(...lines, ...(panel === null ? [] : [panel]), content);
  refocus(el, focus);
  measured('scroll', () => restore(el, scroll));
  el.dataset.drawMs = (performance.now() - started).toFixed(1);
  el.dataset.draws = String(Number(el.dataset.draws || 0) + 1);
  el.dataset.events = String(live.total);
}

/** Where `el` and its scrollable parts are scrolled to, by a key that survives a redraw. */
function scrolled(el: HTMLElement): Map<string, [number, number]> {
  const out = new Map<string, [number, number]>([['', [el.scrollTop, el.scrollLeft]]]);
  el.querySelectorAll<HTMLElement>('[data-section], .ddpviz-timeline-holder').forEach(e => {
    if (e.scrollTop !== 0 || e.scrollLeft !== 0) {
      out.set(scrollKey(e), [e.scrollTop, e.scrollLeft]);
    }
  });
  return out;
}

function restore(el: HTMLElement, scroll: Map<string, [number, number]>): void {
  const [top, left] = scroll.get('') ?? [0, 0];
  if (scroll.size === 1 && top === 0 && left === 0) {
    return; // nothing was scrolled: setting a scroll position would lay the page out now
  }
  el.scrollTop = top;
  el.scrollLeft = left;
  el.querySelectorAll<HTMLElement>('[data-section], .ddpviz-timeline-holder').forEach(e => {
    const at = scroll.get(scrollKey(e));
    if (at !== undefined) {
      [e.scrollTop, e.scrollLeft] = at;
    }
  });
}

function scrollKey(e: HTMLElement): string {
  return e.dataset.section ?? e.className;
}

const nextFrame: (f: () => void) => number =
  typeof requestAnimationFrame === 'function'
    ? f => requestAnimationFrame(f)
    : f => setTimeout(f, 16) as unknown as number;

function render({ model, el }: { model: LiveModel; el: HTMLElement }): () => void {
  el.classList.add('ddpviz-viewer', 'ddpviz-widget');
  const live = liveTraceOf(model);
  const picks: Picks = {}; // this view's own: another view of the model picks its own
  let pending = false;
  let gone = false;
  const redraw = () => {
    pending = false;
    if (!gone && dragging(picks)) {
      pending = true; // a replay control is being dragged: a redraw now would end the drag
      setTimeout(redraw, 100);
    } else if (!gone) {
      paint(live, model, el, picks);
    }
  };
  const schedule = () => {
    if (!pending) {
      pending = true; // at most one redraw per animation frame, however many updates came
      nextFrame(redraw);
    }
  };
  const unsubscribe = live.subscribe(schedule);
  const unwatch = watchDebugger(model, el, picks, () => live.parsed?.clock, schedule);
  redraw();
  return () => {
    gone = true;
    unsubscribe();
    unwatch();
  };
}

export default { render };
