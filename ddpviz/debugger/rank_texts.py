"""Texts from every paused rank, read as few: code results (`Debugger.run`) and stacks
(`Debugger.stacks`). Ranks that said the same thing are one group, the largest last (outliers
first, as the tensor views), each labelled with its rank ranges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ddpviz import markup
from ddpviz.findings import format_ranks
from ddpviz.model.rank_groups import value_groups


class CodeResult(NamedTuple):
    """What code printed and returned on one rank."""

    stdout: str
    result: str  # repr of the last expression's value ("" none)
    error: str  # the exception it raised, formatted ("" none)

    @classmethod
    def of(cls, reply: Any) -> CodeResult:
        """Read one rank's result from its event.

        Args:
            reply: a `CodeRan` event.

        Returns:
            The rank's CodeResult.
        """
        return cls(reply.stdout, reply.result_repr, reply.error)

    def text(self) -> str:
        """The result as shown.

        Returns:
            What was printed, then the value's repr, then the error (each when there is one).
        """
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.result:
            parts.append(self.result)
        if self.error:
            parts.append(self.error.rstrip("\n"))
        return "\n".join(parts) if parts else "(nothing printed or returned)"


def _grouped(texts: Mapping[int, str]) -> list[tuple[str, tuple[int, ...]]]:
    groups = value_groups(dict(texts))
    return [(g.value, g.ranks) for g in (*reversed(groups[1:]), *groups[:1])]


def _text_block(title: str, texts: Mapping[int, str]) -> str:
    out = [title]
    for text, ranks in _grouped(texts):
        out.append(f"--- {format_ranks(ranks)} ---")
        out.append(text)
    return "\n".join(out)


def _html_block(title: str, texts: Mapping[int, str], bad: Mapping[int, bool]) -> str:
    rows = markup.join(
        markup.fmt("<div style='margin-top:4px'><b style='color:{}'>{}</b><pre style='margin:0;"
                   "font-size:11px'>{}</pre></div>",
                   "#b42318" if any(bad.get(r) for r in ranks) else "#555",
                   format_ranks(ranks), text) for text, ranks in _grouped(texts))
    return markup.fmt("<div style='font-size:12px'><b>{}</b>{}</div>", title, rows)


class CodeResults(dict[int, CodeResult]):
    """{rank: CodeResult} of one `Debugger.run(code)`; identical results grouped when shown."""

    def __init__(self, code: str, results: Mapping[int, CodeResult]) -> None:
        super().__init__(sorted(results.items()))
        self.code = code

    @property
    def errors(self) -> dict[int, str]:
        """The error on each rank where the code raised (rank -> formatted exception)."""
        return {r: c.error for r, c in self.items() if c.error}

    def __repr__(self) -> str:
        return _text_block(f"ran on {format_ranks(list(self))}: {self.code}",
                           {r: c.text() for r, c in self.items()})

    def _repr_html_(self) -> str:
        return _html_block(f"ran on {format_ranks(list(self))}: {self.code}",
                           {r: c.text() for r, c in self.items()},
                           {r: bool(c.error) for r, c in self.items()})


class RankStacks(dict[int, tuple[tuple[str, str], ...]]):
    """{rank: ((thread name, stack text), ...)} of one `Debugger.stacks()`."""

    def texts(self) -> dict[int, str]:
        """Each rank's stacks as one text (rank -> text).

        Returns:
            The threads' stacks, each headed by its thread's name.
        """
        return {r: "\n".join(f"thread {name}:\n{stack.rstrip()}" for name, stack in threads)
                for r, threads in self.items()}

    def __repr__(self) -> str:
        return _text_block(f"stacks of {format_ranks(list(self))}", self.texts())

    def _repr_html_(self) -> str:
        return _html_block(f"stacks of {format_ranks(list(self))}", self.texts(), {})
