/**
 * The notebook dashboard's "Open in Perfetto" and "Save Chrome trace" as an anywidget
 * (ddpviz/widgets/perfetto_button.py): on a click it asks the kernel for the run as it is now,
 * as the bytes of one `.ddpviz` file in a message buffer (never markup), builds the Chrome
 * trace in the browser with the viewer's own code (chromeTrace.ts) and hands it over as the
 * viewer does (perfetto.ts). Perfetto's tab opens inside the click, where browsers allow it;
 * the trace follows once the kernel answered. Bundled on its own by build-widget.js.
 */

import { chromeTraceBytes } from './chromeTrace';
import { renderActions, Say } from './perfetto';
import { parseTraceAsync, TraceError, traceBytes } from './trace';

type Buffer = DataView | ArrayBuffer | Uint8Array;

/** What the button needs of anywidget's model. */
export interface ButtonModel {
  get(name: 'name'): string;
  send(content: Record<string, unknown>): void;
  on(event: 'msg:custom', callback: (msg: unknown, buffers?: Buffer[]) => void): void;
  off(event: 'msg:custom', callback: (msg: unknown, buffers?: Buffer[]) => void): void;
}

interface Reply {
  kind: 'trace' | 'error';
  id: number;
  name?: string;
  message?: string;
}

function render({ model, el }: { model: ButtonModel; el: HTMLElement }): () => void {
  el.classList.add('ddpviz-widget');
  const waiting = new Map<number, [Say, (bytes: Uint8Array<ArrayBuffer>) => void]>();
  let next = 0;
  const onMessage = (msg: unknown, buffers?: Buffer[]) => {
    const reply = msg as Reply;
    const asked = waiting.get(reply?.id);
    if (asked === undefined) {
      return;
    }
    waiting.delete(reply.id);
    const [say, then] = asked;
    if (reply.kind !== 'trace' || !buffers?.length) {
      say(reply.message ?? 'ddpviz: the kernel sent no run.', 'warning');
      return;
    }
    const name = reply.name || 'run';
    say('Building the Chrome trace...', 'note');
    parseTraceAsync(traceBytes(buffers[0]), name)
      .then(parsed => then(chromeTraceBytes(parsed)))
      .catch(err =>
        say(
          err instanceof TraceError
            ? err.message
            : `ddpviz: the Chrome trace could not be built from this run (${err}).`,
          'warning'
        )
      );
  };
  model.on('msg:custom', onMessage);
  el.replaceChildren(
    renderActions(model.get('name') || 'run', (say, then) => {
      const id = next++;
      waiting.set(id, [say, then]);
      say('Asking the kernel for the run (it answers once it is free)...', 'note');
      model.send({ kind: 'chrome', id });
    })
  );
  return () => model.off('msg:custom', onMessage);
}

export default { render };
