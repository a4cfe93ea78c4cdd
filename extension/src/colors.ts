/**
 * Colour schemes for buckets (the `colorScheme` setting). Bucket i is drawn in colour
 * i modulo the palette's length, in the bucket map and in the hook timeline alike.
 */

/** Palettes by setting value. */
export const PALETTES: Readonly<Record<string, readonly string[]>> = {
  /** Tableau 10: the default of many plotting tools. */
  tableau10: [
    '#4e79a7',
    '#f28e2b',
    '#e15759',
    '#76b7b2',
    '#59a14f',
    '#edc948',
    '#b07aa1',
    '#ff9da7',
    '#9c755f',
    '#bab0ac'
  ],
  /** Okabe-Ito: distinguishable with the common colour-vision deficiencies. */
  'okabe-ito': ['#0072b2', '#e69f00', '#009e73', '#d55e00', '#56b4e9', '#cc79a7', '#f0e442'],
  /** Viridis, sampled: ordered, for many buckets. */
  viridis: [
    '#440154',
    '#482878',
    '#3e4989',
    '#31688e',
    '#26828e',
    '#1f9e89',
    '#35b779',
    '#6ece58',
    '#b5de2b',
    '#fde725'
  ]
};

/** The default `colorScheme`. */
export const DEFAULT_SCHEME = 'tableau10';

/** The colour of bucket `i` in `scheme` (unknown schemes fall back to the default). */
export function bucketColor(scheme: string, i: number): string {
  const palette = PALETTES[scheme] ?? PALETTES[DEFAULT_SCHEME];
  return palette[((i % palette.length) + palette.length) % palette.length];
}

/**
 * `color` (a palette's `#rrggbb`) at `alpha`: what the colour drawn with that opacity looks
 * like over whatever is behind it, without the opacity (an element with opacity below 1 is a
 * layer of its own for the browser to paint: tens of thousands of bucket map segments were).
 */
export function withAlpha(color: string, alpha: number): string {
  const hex = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
  if (hex === null) {
    return `color-mix(in srgb, ${color} ${alpha * 100}%, transparent)`;
  }
  const [r, g, b] = hex.slice(1).map(x => parseInt(x, 16));
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}
