/**
 * The run in one verdict, as ddpviz/_diagnose/verdict.py words it: "errors" when a finding is
 * an error, else "warnings" when one is a warning, else "healthy" (notes, severity "info",
 * leave a run healthy). The viewer leads with it.
 */

export type Verdict = 'errors' | 'warnings' | 'healthy';

/** The verdict of findings of these severities. */
export function verdict(severities: string[]): Verdict {
  return severities.includes('error')
    ? 'errors'
    : severities.includes('warning')
      ? 'warnings'
      : 'healthy';
}

/**
 * The verdict of the ranks' own reported findings (a viewer without a kernel): as
 * `verdictLine`, but never "healthy", which only diagnose() can say (it also reads hangs,
 * stragglers and replica checks from the events): 'no problems reported by the ranks.'
 */
export function reportedLine(severities: string[]): string {
  if (verdict(severities) !== 'healthy') {
    return verdictLine(severities);
  }
  const noted = notesOf(severities);
  return 'no problems reported by the ranks' + (noted ? ` (${noted})` : '') + '.';
}

/** '2 notes' (the findings of severity "info"); '' for none. */
function notesOf(severities: string[]): string {
  const notes = severities.filter(x => x === 'info').length;
  return notes ? `${notes} note${notes > 1 ? 's' : ''}` : '';
}

/**
 * The verdict first, then the counts: 'healthy: no problems found.', 'healthy: no problems
 * found (1 note, last: what was not checked).', 'errors: 1 error, 2 warnings, 1 note.'
 */
export function verdictLine(severities: string[]): string {
  const count = (s: string) => severities.filter(x => x === s).length;
  const noted = notesOf(severities);
  const word = verdict(severities);
  if (word === 'healthy') {
    return (
      'healthy: no problems found' + (noted ? ` (${noted}, last: what was not checked)` : '') + '.'
    );
  }
  const told = ['error', 'warning']
    .filter(s => count(s) > 0)
    .map(s => `${count(s)} ${s}${count(s) > 1 ? 's' : ''}`);
  return `${word}: ${[...told, ...(noted ? [noted] : [])].join(', ')}.`;
}
