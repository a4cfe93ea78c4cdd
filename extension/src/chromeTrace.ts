/**
 * The Chrome/Perfetto trace JSON of a parsed `.ddpviz` trace, as `ddpviz/report/chrome_trace.py`
 * writes it from Python (with the spans of `ddpviz/model/spans.py`): ranks are processes;
 * phases, all-reduces, broadcast chunks and per-bucket gradient summaries are spans ("X"); every
 * other event is an instant ("i"). The viewer and the notebook view build it in the browser, so
 * "Open in Perfetto" needs no kernel. `tests/extension/test_chrome_trace_mirror.py` checks that
 * both write the same document for the same files.
 */

import { DDPEvent } from './events';
import { ParsedTrace } from './trace';

type SpanPhase = 'verify' | 'broadcast' | 'forward' | 'backward' | 'optimizer step';

/** The phase span each event type opens (`ddpviz.model.phases.SPAN_OPENS`). */
export const SPAN_OPENS: ReadonlyMap<string, SpanPhase> = new Map<string, SpanPhase>([
  ['VerificationStarted', 'verify'],
  ['BroadcastStarted', 'broadcast'],
  ['ForwardStarted', 'forward'],
  ['BackwardStarted', 'backward'],
  ['OptimizerStepStarted', 'optimizer step']
]);

/** The open phase span each event type ends (`ddpviz.model.phases.SPAN_CLOSES`). */
export const SPAN_CLOSES: ReadonlyMap<string, SpanPhase> = new Map<string, SpanPhase>([
  ['VerificationPassed', 'verify'],
  ['VerificationFailed', 'verify'],
  ['BroadcastFinished', 'broadcast'],
  ['ForwardStarted', 'forward'],
  ['BackwardStarted', 'forward'],
  ['BackwardFinished', 'backward'],
  ['OptimizerStepFinished', 'optimizer step']
]);

/** Event types drawn only as spans, never as instants (`chrome_trace.py`'s `SPAN_TYPES`). */
export const SPAN_TYPES: ReadonlySet<string> = new Set([
  ...SPAN_OPENS.keys(),
  ...SPAN_CLOSES.keys(),
  'AllReduceLaunched',
  'AllReduceDone',
  'BroadcastChunkSent',
  'BroadcastChunkDone',
  'GradsSummarized'
]);

const SUMMARY_LANE = 'gradients ready (per-bucket summaries)';

/** One record of the document's `traceEvents`. */
export type ChromeRecord = Record<string, unknown>;

/** The document: what Perfetto and chrome://tracing open. */
export interface ChromeTrace {
  traceEvents: ChromeRecord[];
  displayTimeUnit: 'ms';
  otherData: Record<string, unknown>;
}

interface Span {
  rank: number;
  name: string;
  cat: string;
  lane: string;
  start: number; // ns on the aligned clock
  end: number;
  args: Record<string, unknown>;
}

/** An event's fields without the ones every record says elsewhere (`spans.event_args`). */
export function eventArgs(e: DDPEvent): Record<string, unknown> {
  const args: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(e)) {
    if (k !== 'type' && k !== 'rank' && k !== 't_ns') {
      args[k] = v;
    }
  }
  return args;
}

/** The spans of one rank's events (`spans._RankSpans`), broadcast chunks laid out in lanes. */
function rankSpans(rank: number, events: DDPEvent[], offset: number): Span[] {
  const out: Span[] = [];
  const openPhase = new Map<SpanPhase, DDPEvent>();
  const openAr = new Map<number, DDPEvent[]>();
  const openChunk = new Map<number, DDPEvent[]>();
  const close = (
    start: DDPEvent,
    endNs: number,
    name: string,
    cat: string,
    lane: string,
    done: boolean,
    extra: Record<string, unknown>
  ) => {
    const args = { ...eventArgs(start), ...extra };
    if (!done) {
      args.unfinished = true;
    }
    out.push({ rank, name, cat, lane, start: start.t_ns + offset, end: endNs + offset, args });
  };
  const pending = (map: Map<number, DDPEvent[]>, key: number): DDPEvent[] => {
    let list = map.get(key);
    if (list === undefined) {
      list = [];
      map.set(key, list);
    }
    return list;
  };
  for (const e of events) {
    switch (e.type) {
      case 'AllReduceLaunched':
        pending(openAr, e.bucket).push(e);
        continue;
      case 'AllReduceDone': {
        const s = openAr.get(e.bucket)?.shift();
        if (s !== undefined) {
          const b = e.bucket;
          close(s, e.t_ns, `all-reduce b${b}`, 'allreduce', `all-reduce bucket ${b}`, true, {});
        }
        continue;
      }
      case 'BroadcastChunkSent':
        pending(openChunk, e.chunk).push(e);
        continue;
      case 'BroadcastChunkDone': {
        const s = openChunk.get(e.chunk)?.shift();
        if (s !== undefined) {
          close(s, e.t_ns, `broadcast chunk ${e.chunk}`, 'broadcast', '', true, {});
        }
        continue;
      }
      case 'GradsSummarized':
        out.push({
          rank,
          name: `gradients ready b${e.bucket} (summary of ${e.n_grads})`,
          cat: 'gradients',
          lane: SUMMARY_LANE,
          start: e.first_t_ns + offset,
          end: e.last_t_ns + offset,
          args: {
            ...eventArgs(e),
            per_parameter: 'not recorded (detail level aggregated this step)'
          }
        });
        continue;
      case 'BackwardComputed': {
        // a step recorded without BackwardStarted: its forward ended at its first gradient
        const s = openPhase.get('forward');
        if (s !== undefined && s.step === e.step) {
          openPhase.delete('forward');
          const first = e.first_t_ns ?? 0;
          const end = s.t_ns <= first && first <= e.t_ns ? first : e.t_ns;
          close(s, end, 'forward', 'phase', 'phases', true, {
            ended_by: 'BackwardComputed (its first gradient)'
          });
        }
        continue;
      }
    }
    const ended = SPAN_CLOSES.get(e.type);
    if (ended !== undefined) {
      const s = openPhase.get(ended);
      if (s !== undefined) {
        openPhase.delete(ended);
        close(s, e.t_ns, ended, 'phase', 'phases', true, { ended_by: e.type });
      }
    }
    const opened = SPAN_OPENS.get(e.type);
    if (opened !== undefined) {
      openPhase.set(opened, e);
    }
  }
  const last = events.length ? events[events.length - 1].t_ns : 0;
  for (const [phase, s] of openPhase) {
    close(s, last, phase, 'phase', 'phases', false, {});
  }
  for (const list of openAr.values()) {
    for (const a of list) {
      const b = (a as { bucket: number }).bucket;
      close(a, last, `all-reduce b${b}`, 'allreduce', `all-reduce bucket ${b}`, false, {});
    }
  }
  for (const list of openChunk.values()) {
    for (const c of list) {
      const chunk = (c as { chunk: number }).chunk;
      close(c, last, `broadcast chunk ${chunk}`, 'broadcast', '', false, {});
    }
  }
  // Broadcast chunks overlap (2 in flight): each takes the first lane free at its start.
  const chunkLanes: number[] = [];
  return out
    .sort((a, b) => a.start - b.start) // (stable, as Python's sorted)
    .map(sp => {
      if (sp.cat !== 'broadcast') {
        return sp;
      }
      let lane = chunkLanes.findIndex(t => t <= sp.start);
      if (lane < 0) {
        lane = chunkLanes.length;
        chunkLanes.push(sp.end);
      }
      chunkLanes[lane] = sp.end;
      return { ...sp, lane: `broadcast lane ${lane}` };
    });
}

/** Thread ids per (rank, lane) in order of first use, each announced by its metadata. */
class Lanes {
  private tids = new Map<string, number>();
  private count = new Map<number, number>();

  tid(rank: number, lane: string, out: ChromeRecord[]): number {
    const key = `${rank}\u0000${lane}`;
    let n = this.tids.get(key);
    if (n === undefined) {
      n = this.count.get(rank) ?? 0;
      this.tids.set(key, n);
      this.count.set(rank, n + 1);
      out.push({ ph: 'M', name: 'thread_name', pid: rank, tid: n, args: { name: lane } });
      out.push({ ph: 'M', name: 'thread_sort_index', pid: rank, tid: n, args: { sort_index: n } });
    }
    return n;
  }
}

/** The Chrome trace document of `trace`, record for record what Python's export writes. */
export function chromeTrace(trace: ParsedTrace): ChromeTrace {
  const ranks = [...trace.byRank.keys()].sort((a, b) => a - b);
  const offset = (r: number) => trace.clock.get(r)?.[0] ?? 0;
  const spans = new Map(ranks.map(r => [r, rankSpans(r, trace.byRank.get(r)!, offset(r))]));
  let t0 = Infinity;
  for (const r of ranks) {
    for (const s of spans.get(r)!) {
      t0 = Math.min(t0, s.start);
    }
    const events = trace.byRank.get(r)!;
    if (events.length) {
      t0 = Math.min(t0, events[0].t_ns + offset(r));
    }
  }
  t0 = Number.isFinite(t0) ? t0 : 0;
  const lanes = new Lanes();
  const out: ChromeRecord[] = [];
  for (const r of ranks) {
    out.push({ ph: 'M', name: 'process_name', pid: r, args: { name: `rank ${r}` } });
    out.push({ ph: 'M', name: 'process_sort_index', pid: r, args: { sort_index: r } });
    lanes.tid(r, 'phases', out);
  }
  for (const r of ranks) {
    for (const s of spans.get(r)!) {
      const tid = lanes.tid(r, s.lane, out);
      out.push({
        name: s.name,
        cat: s.cat,
        ph: 'X',
        pid: r,
        tid,
        ts: (s.start - t0) / 1000,
        dur: Math.max(0, s.end - s.start) / 1000,
        args: s.args
      });
    }
  }
  for (const r of ranks) {
    const shift = offset(r) - t0;
    for (const e of trace.byRank.get(r)!) {
      if (SPAN_TYPES.has(e.type)) {
        continue;
      }
      const hook = e.type === 'GradReady';
      const tid = lanes.tid(r, hook ? 'gradient hooks' : 'events', out);
      out.push({
        name: hook ? `grad p${e.param}` : e.type,
        cat: hook ? 'hook' : 'event',
        ph: 'i',
        s: 't',
        pid: r,
        tid,
        ts: (e.t_ns + shift) / 1000,
        args: eventArgs(e)
      });
    }
  }
  const clock: Record<string, { offset_ns: number; error_ns: number }> = {};
  for (const [r, [offsetNs, errorNs]] of trace.clock) {
    clock[String(r)] = { offset_ns: offsetNs, error_ns: errorNs };
  }
  return {
    traceEvents: out,
    displayTimeUnit: 'ms',
    otherData: { generator: 'ddpviz', clock, meta: trace.meta }
  };
}

/** The document as UTF-8 JSON bytes, what Perfetto's postMessage API takes. */
export function chromeTraceBytes(trace: ParsedTrace): Uint8Array<ArrayBuffer> {
  return new TextEncoder().encode(JSON.stringify(chromeTrace(trace)));
}
