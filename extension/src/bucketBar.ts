/**
 * One bucket map drawn as a bar: a block per bucket in reduction order, as wide as its
 * gradient bytes, a segment per parameter (hover: name, shape, dtype, size; the text is made
 * at the first hover). The buckets panel draws the run's maps with it (selectable: linked
 * selection, selection.ts) and the advice panel the advisor's recommended map (not
 * selectable: its buckets are not the run's).
 */

import { bucketColor, withAlpha } from './colors';
import { h, humanBytes, ViewOptions } from './dom';
import { paramBytes } from './eventModel';
import { ParamInfo } from './events';
import { pickableAttrs } from './selection';

/**
 * The bar of one map.
 *
 * @param buckets - parameter indices per bucket, bucket 0 reduced first.
 * @param bytes - gradient bytes per bucket.
 * @param limits - the size limit each bucket was filled against.
 * @param params - the run's parameters by index (for sizes and hover text).
 * @param selectable - whether a click selects a bucket (the run's own maps).
 */
export function bucketBar(
  buckets: number[][],
  bytes: number[],
  limits: number[],
  params: Map<number, ParamInfo>,
  options: ViewOptions,
  selectable = true
): HTMLElement {
  const labels = labelsOf(params);
  const blocks = buckets.map((indices, b) => {
    const size = bytes[b] ?? 0;
    const color = bucketColor(options.scheme, b);
    // (a map has a segment per parameter: tens of thousands. Each a copy of one of the
    // bucket's two, its colour set once: no style text parsed per segment. Every other one
    // is the colour at 72%, as a translucent colour: an opacity would make each a layer.)
    const segments = h('div', { class: 'ddpviz-params' });
    const even = document.createElement('span');
    even.className = 'ddpviz-param';
    even.style.background = color;
    const odd = even.cloneNode() as HTMLElement;
    odd.style.background = withAlpha(color, 0.72);
    indices.forEach((i, k) => {
      const span = (k % 2 === 0 ? even : odd).cloneNode() as HTMLElement;
      span.setAttribute('data-param', String(i));
      span.style.flexGrow = String(labels.grow(i));
      segments.append(span);
    });
    const limit = limits[b];
    return h(
      'div',
      {
        class: 'ddpviz-bucket',
        ...(selectable ? pickableAttrs() : {}),
        'data-bucket': b,
        'data-params': indices.length,
        'data-bytes': size,
        title:
          `bucket ${b}: ${indices.length} parameters, ${humanBytes(size)}` +
          (limit !== undefined ? ` (limit ${humanBytes(limit)})` : ''),
        style: `flex-grow: ${Math.max(size, 1)}`
      },
      segments,
      h('div', { class: 'ddpviz-bucket-label' }, `b${b} · ${indices.length} · ${humanBytes(size)}`)
    );
  });
  const bar = h('div', { class: 'ddpviz-bar' }, blocks);
  // a segment's hover text is written when the pointer first comes over it (tens of
  // thousands of segments, a few of them ever hovered: none is made before it is wanted)
  bar.addEventListener('pointerover', event => {
    const target = event.target as HTMLElement | null;
    if (target?.classList.contains('ddpviz-param') && !target.hasAttribute('title')) {
      const i = Number(target.getAttribute('data-param'));
      target.title = labels.get(i) ?? `param ${i}`;
    }
  });
  return bar;
}

/** A parameter's hover text and segment width, made once per parameter for all of a view's maps. */
interface Labels {
  get(index: number): string | undefined;
  grow(index: number): number;
}

const labelCache = new WeakMap<Map<number, ParamInfo>, Labels>();

function labelsOf(params: Map<number, ParamInfo>): Labels {
  let labels = labelCache.get(params);
  if (labels === undefined) {
    const text = new Map<number, string>();
    const grow = new Map<number, number>();
    labels = {
      get: index => {
        let label = text.get(index);
        const p = params.get(index);
        if (label === undefined && p !== undefined) {
          label = `param ${index} ${p.name}: (${p.shape.join(', ')}) ${p.dtype}, ${humanBytes(paramBytes(p))}`;
          text.set(index, label);
        }
        return label;
      },
      grow: index => {
        let g = grow.get(index);
        if (g === undefined) {
          const p = params.get(index);
          g = p ? Math.max(paramBytes(p), 1) : 1;
          grow.set(index, g);
        }
        return g;
      }
    };
    labelCache.set(params, labels);
  }
  return labels;
}
