/**
 * A TraceView's run in the browser as it grows: the `trace` trait parsed once, then the frames
 * a live view's kernel sends appended to it in place (trace.appendFrames), never the whole run
 * parsed again. One per widget model, shared by every view of it (a second view of the same
 * output needs nothing from the kernel). A model that lacks frames (a page reloaded while the
 * run went on) asks the kernel for the whole file so far. See [Note: a live view's wire] in
 * ddpviz/widgets/trace_feed.py.
 */

import { measureSince } from './stages';
import { appendFrames, ParsedTrace, parseTraceAsync, traceBytes } from './trace';

type Bytes = DataView | ArrayBuffer | Uint8Array | null;

/** What the live trace needs of anywidget's model (typed here to keep it dependency-free). */
export interface LiveModel {
  get(name: 'trace' | 'diagnosis' | 'advice'): Bytes;
  get(name: 'trace_events' | 'events_sent' | 'max_events'): number;
  get(name: 'name' | 'scheme' | 'live' | 'notice'): string;
  /** A live view's status from the kernel (replay.ts's kernelStatusOf reads it). */
  get(name: 'status'): unknown;
  on(event: string, callback: (...args: any[]) => void): void;
  off(event: string, callback: (...args: any[]) => void): void;
  send?(content: unknown, callbacks?: unknown, buffers?: ArrayBuffer[]): void;
}

/** An update from the kernel: frames adding events `base`..`total`, or the whole file. */
interface Frames {
  base: number;
  total: number;
  bytes: Uint8Array;
}

/** Traits whose change only needs a redraw (the trace itself is read here). */
const REDRAWN = ['diagnosis', 'advice', 'live', 'notice', 'status', 'name', 'scheme', 'max_events'];

/** The run a model's views draw, as received so far. */
export class LiveTrace {
  /** The run so far; null before the first parse ends, or when it failed (`error`). */
  parsed: ParsedTrace | null = null;
  /** Why the run could not be read (an exception), or null. */
  error: unknown = null;
  /** Events (by the kernel's count) that `parsed` holds. */
  total = 0;
  /** Updates appended without a parse, and parses (a whole file), so far. */
  appended = 0;
  parses = 0;
  /** This model's id in `hello` messages (a kernel's answer names the model it is for). */
  readonly id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;

  private waiting: Frames[] = [];
  private loads = 0;
  private loading = false;
  private asked = false;
  private readonly listeners = new Set<() => void>();

  constructor(private readonly model: LiveModel) {
    model.on('msg:custom', this.onMessage);
    model.on('change:trace', this.reload);
    model.on('change:events_sent', this.check);
    for (const trait of REDRAWN) {
      model.on(`change:${trait}`, this.notify);
    }
    this.reload();
  }

  /** Call `listener` after every change; returns what stops it. */
  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private readonly notify = (): void => {
    for (const listener of this.listeners) {
      listener();
    }
  };

  private readonly reload = (): void => {
    void this.load(traceBytes(this.model.get('trace')), this.model.get('trace_events') || 0);
  };

  /** Parse a whole file (in slices: the page stays responsive); a later load supersedes. */
  private async load(bytes: Uint8Array, total: number): Promise<void> {
    const mine = ++this.loads;
    this.loading = true;
    let parsed: ParsedTrace | null = null;
    let error: unknown = null;
    if (bytes.length > 0) {
      try {
        const start = performance.now();
        parsed = await parseTraceAsync(bytes, this.name());
        measureSince('parse', start);
      } catch (err) {
        error = err;
      }
    }
    if (mine !== this.loads) {
      return;
    }
    this.loading = false;
    this.parsed = parsed;
    this.error = error;
    this.total = parsed === null ? 0 : total;
    this.parses++;
    this.asked = false;
    this.drain();
    this.check();
    this.notify();
  }

  private name(): string {
    return this.model.get('name') || 'trace';
  }

  private readonly onMessage = (content: unknown, buffers?: Bytes[]): void => {
    if (typeof content !== 'object' || content === null) {
      return;
    }
    const msg = content as { kind?: unknown; base?: unknown; total?: unknown; to?: unknown };
    const bytes = traceBytes(buffers && buffers.length > 0 ? buffers[0] : null);
    if (typeof msg.total !== 'number') {
      return;
    }
    if (msg.kind === 'frames' && typeof msg.base === 'number') {
      this.waiting.push({ base: msg.base, total: msg.total, bytes });
      this.drain();
    } else if (msg.kind === 'whole' && msg.to === this.id) {
      void this.load(bytes, msg.total);
    }
  };

  /** Append the waiting frames that continue what is held; ask for the whole at a gap. */
  private drain(): void {
    if (this.loading || this.parsed === null) {
      return;
    }
    const waiting = this.waiting;
    this.waiting = [];
    let changed = false;
    for (const update of waiting) {
      if (update.total <= this.total) {
        continue; // held already (a whole file that came later had them)
      }
      if (update.base !== this.total) {
        this.ask(); // missed frames: the kernel's next answer has them all
        break;
      }
      try {
        appendFrames(this.parsed, update.bytes, this.name());
      } catch (err) {
        this.error = err;
        this.parsed = null;
        break;
      }
      this.total = update.total;
      this.appended++;
      changed = true;
    }
    if (changed || this.error !== null) {
      this.notify();
    }
  }

  /** The kernel has sent more than is held (`events_sent`): ask for the whole file. */
  private readonly check = (): void => {
    if (!this.loading && this.parsed !== null && this.model.get('events_sent') > this.total) {
      this.ask();
    }
  };

  private ask(): void {
    if (this.asked || this.model.send === undefined) {
      return;
    }
    this.asked = true;
    this.model.send({ kind: 'hello', id: this.id });
  }
}

const traces = new WeakMap<object, LiveTrace>();

/** The model's live trace (made at its first view). */
export function liveTraceOf(model: LiveModel): LiveTrace {
  let live = traces.get(model);
  if (live === undefined) {
    live = new LiveTrace(model);
    traces.set(model, live);
  }
  return live;
}
