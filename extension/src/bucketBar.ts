/**
 * One bucket map drawn as a bar: a block per bucket in reduction order, as wide as its
 * gradient bytes, a segment per parameter (hover: name, shape, dtype, size). The buckets
 * panel draws the run's maps with it (selectable: linked selection, selection.ts) and the
 * advice panel the advisor's recommended map (not selectable: its buckets are not the run's).
 */

import { bucketColor } from './colors';
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
  const blocks = buckets.map((indices, b) => {
    const size = bytes[b] ?? 0;
    const color = bucketColor(options.scheme, b);
    const segments = indices.map((i, k) => {
      const p = params.get(i);
      const label = p
        ? `param ${i} ${p.name}: (${p.shape.join(', ')}) ${p.dtype}, ${humanBytes(paramBytes(p))}`
        : `param ${i}`;
      return h('span', {
        class: 'ddpviz-param',
        'data-param': i,
        title: label,
        style:
          `flex-grow: ${p ? Math.max(paramBytes(p), 1) : 1}; background: ${color}; ` +
          `opacity: ${k % 2 === 0 ? 1 : 0.72}`
      });
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
      h('div', { class: 'ddpviz-params' }, segments),
      h('div', { class: 'ddpviz-bucket-label' }, `b${b} · ${indices.length} · ${humanBytes(size)}`)
    );
  });
  return h('div', { class: 'ddpviz-bar' }, blocks);
}
