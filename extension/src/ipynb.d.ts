/** Notebook files imported as JSON (the template of 'New DDP debugging notebook'). */
declare module '*.ipynb' {
  const notebook: {
    cells: unknown[];
    metadata: Record<string, unknown>;
    nbformat: number;
    nbformat_minor: number;
  };
  export default notebook;
}
