"""The extension's pieces agree with each other and with the Python package: the built
extension lands where the wheel's shared-data picks it up (under the labextension name
JupyterLab loads), the settings schema offers exactly the colour schemes the viewer has and
the viewer's defaults, and the notebook template the extension bundles is a clean notebook."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import tomllib

ROOT = Path(__file__).resolve().parents[2]
EXT = ROOT / "extension"


def package_json() -> dict[str, object]:
    data: dict[str, object] = json.loads((EXT / "package.json").read_text())
    return data


def test_build_output_is_what_the_wheel_ships_as_the_ddpviz_labextension() -> None:
    pkg = package_json()
    lab = pkg["jupyterlab"]
    assert isinstance(lab, dict)
    out = (EXT / lab["outputDir"]).resolve()
    assert out == ROOT / "ddpviz" / "labextension"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hatch = pyproject["tool"]["hatch"]["build"]
    shared = hatch["targets"]["wheel"]["shared-data"]
    dest = f"share/jupyter/labextensions/{pkg['name']}"
    assert shared[str(out.relative_to(ROOT))] == dest
    assert shared["extension/install.json"] == f"{dest}/install.json"
    install = json.loads((EXT / "install.json").read_text())
    assert install["packageName"] == pyproject["project"]["name"] == pkg["name"] == "ddpviz"
    hook = hatch["hooks"]["jupyter-builder"]
    for kwargs in (hook["build-kwargs"], hook["editable-build-kwargs"]):
        assert kwargs["path"] == "extension"
        assert kwargs["build_cmd"] in pkg["scripts"]  # type: ignore[operator]
    # the labextension and the TraceView's front end (extension/build-widget.js, inside the
    # package: the wheel ships them as artifacts, since git does not hold them)
    widget = ROOT / "ddpviz" / "widgets" / "static"
    artifacts = hatch["targets"]["wheel"]["artifacts"]
    for target in hook["ensured-targets"]:
        path = ROOT / target
        assert path.parent.is_relative_to(out) or (path.parent == widget and target in artifacts)
    fronts = {"ddpviz/widgets/static/trace_view.js", "ddpviz/widgets/static/trace_view.css",
              "ddpviz/widgets/static/report_view.js"}
    assert fronts <= set(hook["ensured-targets"]) and fronts <= set(artifacts)
    # (else a checkout built before a front end was added would never build it)
    assert {f for f in fronts if f.endswith(".js")} <= set(hook["skip-if-exists"])
    # the build output is not in git: built by the hook (CI) or by `pip install -e .`
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "ddpviz/labextension" in ignored and "extension/node_modules/" in ignored
    assert "ddpviz/widgets/static/" in ignored


def test_settings_schema_matches_the_viewer() -> None:
    schema = json.loads((EXT / "schema" / "plugin.json").read_text())
    props = schema["properties"]
    colors = (EXT / "src" / "colors.ts").read_text()
    palettes = re.search(r"export const PALETTES[^=]*= \{(.*?)\n\};", colors, re.S)
    assert palettes is not None
    names = re.findall(r"^  '?([\w-]+)'?: \[", palettes.group(1), re.M)
    assert props["colorScheme"]["enum"] == names == ["tableau10", "okabe-ito", "viridis"]
    default = re.search(r"export const DEFAULT_SCHEME = '([\w-]+)';", colors)
    assert default is not None and props["colorScheme"]["default"] == default.group(1)
    widget = (EXT / "src" / "widget.ts").read_text()
    max_events = re.search(r"maxEvents: (\d+) \}", widget)
    assert max_events is not None and props["maxEvents"]["default"] == int(max_events.group(1))
    index = (EXT / "src" / "index.ts").read_text()
    plugin_id = re.search(r"const PLUGIN_ID = '([\w:-]+)';", index)
    assert plugin_id is not None
    # JupyterLab finds a plugin's schema at schemaDir/<id after the colon>.json
    package, _, name = plugin_id.group(1).partition(":")
    assert package == package_json()["name"] and (EXT / "schema" / f"{name}.json").exists()


def test_the_bundled_template_is_a_clean_notebook() -> None:
    index = (EXT / "src" / "index.ts").read_text()
    imported = re.search(r"import template from '([^']+\.ipynb)';", index)
    assert imported is not None
    path = (EXT / "src" / imported.group(1)).resolve()
    assert path == ROOT / "ddpviz" / "templates" / "ddp_debugging.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    source = "\n".join(c.source for c in code)
    assert "ddpviz.launch(train, nprocs=2" in source and '.save("ddp_run.ddpviz")' in source
