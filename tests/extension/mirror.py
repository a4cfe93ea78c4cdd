"""Run a TypeScript module of the extension under node on JSON cases: the mirror tests compare
its results with the Python code it mirrors."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

EXT = Path(__file__).resolve().parents[2] / "extension"
TYPESCRIPT = EXT / "node_modules" / "typescript"

# Transpile the module (and the extension's modules it imports) to CommonJS in memory, bind
# its exports to `g`, read the cases from stdin as `cases`, evaluate the caller's expression
# `out` and print it as JSON. Packages (@msgpack/msgpack) come from the extension's
# node_modules; `load('./name')` gives another module of extension/src.
_PRELUDE = """
const ts = require(process.argv[1]);
const fs = require('fs');
const path = require('path');
const packages = require('module').createRequire(path.join(process.argv[3], 'package.json'));
const loaded = new Map();
function load(name) {
  if (!name.startsWith('./')) return packages(name);
  const file = path.join(process.argv[3], 'src', name.slice(2).replace(/\\.ts$/, '') + '.ts');
  if (loaded.has(file)) return loaded.get(file).exports;
  const js = ts.transpileModule(fs.readFileSync(file, 'utf8'), { compilerOptions: {
    module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 } }).outputText;
  const mod = { exports: {} };
  loaded.set(file, mod);
  new Function('module', 'exports', 'require', js)(mod, mod.exports, load);
  return mod.exports;
}
const g = load('./' + process.argv[2]);
const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
"""


def run_typescript(module: str, out: str, cases: Any) -> Any:
    """`out`: a JavaScript expression over `g` (the module's exports) and `cases`, whose value
    is returned (through JSON). Skips the test without node or the extension's node_modules."""
    node = shutil.which("node")
    if node is None or not TYPESCRIPT.is_dir():
        pytest.skip("needs node and the extension's node_modules (cd extension && jlpm install)")
    script = _PRELUDE + f"process.stdout.write(JSON.stringify({out}));\n"
    result = subprocess.run([node, "-e", script, str(TYPESCRIPT), module, str(EXT)],
                            input=json.dumps(cases), capture_output=True, text=True,
                            timeout=120, check=True)
    return json.loads(result.stdout)
