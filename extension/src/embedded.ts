/**
 * What the HTML report embeds, read back in the page (reportView.ts): base64 text, then a zlib
 * stream (report/interactive.py writes them so) inflated by the browser's own
 * DecompressionStream and bounded: an element that would inflate past MAX_EMBEDDED is refused
 * as soon as its output passes that, before it sizes any memory (a zip bomb fails in the time
 * it takes to inflate MAX_EMBEDDED bytes, tens of milliseconds). No DOM: tests/security
 * runs it under node.
 */

/** The view element's `data-encoding` when the data elements are zlib streams (interactive.py). */
export const ENCODING = 'deflate';

/**
 * The most bytes one embedded element inflates to: what a view reads of a run at most
 * (`ddpviz.widgets.trace_view.MAX_BYTES`, 64 MiB; a report embeds 16 MiB at most).
 */
export const MAX_EMBEDDED = 67108864;

/** An embedded element that cannot be read (not base64, not a zlib stream, over the limit). */
export class EmbedError extends Error {}

type FromBase64 = (text: string) => Uint8Array;

/** The bytes of base64 text (whitespace ignored); throws on text that is not base64. */
export function base64Bytes(text: string): Uint8Array {
  const clean = text.replace(/\s+/g, '');
  // the engine's own decoder where it has one (Chrome 140, Firefox 133, Safari 18.2)
  const native = (Uint8Array as unknown as { fromBase64?: FromBase64 }).fromBase64;
  if (native !== undefined) {
    return native(clean);
  }
  const raw = atob(clean);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) {
    bytes[i] = raw.charCodeAt(i);
  }
  return bytes;
}

/**
 * The bytes a zlib stream inflates to, read chunk by chunk and refused (the stream cancelled)
 * as soon as they pass `limit`: a stream claiming more never sizes memory past it.
 */
export async function inflate(
  data: Uint8Array,
  limit: number = MAX_EMBEDDED,
  what = 'an embedded element'
): Promise<Uint8Array> {
  const stream = new Blob([data as BlobPart])
    .stream()
    .pipeThrough(new DecompressionStream('deflate'));
  const reader = stream.getReader();
  const parts: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    let step: ReadableStreamReadResult<Uint8Array>;
    try {
      step = await reader.read();
    } catch (err) {
      throw new EmbedError(`${what} is not a zlib stream that reads whole (${err}).`);
    }
    if (step.done) {
      break;
    }
    total += step.value.length;
    if (total > limit) {
      void reader.cancel().catch(() => undefined);
      throw new EmbedError(
        `${what} inflates to over the ${sized(limit)} a view reads; it was not read ` +
          'past that (a damaged or tampered report).'
      );
    }
    parts.push(step.value);
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** 64 MiB as "64 MiB"; a limit that is no whole number of MiB in bytes. */
function sized(limit: number): string {
  return limit % 1048576 === 0 ? `${limit / 1048576} MiB` : `${limit.toLocaleString('en')} bytes`;
}
