/**
 * The trace viewer's panels inside the static HTML report (ddpviz/report/interactive.py): the
 * same components as JupyterLab's file viewer and the notebook's TraceView (traceWidget.draw),
 * drawing the run the report embeds. The page carries the run as one `.ddpviz` file,
 * diagnose()'s findings and the bucket advisor's answer as base64 text in
 * `<script type="application/octet-stream">` elements, never markup; nothing is fetched, so
 * the report stays one file that works offline. Bundled on its own (build-widget.js) into ddpviz/widgets/static/report_view.js,
 * which the report inlines as a module script.
 */

import { DEFAULT_SCHEME } from './colors';
import { draw, WidgetModel } from './traceWidget';

/** The id of the element the panels are drawn into, and of the data elements. */
export const VIEW_ID = 'ddpviz-view';
export const TRACE_ID = 'ddpviz-view-trace';
export const DIAGNOSIS_ID = 'ddpviz-view-diagnosis';
export const ADVICE_ID = 'ddpviz-view-advice';

/** The bytes an embedded data element carries (base64 text; empty when absent or unreadable). */
export function embeddedBytes(doc: Document, id: string): Uint8Array {
  const text = doc.getElementById(id)?.textContent?.replace(/\s+/g, '') ?? '';
  try {
    const raw = atob(text);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) {
      bytes[i] = raw.charCodeAt(i);
    }
    return bytes;
  } catch {
    return new Uint8Array(0); // (not base64: the view says the run did not read)
  }
}

/** A model over the embedded run, as the anywidget model would give it (nothing changes). */
export function embeddedModel(doc: Document, el: HTMLElement): WidgetModel {
  const values: Record<string, unknown> = {
    trace: embeddedBytes(doc, TRACE_ID),
    diagnosis: embeddedBytes(doc, DIAGNOSIS_ID),
    advice: embeddedBytes(doc, ADVICE_ID),
    name: el.dataset.name || 'trace',
    scheme: el.dataset.scheme || DEFAULT_SCHEME,
    max_events: Number(el.dataset.maxEvents) || 20000
  };
  return {
    get: ((name: string) => values[name]) as WidgetModel['get'],
    on: () => undefined,
    off: () => undefined
  };
}

/** Draw the embedded run into the page's view element, if it has one. */
export function mount(doc: Document = document): Promise<void> {
  const el = doc.getElementById(VIEW_ID);
  if (el === null) {
    return Promise.resolve();
  }
  el.classList.add('ddpviz-viewer', 'ddpviz-widget');
  return draw(embeddedModel(doc, el), el);
}

void mount();
