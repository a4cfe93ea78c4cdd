/**
 * Zoom and pan for a bucket map's bar (bucketBar.ts), all in the browser: a 10,000-parameter
 * map drawn 1,000 px wide gives each parameter a tenth of a pixel, so its segments (and their
 * hover text) can only be reached zoomed in. The bar sits in a horizontal scroller at
 * `zoom` x the scroller's width; − and + halve and double it, "fit" returns to 1x, and
 * Ctrl (or ⌘) + the wheel zooms about the pointer. Panning is the scroller's own: drag its
 * scrollbar, the wheel sideways, or Shift + the wheel. The zoom of each bar is kept in the
 * view's picks, so a live view's redraw (traceWidget.ts) keeps it.
 */

import { h, Picks } from './dom';

/** The zoom bounds: 1x (the bar fits the view) to 1,024x (a tenth-pixel segment is 100 px). */
export const MIN_ZOOM = 1;
export const MAX_ZOOM = 1024;

/** Clamped to [MIN_ZOOM, MAX_ZOOM]; anything that is not a finite number is 1x. */
export function clampZoom(zoom: number): number {
  if (!Number.isFinite(zoom)) {
    return MIN_ZOOM;
  }
  return Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, zoom));
}

/**
 * `bar` made zoomable: the controls above it and the scroller around it.
 *
 * @param bar - the bar (its width is set here).
 * @param key - which bar this is among the view's (its zoom is kept under this key).
 * @param picks - where the zoom is kept across redraws (none: it starts at 1x each time).
 * @returns the element to put where the bar was.
 */
export function zoomable(bar: HTMLElement, key: string, picks?: Picks): HTMLElement {
  const kept = picks?.zoom?.[key];
  let zoom = clampZoom(kept?.zoom ?? MIN_ZOOM);
  const level = h('span', { class: 'ddpviz-zoom-level', 'aria-live': 'polite' });
  const scroller = h('div', { class: 'ddpviz-zoom-scroll' }, bar);
  const button = (label: string, title: string, act: () => number) => {
    const b = h('button', { type: 'button', class: 'ddpviz-zoom-button', title }, label);
    b.addEventListener('click', () => set(act(), scroller.clientWidth / 2));
    return b;
  };
  const out = button('−', 'zoom out (Ctrl + wheel on the map: about the pointer)', () => zoom / 2);
  const into = button('+', 'zoom in (Ctrl + wheel on the map: about the pointer)', () => zoom * 2);
  const fit = button('fit', 'the whole map in view', () => MIN_ZOOM);
  const show = () => {
    bar.style.width = `${zoom * 100}%`;
    level.textContent = zoom === MIN_ZOOM ? '' : `${zoom.toLocaleString('en-US')}x`;
    out.toggleAttribute('disabled', zoom <= MIN_ZOOM);
    fit.toggleAttribute('disabled', zoom <= MIN_ZOOM);
    into.toggleAttribute('disabled', zoom >= MAX_ZOOM);
    scroller.setAttribute('data-zoom', String(zoom));
  };
  // about `x` (px from the scroller's left edge): the point of the bar under it stays there
  const set = (next: number, x: number) => {
    const before = zoom;
    zoom = clampZoom(next);
    if (zoom === before) {
      return;
    }
    const at = scroller.scrollLeft + x;
    show();
    scroller.scrollLeft = (at * zoom) / before - x;
    keep();
  };
  // the zoom and where the view stands in the bar (a fraction of its width), for a redraw
  const keep = () => {
    if (picks) {
      const at = scroller.scrollWidth > 0 ? scroller.scrollLeft / scroller.scrollWidth : 0;
      picks.zoom = { ...picks.zoom, [key]: { zoom, at } };
    }
  };
  scroller.addEventListener('scroll', keep, { passive: true });
  scroller.addEventListener(
    'wheel',
    event => {
      if (!(event.ctrlKey || event.metaKey) || event.deltaY === 0) {
        return; // the page's (or the scroller's sideways) scroll
      }
      event.preventDefault();
      const left = scroller.getBoundingClientRect().left;
      set(event.deltaY < 0 ? zoom * 1.25 : zoom / 1.25, event.clientX - left);
    },
    { passive: false }
  );
  show();
  if (kept !== undefined && kept.at > 0) {
    // (laid out only once the view is in the page)
    requestAnimationFrame(() => {
      scroller.scrollLeft = kept.at * scroller.scrollWidth;
    });
  }
  const controls = h('div', { class: 'ddpviz-zoom-controls' }, out, into, fit, level);
  return h('div', { class: 'ddpviz-zoom' }, controls, scroller);
}
