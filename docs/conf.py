"""Sphinx configuration of ddpviz's documentation site (`make docs`; built into out/docs/html).

Sphinx + pydata-sphinx-theme + myst-nb, as Jupyter and the PyData projects build theirs: the
pages are Markdown (MyST), the notebooks in ../notebooks render as pages, the API reference is
generated from the docstrings (autodoc + napoleon, Google style) and the CLI reference from
ddpviz/cli.py's argparse parser (sphinx-argparse). See docs/contributing.md for why.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # document this checkout's ddpviz, not an installed copy
sys.path.insert(0, str(HERE / "_ext"))  # cli_parser (the CLI parser documented), docstyle

import ddpviz  # noqa: E402

project = "ddpviz"
author = "the ddpviz authors"
copyright = "the ddpviz authors"
release = version = ddpviz.__version__

extensions = [
    "myst_nb",  # Markdown pages (MyST) and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",
    "docstyle",  # _ext/docstyle.py: the docstrings of the API reference follow the house style
]

# The notebooks live in ../notebooks (tests/test_notebooks.py runs them from there); a copy goes
# into the source tree at each build, so the site renders the files as they are in git.
NOTEBOOKS = HERE / "notebooks"
shutil.rmtree(NOTEBOOKS, ignore_errors=True)
NOTEBOOKS.mkdir()
for nb in sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "notebooks").glob("_*.py")]):
    shutil.copy2(nb, NOTEBOOKS / nb.name)

# Most notebooks start ranks (2-rank gloo jobs, torchrun, hangs): executing them would add
# minutes to every build, so they render as stored, without outputs (tests/test_notebooks.py
# executes them in CI); the widgets they draw are shown as screenshots on the task pages.
# 01_buckets runs in one process in seconds: it is executed, so its page shows the bucket plans
# the installed ddpviz computes.
nb_execution_mode = "force"
nb_execution_excludepatterns = [f"notebooks/{nb.name}"
                                for nb in (ROOT / "notebooks").glob("*.ipynb")
                                if nb.name != "01_buckets.ipynb"]
nb_execution_timeout = 120
nb_execution_raise_on_error = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
# _generated holds files that pages include, not pages of their own
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store", "README.md"]
suppress_warnings = ["myst.header"]  # notebooks start at ## under their own title

autodoc_default_options: dict[str, object] = {}

# Every cross-reference must resolve (-n, with -W in `make docs`), except these: types of other
# projects (no intersphinx: the build works offline), msgspec's field constraints that autodoc
# prints as types (`max_length=4096`), and private types that signatures mention but that are no
# part of the API (ddpviz._* modules, the transport's and launcher's internals).
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(torch|nn|dist|msgspec|os|collections|typing|numpy|np|pathlib)\..*"),
    ("py:.*", r"\w+=-?\d+"),
    ("py:class", r"Path"),  # pathlib's, as `from __future__ import annotations` spells it
    ("py:.*", r"ddpviz\._\w+\..*"),
    ("py:.*", r"(RankFailure|Event|Emitter|Collector|FolderFeed|BucketAssignment|AdviceError|"
              r"CostModel)"),
    # names that docstrings inherited from torch or written in prose mention (nn.Module's
    # train(), Join's hooks), and views and records one level further down (not documented yet)
    ("py:.*", r"(Dropout|BatchNorm|Module|JoinHook|Joinable|LaunchTimeout|Dashboard|TraceView|"
              r"BucketMap|"
              r"AdviceView)"),
    ("py:.*", r"ddpviz\.(events\.(Event|E)|traces\.columns\.Table|model\.spans\.Span|"
              r"model\.event_model\.EventModel)"),
    ("py:.*", r"ddpviz\.(engine\.buckets\.CloseReason|advisor\.candidates\.Candidate|"
              r"advisor\.replay\.Prediction|engine\.verify\.(ParamMeta|BufferMeta)|"
              r"probes\.replicas\.ReplicaCheck)"),
    ("py:.*", r"ddpviz\.traces\.fileformat\.End"),  # a rank's file's end record (diagnose(ended=))
]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

smartquotes = False  # "--out" stays two hyphens in the CLI reference and in code-like prose
default_role = "literal"  # docstrings write `name` as in Markdown: render it as code

html_theme = "pydata_sphinx_theme"
html_title = "ddpviz"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_context = {"default_mode": "auto"}  # without it the theme logs "invalid theme mode" on load
html_last_updated_fmt = None
html_show_sourcelink = False

# The findings table (reference/findings.md) is written from the vocabulary itself.
GENERATED = HERE / "_generated"
GENERATED.mkdir(exist_ok=True)


def _findings_table() -> str:
    from ddpviz.findings import FIXES, KINDS

    rows = ["| kind | what it means | usual fix |", "|---|---|---|"]
    for kind, meaning in KINDS.items():
        fix = FIXES.get(kind, {}).get("", "")
        rows.append(f"| `{kind}` | {meaning} | {fix.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


(GENERATED / "findings.md").write_text(_findings_table(), encoding="utf-8")


# Pages that helpers working beside this site write at docs/NAME.md (issues 24 and 25). Each one
# present joins the user guide's task list (guide/index.md includes this file), so a merge needs
# no edit here; a page outside every toctree would fail the build.
FEATURE_PAGES = ("replicas", "nonfinite", "triage", "triage-straggler", "collectives", "attach")
_present = [name for name in FEATURE_PAGES if (HERE / f"{name}.md").exists()]
(GENERATED / "feature_pages.md").write_text(
    "```{toctree}\n:maxdepth: 1\n:caption: More tasks\n\n"
    + "".join(f"../{name}\n" for name in _present) + "```\n" if _present
    else "<!-- no feature pages (docs/NAME.md of FEATURE_PAGES in docs/conf.py) yet -->\n",
    encoding="utf-8")
