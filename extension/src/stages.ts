/**
 * The stages of drawing a run, as User Timing measures named `ddpviz:<stage>` (parse, model,
 * panels, each panel as `ddpviz:panel:<kind>`, later): a few per drawing, never per event.
 * benchmarks/bench_first_paint.py reads them back for its table of where the first paint's
 * time goes. Only the latest drawing's are kept (a live view redraws for hours: the page's
 * timeline would otherwise grow by a dozen entries per redraw).
 */

/** Record `ddpviz:<name>` from `start` (a performance.now()) to now. */
export function measureSince(name: string, start: number): void {
  const full = `ddpviz:${name}`;
  try {
    performance.clearMeasures(full);
    performance.measure(full, { start, end: performance.now() });
  } catch {
    // a browser without User Timing's options (before 2020): the drawing goes on unmeasured
  }
}

/** `fn()`, measured as `ddpviz:<name>`. */
export function measured<T>(name: string, fn: () => T): T {
  const start = performance.now();
  try {
    return fn();
  } finally {
    measureSince(name, start);
  }
}
