/**
 * The viewer's building blocks: elements with attributes and children (never innerHTML, so no
 * string from a trace becomes markup), panel sections, notes, byte sizes, and the options the
 * settings control. Shared by view.ts and hookTimeline.ts.
 */

/** What the settings change about rendering. */
export interface ViewOptions {
  /** A key of PALETTES. */
  scheme: string;
  /** At most this many marks in the hook timeline. */
  maxEvents: number;
  /** What the user picked, read when drawing and written on each pick (a live view keeps it
   * across redraws: traceWidget.ts); none: the defaults. */
  picks?: Picks;
  /** A view's first drawing: the panels below the hook timeline are drawn after the first
   * paint (view.ts's renderTrace). */
  drawLater?: boolean;
}

/** What the user picked in a view. */
export interface Picks {
  /** The hook timeline's iteration (its option value), once picked. */
  step?: string;
  /** The rank whose lane the hook timeline draws (many ranks), once picked. */
  rank?: string;
  /** The bucket selected (selection.ts): its map's kind and its index there; none: none. */
  bucket?: { rebuilt: boolean; bucket: number };
  /** Per bucket map (zoom.ts's key): its zoom and where the view stands in it (the scroll
   * position as a fraction of the bar's width). */
  zoom?: Record<string, { zoom: number; at: number }>;
  /** The parameter selected from the verification matrix (selection.ts); none: none. */
  param?: number;
  /** Where replay stands (replay.ts); none: follow a live run, else show everything. */
  replay?: ReplayCursor;
}

/** What a view shows: follow the live end, or the state at `asOf` (aligned ns; null: all). */
export interface ReplayCursor {
  follow: boolean;
  /** The iteration shown (null: the latest). */
  step: number | null;
  asOf: number | null;
  /** When a drag of a replay control began (performance.now()); none: no drag. A live view
   * holds its redraws meanwhile (replay.ts `dragging`), which would end the drag. */
  dragStarted?: number;
}

export type Attrs = Record<string, string | number | boolean | undefined>;
export type Child = Node | string | null | undefined | false;
/** A child, or an array of them: arrays are passed as is, never spread into a call (100,000
 * ranks or buckets would overflow the stack). */
export type Children = Child | Child[];

/** An HTML element with attributes (`class`, `title`, `data-*`, ...) and children. */
export function h(tag: string, attrs: Attrs = {}, ...children: Children[]): HTMLElement {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

export function appendAll(el: Element, children: Children[]): void {
  for (const c of children) {
    if (Array.isArray(c)) {
      for (const x of c) {
        if (x !== null && x !== undefined && x !== false) {
          el.append(x);
        }
      }
    } else if (c !== null && c !== undefined && c !== false) {
      el.append(c);
    }
  }
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element with attributes and children. */
export function s(tag: string, attrs: Attrs = {}, ...children: Children[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

export function setAttrs(el: Element, attrs: Attrs): void {
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== false) {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
}

/** 1536 -> "1.5 KiB"; 2**62 and more (torch's sys.maxsize) -> "unlimited" (as ddpviz/units.py). */
export function humanBytes(n: number): string {
  if (n >= 2 ** 62) {
    return 'unlimited';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = n;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${units[u]}`;
}

export function section(kind: string, title: string, ...children: Children[]): HTMLElement {
  const el = h(
    'section',
    { class: `ddpviz-section ddpviz-${kind}`, 'data-section': kind },
    h('h3', {}, title)
  );
  appendAll(el, children);
  return el;
}

export function note(text: string, kind = 'note'): HTMLElement {
  return h('p', { class: `ddpviz-${kind}` }, text);
}
