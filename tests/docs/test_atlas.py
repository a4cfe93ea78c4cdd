"""The documentation's claims that can go stale: the atlas of DDP errors (docs/errors.md) quotes
torch's messages exactly and covers every kind of finding, and the API reference documents every
public name. No processes, no docs build: these read files."""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import pytest
import torch

import ddpviz
from ddpviz.findings import KINDS
from tests.docs_build import TIMEOUT_S, wait_for_docs_build

ROOT = Path(__file__).resolve().parents[2]
ATLAS = ROOT / "docs" / "errors.md"
GENERATED = ROOT / "docs" / "_generated" / "atlas"
TORCH = Path(torch.__file__).parent


def torch_quotes() -> list[str]:
    """The torch messages the atlas's headings quote, except NCCL's (not in the CPU build)."""
    quotes = []
    for line in ATLAS.read_text(encoding="utf-8").splitlines():
        if line.startswith("## ") and '"' in line and not line.rstrip().endswith("(NCCL)"):
            quotes.append(line.split('"')[1])
    return quotes


def fragments(quote: str) -> list[str]:
    """The fixed parts of a quote: `…` marks text that varies (ranks, sizes, times)."""
    return [f.strip(" []") for f in quote.split("…") if len(f.strip(" []")) >= 8]


@pytest.fixture(scope="module")
def torch_text() -> list[bytes | mmap.mmap]:
    """torch's own strings: its C++ libraries (mapped, not read) and its Python sources."""
    texts: list[bytes | mmap.mmap] = []
    for lib in ("libtorch_cpu.so", "libtorch_python.so", "libc10.so"):
        path = TORCH / "lib" / lib
        if path.exists():
            with open(path, "rb") as f:
                texts.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    texts.append("\n".join(p.read_text(encoding="utf-8", errors="replace")
                           for p in (TORCH / "nn" / "parallel").glob("*.py")).encode())
    return texts


def in_torch(fragment: str, torch_text: list[bytes | mmap.mmap]) -> bool:
    """The fragment is one of torch's strings, or two of them that torch's C++ concatenates
    (`c10::str("params[", i, "] in this process", " with sizes ", ...)`)."""
    def found(piece: str) -> bool:
        return any(t.find(piece.encode()) >= 0 for t in torch_text)

    if found(fragment):
        return True
    cuts = [i for i, c in enumerate(fragment) if c == " "]
    return any(len(fragment[:i].strip(" []")) >= 6 and len(fragment[i:].strip(" []")) >= 6
               and found(fragment[:i].strip(" [")) and found(fragment[i:].strip(" ]"))
               for i in cuts)


def test_the_atlas_quotes_torch_in_its_own_words(torch_text: list[bytes | mmap.mmap]) -> None:
    quotes = torch_quotes()
    assert len(quotes) >= 10  # the headings still carry the quotes this test reads
    missing = [f for q in quotes for f in fragments(q) if not in_torch(f, torch_text)]
    assert not missing, f"not in torch {torch.__version__}'s strings: {missing}"


def test_a_misquoted_message_would_be_caught(torch_text: list[bytes | mmap.mmap]) -> None:
    wrong = "Expected to have finished the reduction in the prior iteration"
    assert not in_torch(wrong, torch_text)


def test_the_atlas_covers_every_kind_of_finding() -> None:
    text = ATLAS.read_text(encoding="utf-8")
    assert [k for k in KINDS if f"`{k}`" not in text] == []


@pytest.mark.docs_build
@pytest.mark.timeout(TIMEOUT_S)
def test_every_example_the_atlas_includes_is_generated_by_a_run() -> None:
    included = re.findall(r"_generated/atlas/([\w.]+\.txt)", ATLAS.read_text(encoding="utf-8"))
    assert included
    script = (ROOT / "docs" / "atlas_examples.py").read_text(encoding="utf-8")
    for name in included:  # each case is one the script runs
        case = name.split(".")[0]
        assert f'"{case}"' in script, f"{name}: no case {case!r} in docs/atlas_examples.py"
    wait_for_docs_build()  # `make test` generates them beside pytest
    if not GENERATED.exists():
        pytest.skip("docs/_generated/atlas is absent: run `make docs` to generate the examples")
    absent = [n for n in included if not (GENERATED / n).exists()]
    assert not absent, f"run `make docs`: {absent}"
    for name in included:  # ddpviz's side speaks in its own house style
        text = (GENERATED / name).read_text(encoding="utf-8")
        if name.endswith(".ddpviz.txt"):
            assert text.startswith("ddpviz") or text.startswith("(nothing printed)"), name


def test_the_api_reference_documents_every_public_name() -> None:
    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto\w+:: ddpviz\.(\w+)\s*$", api, re.M))
    assert sorted(set(ddpviz.__all__) - {"__version__"} - documented) == []
