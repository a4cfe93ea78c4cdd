"""The torch releases ddpviz is tested with, and the one-line note `ddpviz record` says at
start-up when the installed torch is another (a note, never a refusal). Read from the installed
package's metadata: the launcher never imports torch (the ranks do).
"""

from __future__ import annotations

import importlib.metadata
import re

# major.minor of the releases tested: CI runs the whole suite on 2.13 and the version-specific
# tests on 2.15 (`make test-torch-newest`); `make test-torch` ran 2.14 and 2.15 whole by hand
# (docs/guide/torch-versions.md, with what is known of others).
TESTED = ("2.13", "2.14", "2.15")
_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def installed() -> str | None:
    """The installed torch's version ("2.13.0", "2.15.0+cu132"), or None when not installed."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def untested_note(version: str | None) -> str | None:
    """What to say when `version` is outside the tested releases; None when it is one of them
    (or unknown: the ranks may run another Python)."""
    if version is None:
        return None
    m = _RELEASE.match(version)
    if m is not None and f"{m[1]}.{m[2]}" in TESTED:
        return None
    return (f"ddpviz: torch {version} is not among the releases ddpviz is tested with "
            f"({', '.join(TESTED)}); recording goes on, but its DDP twin, bucket plans and "
            "watch() follow those releases (docs/guide/torch-versions.md).")
