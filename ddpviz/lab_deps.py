"""The notebook side's dependencies (`pip install ddpviz[lab]`), checked where they are needed.

A rank-side install (`pip install ddpviz`) has torch, msgspec, numpy, pyzmq and cloudpickle
only: the engine, taps, sender, watch() and `ddpviz record` work with those. The widgets,
the dashboard and the JupyterLab extension need the packages below.
"""

from __future__ import annotations

import importlib.util

LAB_PACKAGES = ("ipywidgets", "anywidget", "plotly")


def missing_lab_packages() -> list[str]:
    """The notebook-side packages this environment lacks."""
    return [name for name in LAB_PACKAGES if not _installed(name)]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_lab(what: str) -> None:
    """Raise ImportError naming the fix when the notebook-side packages are missing."""
    missing = missing_lab_packages()
    if missing:
        raise ImportError(
            f"ddpviz: {what} need {', '.join(LAB_PACKAGES)}; this environment lacks "
            f"{', '.join(missing)} (a rank-side install of ddpviz leaves them out).\n"
            "Install the notebook side with `pip install 'ddpviz[lab]'`.")
