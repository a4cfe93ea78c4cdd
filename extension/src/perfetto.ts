/**
 * "Open in Perfetto" and "Save Chrome trace": the run's Chrome trace JSON (chromeTrace.ts),
 * built in the browser, handed to ui.perfetto.dev the way Perfetto documents for tools that
 * link to it (docs/visualization/deep-linking-to-perfetto-ui): open its tab, send 'PING' until
 * it answers 'PONG', then post `{perfetto: {buffer, title, fileName}}` to that origin only. The
 * UI loads the trace in the browser tab; nothing is uploaded by ddpviz. Where no answer comes
 * (offline, a blocked pop-up, a page opened from file://, where browsers disable postMessage
 * between windows), the user is told so and can save the JSON instead.
 */

import { chromeTraceBytes } from './chromeTrace';
import { h, humanBytes } from './dom';
import { ParsedTrace } from './trace';

export const PERFETTO_ORIGIN = 'https://ui.perfetto.dev';
const PING_MS = 50;
/** How long to wait for Perfetto's PONG before saying it did not answer. */
export const WAIT_MS = 30_000;

export type Say = (text: string, kind: 'note' | 'warning') => void;

/** The JSON's file name for a run called `name` ("run.ddpviz" -> "run.json"). */
export function jsonName(name: string): string {
  const base = name.replace(/^.*[\\/]/, '').replace(/\.ddpviz$/, '') || 'ddpviz-trace';
  return `${base}.json`;
}

/** A Perfetto tab being opened: `send` hands it a trace once it answered (or at once). */
export interface PerfettoTab {
  send(bytes: Uint8Array): void;
}

/**
 * Open ui.perfetto.dev in a new tab now (inside the click, where browsers allow a new tab) and
 * start the handshake; the trace may come later (`send`: the notebook dashboard asks the
 * kernel for it). `say` reports each stage to the user. Null: the browser refused the tab.
 */
export function openPerfettoTab(title: string, fileName: string, say: Say): PerfettoTab | null {
  const target = window.open(`${PERFETTO_ORIGIN}/#!/`, '_blank');
  if (target === null) {
    say(
      'The browser blocked the new tab for Perfetto. Allow pop-ups for this page and ' +
        'press the button again, or save the Chrome trace and open it at ui.perfetto.dev.',
      'warning'
    );
    return null;
  }
  say('Waiting for Perfetto to load in its tab...', 'note');
  let ready = false;
  let pending: Uint8Array | null = null;
  const post = (bytes: Uint8Array) => {
    const buffer = bytes.slice().buffer; // (a copy: transferring it empties the original)
    target.postMessage({ perfetto: { buffer, title, fileName } }, PERFETTO_ORIGIN, [buffer]);
    say(`Sent ${humanBytes(bytes.length)} to Perfetto: the trace opens in its tab.`, 'note');
  };
  const started = Date.now();
  const stop = () => {
    window.clearInterval(timer);
    window.removeEventListener('message', onMessage);
  };
  const onMessage = (evt: MessageEvent) => {
    if (evt.source !== target || evt.origin !== PERFETTO_ORIGIN || evt.data !== 'PONG') {
      return;
    }
    stop();
    ready = true;
    if (pending !== null) {
      post(pending);
      pending = null;
    } else {
      say('Perfetto is ready; waiting for the run...', 'note');
    }
  };
  const timer = window.setInterval(() => {
    if (target.closed) {
      stop();
      say('The Perfetto tab was closed before it loaded; nothing was sent.', 'warning');
    } else if (Date.now() - started > WAIT_MS) {
      stop();
      say(
        `Perfetto did not answer within ${WAIT_MS / 1000} s (no network to ui.perfetto.dev, ` +
          'or a page opened from a file): nothing was sent. Save the Chrome trace and ' +
          'open it in Perfetto or chrome://tracing instead.',
        'warning'
      );
    } else {
      target.postMessage('PING', PERFETTO_ORIGIN);
    }
  }, PING_MS);
  window.addEventListener('message', onMessage);
  return {
    send(bytes: Uint8Array): void {
      if (target.closed) {
        say('The Perfetto tab was closed; nothing was sent.', 'warning');
      } else if (ready) {
        post(bytes);
      } else {
        pending = bytes;
      }
    }
  };
}

/** Download `bytes` as `fileName` (the browser's own save). */
export function saveBytes(bytes: Uint8Array<ArrayBuffer>, fileName: string): void {
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/json' }));
  const link = h('a', { href: url, download: fileName, style: 'display: none' });
  document.body.append(link);
  link.click();
  link.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/**
 * The two buttons and the line that says what they did. `chrome(then)` hands `then` the
 * run's Chrome trace bytes (at once in the viewer; the notebook dashboard asks its kernel).
 */
export function renderActions(
  name: string,
  chrome: (say: Say, then: (bytes: Uint8Array<ArrayBuffer>) => void) => void
): HTMLElement {
  const status = h('span', { class: 'ddpviz-action-status', role: 'status' });
  const say: Say = (text, kind) => {
    status.textContent = text;
    status.className = `ddpviz-action-status ddpviz-${kind}`;
  };
  const perfetto = h(
    'button',
    { type: 'button', class: 'ddpviz-perfetto', title: 'Open this run in ui.perfetto.dev' },
    'Open in Perfetto'
  );
  perfetto.addEventListener('click', () => {
    const tab = openPerfettoTab(name, jsonName(name), say);
    if (tab !== null) {
      chrome(say, bytes => tab.send(bytes));
    }
  });
  const save = h(
    'button',
    { type: 'button', class: 'ddpviz-save-chrome', title: 'For Perfetto or chrome://tracing' },
    'Save Chrome trace'
  );
  save.addEventListener('click', () =>
    chrome(say, bytes => {
      saveBytes(bytes, jsonName(name));
      say(`Saved ${jsonName(name)} (${humanBytes(bytes.length)}).`, 'note');
    })
  );
  return h('div', { class: 'ddpviz-actions', 'data-section': 'actions' }, perfetto, save, status);
}

/** The two buttons for a run already parsed in the browser (the viewer, trace.view()). */
export function renderTraceActions(trace: ParsedTrace, name: string): HTMLElement {
  return renderActions(name, (say, then) => {
    let bytes: Uint8Array<ArrayBuffer>;
    try {
      bytes = chromeTraceBytes(trace);
    } catch (err) {
      say(`ddpviz: the Chrome trace could not be built from this run (${err}).`, 'warning');
      return;
    }
    then(bytes);
  });
}
