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

# Transpile the module to CommonJS in memory, bind its exports to `g`, read the cases from
# stdin as `cases`, evaluate the caller's expression `out` and print it as JSON.
_PRELUDE = """
const ts = require(process.argv[1]);
const fs = require('fs');
const src = fs.readFileSync(process.argv[2], 'utf8');
const js = ts.transpileModule(src, { compilerOptions: { module: ts.ModuleKind.CommonJS,
  target: ts.ScriptTarget.ES2022 } }).outputText;
const mod = { exports: {} };
new Function('module', 'exports', js)(mod, mod.exports);
const g = mod.exports;
const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
"""


def run_typescript(module: str, out: str, cases: Any) -> Any:
    """`out`: a JavaScript expression over `g` (the module's exports) and `cases`, whose value
    is returned (through JSON). Skips the test without node or the extension's node_modules."""
    node = shutil.which("node")
    if node is None or not TYPESCRIPT.is_dir():
        pytest.skip("needs node and the extension's node_modules (cd extension && jlpm install)")
    script = _PRELUDE + f"process.stdout.write(JSON.stringify({out}));\n"
    result = subprocess.run([node, "-e", script, str(TYPESCRIPT), str(EXT / "src" / module)],
                            input=json.dumps(cases), capture_output=True, text=True,
                            timeout=120, check=True)
    return json.loads(result.stdout)
