/**
 * The trace view as an anywidget: the JupyterLab viewer's components (parse, model, view) in
 * any notebook host that renders anywidget (JupyterLab, Notebook 7, marimo, VS Code, Colab).
 * The kernel sends the run as one `.ddpviz` file in a binary buffer (ddpviz/widgets/
 * trace_view.py), and diagnose()'s findings beside it, never markup; everything after that, the iteration and rank pickers
 * included, runs in the browser, so the view answers while the kernel is busy.
 *
 * Bundled on its own (build-widget.js) into ddpviz/widgets/static/trace_view.js: it must not
 * import JupyterLab or Lumino, which a host other than JupyterLab does not have.
 */

import { decode } from '@msgpack/msgpack';

import { DEFAULT_SCHEME } from './colors';
import { TraceModel } from './eventModel';
import { asEvent, Finding } from './events';
import { parseTraceAsync, TraceError, traceBytes } from './trace';

export { traceBytes } from './trace';
import { renderError, renderLoading, renderTrace } from './view';

/** What the view needs of anywidget's model (its AnyModel, typed here to keep it dependency-free). */
export interface WidgetModel {
  get(name: 'trace' | 'diagnosis'): DataView | ArrayBuffer | Uint8Array | null;
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
 * as the trace's own are); null when none were sent (empty bytes) or they do not read, so the
 * view says the ranks' reported findings instead, labelled as such, never a wrong verdict.
 */
export function diagnosisOf(bytes: Uint8Array): Finding[] | null {
  if (bytes.length === 0) {
    return null;
  }
  try {
    const value = decode(bytes, { useBigInt64: false, maxArrayLength: MAX_DIAGNOSIS });
    if (!Array.isArray(value)) {
      throw new Error('not a list');
    }
    return value.map(item => {
      const event = asEvent(item);
      if (typeof event === 'string' || event.type !== 'FindingReported') {
        throw new Error(typeof event === 'string' ? event : `a ${event.type}`);
      }
      return event.finding;
    });
  } catch (err) {
    console.warn(
      `ddpviz: the kernel's diagnosis does not read (${err}); showing the ` +
        "ranks' reported findings instead."
    );
    return null;
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
    maxEvents: model.get('max_events') || 20000
  };
  let content: HTMLElement;
  try {
    const parsed = await parseTraceAsync(bytes, name);
    if (!isCurrent()) {
      return;
    }
    const diagnosis = diagnosisOf(traceBytes(model.get('diagnosis')));
    content = renderTrace(new TraceModel(parsed), name, options, diagnosis);
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

const TRAITS = ['trace', 'diagnosis', 'scheme', 'max_events'];

function render({ model, el }: { model: WidgetModel; el: HTMLElement }): () => void {
  el.classList.add('ddpviz-viewer', 'ddpviz-widget');
  let draws = 0;
  const redraw = () => {
    const mine = ++draws;
    void draw(model, el, () => mine === draws);
  };
  redraw();
  for (const trait of TRAITS) {
    model.on(`change:${trait}`, redraw);
  }
  return () => {
    for (const trait of TRAITS) {
      model.off(`change:${trait}`, redraw);
    }
  };
}

export default { render };
