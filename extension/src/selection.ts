/**
 * Linked selection, all in the browser (no kernel round-trip, so it answers while the kernel
 * is busy): clicking a bucket of a bucket map (or Enter/Space on it, or a click on one of its
 * parameter segments or on a gradient mark of the hook timeline) selects it; its parameters
 * are then highlighted in every bucket map and timeline of the view and in the verification
 * matrix's rows, and everything else is dimmed. A click on a parameter's row of the matrix
 * selects that one parameter the same way. A click on the selection again, Escape or a click
 * on empty space clears it.
 *
 * What is selected is a set of parameter indices (the clicked bucket's own), since the
 * constructor's map and the rebuilt map group parameters differently: in the maps, segments
 * are highlighted by parameter; in the timeline, gradient marks by parameter, and all-reduce
 * bars (and per-bucket summaries, and the many-rank distribution) by the buckets those
 * parameters were reduced in at that iteration. The state lives on the view's root element,
 * read from and written to the DOM that view.ts and hookTimeline.ts draw; a redrawn timeline
 * (the iteration or rank picker) announces itself with TIMELINE_DRAWN and is highlighted again.
 */

import { h, humanBytes, Picks } from './dom';

/** Dispatched (bubbling) by the hook timeline's holder after each draw. */
export const TIMELINE_DRAWN = 'ddpviz-timeline-drawn';

const SELECTED = 'ddpviz-selected';
const DIMMED = 'ddpviz-dimmed';
/** Timeline marks highlighted per bucket (they carry data-bucket, not data-param). */
const BUCKET_MARKS =
  '.ddpviz-allreduce, .ddpviz-grad-summary, .ddpviz-spread-ready, .ddpviz-spread-allreduce';

/** The selection: a bucket (its map's kind, its index there, its parameters) or one parameter
 * picked in the verification matrix (`param`; `bucket` -1). */
interface Selected {
  rebuilt: boolean;
  bucket: number;
  params: Set<number>;
  bytes: number;
  param?: { index: number; name: string };
}

/** Matrix rows that select a parameter. */
const PARAM_ROW = 'table.ddpviz-vm tr[data-param]';

/** Attributes that make an element a toggle button (a bucket, a matrix row). */
export function pickableAttrs(): Record<string, string> {
  return {
    tabindex: '0',
    role: 'button',
    'aria-pressed': 'false'
  };
}

/** The line that says what is selected (empty until something is). */
export function selectionStatus(): HTMLElement {
  return h('p', { class: 'ddpviz-selection-status', 'aria-live': 'polite' });
}

/**
 * Make the view under `root` selectable. Buckets, parameter segments and gradient marks
 * drawn under it (now or later) take part. With `picks`, the selection is kept there and a
 * bucket selected in an earlier drawing (a live view's) is selected again in this one.
 */
export function linkSelection(root: HTMLElement, picks?: Picks): void {
  let selected: Selected | null = null;
  const set = (next: Selected | null) => {
    selected = next;
    if (picks) {
      picks.bucket =
        next === null || next.param ? undefined : { rebuilt: next.rebuilt, bucket: next.bucket };
      picks.param = next?.param?.index;
    }
    apply(root, selected);
  };
  const before = picks?.bucket;
  const row =
    picks?.param === undefined
      ? null
      : root.querySelector(`${PARAM_ROW}[data-param="${Number(picks.param)}"]`);
  if (row !== null) {
    set(fromRow(row));
  } else if (before !== undefined) {
    const bucket = root.querySelector(
      `.ddpviz-bucketmap[data-rebuilt="${before.rebuilt}"] ` +
        `.ddpviz-bucket[data-bucket="${Number(before.bucket)}"]`
    );
    if (bucket !== null) {
      set(fromBucket(bucket));
    }
  }
  const toggle = (next: Selected | null) => {
    const same =
      next !== null &&
      selected !== null &&
      next.param?.index === selected.param?.index &&
      next.rebuilt === selected.rebuilt &&
      next.bucket === selected.bucket &&
      next.params.size === selected.params.size &&
      [...next.params].every(p => selected?.params.has(p)); // (maps of ranks that disagree)
    set(same ? null : next);
  };
  root.addEventListener('click', event => {
    const target = event.target as Element | null;
    if (target === null || target.closest('button, select, option, input, a, label, summary')) {
      return;
    }
    // (a run's own maps only: the advice panel's recommended map is not the run's)
    const bucket = target.closest('.ddpviz-bucketmap .ddpviz-bucket');
    if (bucket !== null && root.contains(bucket)) {
      toggle(fromBucket(bucket));
      return;
    }
    const grad = target.closest('.ddpviz-grad');
    if (grad !== null) {
      toggle(fromGrad(root, grad));
      return;
    }
    const row = target.closest(PARAM_ROW);
    if (row !== null && root.contains(row)) {
      toggle(fromRow(row));
      return;
    }
    if (selected !== null) {
      set(null); // empty space
    }
  });
  root.addEventListener('keydown', event => {
    const target = event.target as Element | null;
    if (event.key === 'Escape' && selected !== null) {
      set(null);
      event.preventDefault();
      event.stopPropagation();
    } else if ((event.key === 'Enter' || event.key === ' ') && target !== null) {
      if (target.classList.contains('ddpviz-bucket')) {
        toggle(fromBucket(target));
      } else if (target.matches(PARAM_ROW)) {
        toggle(fromRow(target));
      } else {
        return;
      }
      event.preventDefault(); // Space would scroll
    }
  });
  root.addEventListener(TIMELINE_DRAWN, () => {
    if (selected !== null) {
      apply(root, selected);
    }
  });
}

function dataNumber(el: Element, name: string): number {
  return Number(el.getAttribute(`data-${name}`));
}

function fromBucket(bucket: Element): Selected {
  const map = bucket.closest('.ddpviz-bucketmap');
  const params = new Set<number>();
  bucket.querySelectorAll('.ddpviz-param').forEach(p => params.add(dataNumber(p, 'param')));
  return {
    rebuilt: map?.getAttribute('data-rebuilt') === 'true',
    bucket: dataNumber(bucket, 'bucket'),
    params,
    bytes: dataNumber(bucket, 'bytes')
  };
}

/** A parameter's row of the verification matrix selects that parameter alone. */
function fromRow(row: Element): Selected {
  const index = dataNumber(row, 'param');
  return {
    rebuilt: false,
    bucket: -1,
    params: new Set([index]),
    bytes: 0,
    param: { index, name: row.getAttribute('data-name') ?? '' }
  };
}

/** The bucket maps in effect at iteration `step`: the rebuilt ones from their step on. */
function mapsAt(root: Element, step: number): Element[] {
  const maps = [...root.querySelectorAll('.ddpviz-bucketmap')];
  const rebuilt = maps.filter(
    m => m.getAttribute('data-rebuilt') === 'true' && dataNumber(m, 'step') <= step
  );
  return rebuilt.length > 0 ? rebuilt : maps.filter(m => m.getAttribute('data-rebuilt') !== 'true');
}

/** A gradient mark selects the bucket of the map in effect that holds its parameter. */
function fromGrad(root: Element, grad: Element): Selected | null {
  const param = grad.getAttribute('data-param');
  const svg = grad.closest('svg');
  if (param === null || svg === null) {
    return null;
  }
  for (const map of mapsAt(root, dataNumber(svg, 'step'))) {
    const segment = map.querySelector(`.ddpviz-param[data-param="${Number(param)}"]`);
    const bucket = segment?.closest('.ddpviz-bucket');
    if (bucket) {
      return fromBucket(bucket);
    }
  }
  return null; // a trace without its bucket maps: nothing to select
}

/** Which buckets the selected parameters were reduced in, in one timeline. */
function bucketsIn(root: Element, svg: Element, params: Set<number>): Set<number> {
  const out = new Set<number>();
  const grads = svg.querySelectorAll('.ddpviz-grad');
  // as recorded (each gradient mark says its bucket), else as the map in effect says
  grads.forEach(g => {
    if (params.has(dataNumber(g, 'param'))) {
      out.add(dataNumber(g, 'bucket'));
    }
  });
  if (grads.length === 0) {
    for (const map of mapsAt(root, dataNumber(svg, 'step'))) {
      map.querySelectorAll('.ddpviz-bucket').forEach(b => {
        const has = [...b.querySelectorAll('.ddpviz-param')].some(p =>
          params.has(dataNumber(p, 'param'))
        );
        if (has) {
          out.add(dataNumber(b, 'bucket'));
        }
      });
    }
  }
  return out;
}

function mark(el: Element, state: boolean | null): void {
  el.classList.toggle(SELECTED, state === true);
  el.classList.toggle(DIMMED, state === false);
}

/** Write `selected` (or its absence: null) into the DOM under `root`. */
function apply(root: Element, selected: Selected | null): void {
  root.classList.toggle('ddpviz-has-selection', selected !== null);
  const params = selected?.params;
  root.querySelectorAll('.ddpviz-bucketmap').forEach(map => {
    const kind = map.getAttribute('data-rebuilt') === 'true';
    map.querySelectorAll('.ddpviz-bucket').forEach(b => {
      const segments = b.querySelectorAll('.ddpviz-param');
      let any = false;
      segments.forEach(p => {
        const on = params === undefined ? null : params.has(dataNumber(p, 'param'));
        any ||= on === true;
        mark(p, on);
      });
      const chosen =
        selected !== null &&
        kind === selected.rebuilt &&
        dataNumber(b, 'bucket') === selected.bucket;
      mark(b, selected === null ? null : chosen ? true : any ? null : false);
      b.setAttribute('aria-pressed', String(chosen));
    });
  });
  root.querySelectorAll('svg.ddpviz-timeline').forEach(svg => {
    svg
      .querySelectorAll('.ddpviz-grad')
      .forEach(g => mark(g, params === undefined ? null : params.has(dataNumber(g, 'param'))));
    const buckets = params === undefined ? null : bucketsIn(root, svg, params);
    svg
      .querySelectorAll(BUCKET_MARKS)
      .forEach(m => mark(m, buckets === null ? null : buckets.has(dataNumber(m, 'bucket'))));
  });
  root.querySelectorAll(PARAM_ROW).forEach(row => {
    const on = params?.has(dataNumber(row, 'param')) === true;
    row.classList.toggle(SELECTED, on);
    row.setAttribute('aria-pressed', String(selected?.param?.index === dataNumber(row, 'param')));
  });
  root.querySelectorAll('.ddpviz-selection-status').forEach(status => {
    status.replaceChildren(...(selected === null ? [] : [statusLine(root, selected)]));
  });
}

function statusLine(root: Element, selected: Selected): HTMLElement {
  if (selected.param) {
    return paramLine(root, selected.param);
  }
  const n = selected.params.size;
  return h(
    'span',
    {},
    h('strong', {}, `bucket ${selected.bucket}`),
    ` (${selected.rebuilt ? 'rebuilt' : 'constructor'} map): ${n} parameter${n === 1 ? '' : 's'}, ` +
      `${humanBytes(selected.bytes)} — click it again or press Escape to clear`
  );
}

/** What a parameter picked in the matrix is: which bucket holds it in each map drawn. */
function paramLine(root: Element, param: { index: number; name: string }): HTMLElement {
  const where: string[] = [];
  root.querySelectorAll('.ddpviz-bucketmap').forEach(map => {
    const bucket = map
      .querySelector(`.ddpviz-param[data-param="${param.index}"]`)
      ?.closest('.ddpviz-bucket');
    if (bucket) {
      const kind = map.getAttribute('data-rebuilt') === 'true' ? 'rebuilt' : 'constructor';
      const ranks = map.getAttribute('data-ranks') ?? '';
      where.push(
        `bucket ${dataNumber(bucket, 'bucket')} of the ${kind} map` +
          (root.querySelectorAll(`.ddpviz-bucketmap[data-rebuilt="${kind === 'rebuilt'}"]`).length >
          1
            ? ` (ranks ${ranks})`
            : '')
      );
    }
  });
  return h(
    'span',
    {},
    h('strong', {}, `parameter ${param.index}`),
    ` '${param.name}': ` +
      (where.length ? `in ${where.join(', ')}` : 'in no bucket map drawn') +
      ' — click its row again or press Escape to clear'
  );
}
