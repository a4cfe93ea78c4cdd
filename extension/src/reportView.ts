/**
 * The trace viewer's panels inside the static HTML report (ddpviz/report/interactive.py): the
 * same components as JupyterLab's file viewer and the notebook's TraceView (traceWidget.draw),
 * drawing the run the report embeds. The page carries the run as one `.ddpviz` file,
 * diagnose()'s findings and the bucket advisor's answer, each zlib-compressed (the view
 * element's `data-encoding="deflate"`) and written as base64 text in
 * `<script type="application/octet-stream">` elements, never markup; nothing is fetched, so
 * the report stays one file that works offline. The page inflates them with the browser's own
 * DecompressionStream, reading at most MAX_EMBEDDED bytes of each (a view's own limit): an
 * element that would inflate past it (a zip bomb) is refused as soon as it does, before it
 * sizes any memory, with a line saying so. A page without the marker (a report written
 * before compression) carries the bytes as they are.
 * Bundled on its own (build-widget.js) into ddpviz/widgets/static/report_view.js,
 * which the report inlines as a module script.
 */

import { DEFAULT_SCHEME } from './colors';
import { base64Bytes, EmbedError, ENCODING, inflate, MAX_EMBEDDED } from './embedded';
import { draw, WidgetModel } from './traceWidget';
import { renderError, renderLoading } from './view';

/** The id of the element the panels are drawn into, and of the data elements. */
export const VIEW_ID = 'ddpviz-view';
export const TRACE_ID = 'ddpviz-view-trace';
export const DIAGNOSIS_ID = 'ddpviz-view-diagnosis';
export const ADVICE_ID = 'ddpviz-view-advice';

/**
 * The bytes an embedded data element carries: its base64 text, inflated where the page says
 * `compressed`; empty when the element is absent or empty.
 */
export async function embeddedBytes(
  doc: Document,
  id: string,
  compressed: boolean
): Promise<Uint8Array> {
  const text = doc.getElementById(id)?.textContent ?? '';
  const what = `the report's embedded ${id.replace(/^ddpviz-view-/, '')}`;
  let raw: Uint8Array;
  try {
    raw = base64Bytes(text);
  } catch {
    throw new EmbedError(`${what} is not base64 text.`);
  }
  return compressed && raw.length > 0 ? inflate(raw, MAX_EMBEDDED, what) : raw;
}

/** A model over the embedded run, as the anywidget model would give it (nothing changes). */
export async function embeddedModel(doc: Document, el: HTMLElement): Promise<WidgetModel> {
  const compressed = el.dataset.encoding === ENCODING;
  const [trace, diagnosis, advice] = await Promise.all(
    [TRACE_ID, DIAGNOSIS_ID, ADVICE_ID].map(id => embeddedBytes(doc, id, compressed))
  );
  const values: Record<string, unknown> = {
    trace,
    diagnosis,
    advice,
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
export async function mount(doc: Document = document): Promise<void> {
  const el = doc.getElementById(VIEW_ID);
  if (el === null) {
    return;
  }
  el.classList.add('ddpviz-viewer', 'ddpviz-widget');
  const name = el.dataset.name || 'trace';
  el.replaceChildren(renderLoading(name));
  let model: WidgetModel;
  try {
    model = await embeddedModel(doc, el);
  } catch (err) {
    const why = err instanceof EmbedError ? err.message : String(err);
    el.replaceChildren(
      renderError(
        `ddpviz: '${name}' could not be read from this report: ${why}\nThe sections above ` +
          'and below are complete; open the run in JupyterLab or with ddpviz.Trace.load.'
      )
    );
    return;
  }
  return draw(model, el);
}

void mount();
