// The trace view's anywidget front end (src/traceWidget.ts, compiled by tsc into lib/) bundled
// into one ES module with its one dependency (@msgpack/msgpack), for ddpviz/widgets/
// trace_view.py; the same components for the HTML report (src/reportView.ts: report_view.js,
// inlined by ddpviz/report/interactive.py); and the viewer's stylesheet beside them, each
// JupyterLab theme variable given a light-theme fallback, since hosts other than JupyterLab
// (marimo, VS Code, a report in a browser) define none of them. Run after `tsc` (`jlpm build:widget`, part of `jlpm build` and
// `jlpm build:prod`). Usage: node build-widget.js [--dev]
'use strict';

const fs = require('fs');
const path = require('path');
const { rspack } = require('@rspack/core');

const OUT = path.resolve(__dirname, '../ddpviz/widgets/static');
const dev = process.argv.includes('--dev');

// Light-theme values, as JupyterLab's own light theme sets them.
const FALLBACKS = {
  'accent-color2': '#81c784',
  'border-color1': '#bdbdbd',
  'border-color2': '#e0e0e0',
  'brand-color0': '#0d47a1',
  'brand-color2': '#64b5f6',
  'brand-color3': '#bbdefb',
  'code-font-family': 'Menlo, Consolas, "DejaVu Sans Mono", monospace',
  'code-font-size': '13px',
  'error-color0': '#b71c1c',
  'error-color1': '#d32f2f',
  'error-color3': '#ffcdd2',
  'layout-color0': 'white',
  'layout-color2': '#eeeeee',
  'layout-color3': '#bdbdbd',
  'success-color0': '#1b5e20',
  'success-color1': '#388e3c',
  'success-color3': '#c8e6c9',
  'ui-font-color1': 'rgba(0, 0, 0, 0.87)',
  'ui-font-color2': 'rgba(0, 0, 0, 0.54)',
  'ui-font-color3': 'rgba(0, 0, 0, 0.38)',
  'ui-font-family': 'system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif',
  'ui-font-size0': '11px',
  'ui-font-size1': '13px',
  'ui-font-size2': '15px',
  'ui-font-size3': '17px',
  'warn-color0': '#e65100',
  'warn-color1': '#f57c00',
  'warn-color3': '#ffe0b2'
};

function css() {
  const source = fs.readFileSync(path.join(__dirname, 'style/base.css'), 'utf8');
  return source.replace(/var\(--jp-([a-z0-9-]+)\)/g, (whole, name) => {
    if (!(name in FALLBACKS)) {
      throw new Error(`build-widget.js: no fallback for --jp-${name} (style/base.css)`);
    }
    return `var(--jp-${name}, ${FALLBACKS[name]})`;
  });
}

const config = {
  mode: dev ? 'development' : 'production',
  devtool: false,
  context: __dirname,
  entry: {
    trace_view: './lib/traceWidget.js',
    report_view: './lib/reportView.js'
  },
  target: ['web', 'es2022'],
  experiments: { outputModule: true },
  output: {
    path: OUT,
    filename: '[name].js',
    module: true,
    chunkFormat: 'module',
    library: { type: 'module' }
  },
  optimization: { splitChunks: false, runtimeChunk: false }
};

rspack(config, (err, stats) => {
  if (err || stats.hasErrors()) {
    console.error(err || stats.toString({ all: false, errors: true }));
    process.exit(1);
  }
  fs.writeFileSync(path.join(OUT, 'trace_view.css'), css());
  // The report inlines report_view.js in a <script> element (ddpviz/report/interactive.py):
  // text that would end or comment out that element must not be in it.
  const inlined = fs.readFileSync(path.join(OUT, 'report_view.js'), 'utf8');
  const bad = /<\/script|<!--/i.exec(inlined);
  if (bad) {
    console.error(`build-widget.js: report_view.js holds '${bad[0]}', which cannot be inlined`);
    process.exit(1);
  }
  console.log(
    `build-widget.js: ${path.relative(process.cwd(), OUT)}/` +
      '{trace_view.{js,css},report_view.js}'
  );
});
