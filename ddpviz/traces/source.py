"""What counts as a run: the one door every verb (diagnose, report, advise, the dashboard,
`listen(follow=)`) turns what the user handed over into a run through, with one set of errors,
and which of a run's files' end records count (See [Note: whose end record counts]).

A run is a `.ddpviz` path, a folder of them, several paths (one per rank, merged), a `Trace`,
a live `Session` or `ddpviz.Run`, anything else with a `.trace`, or an iterable of events. Live
objects are recognised by their shape (`LiveRun`, `LiveSession`): traces/ never imports the
sessions or the launcher (tests/test_layers.py).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from ddpviz.events import Event
from ddpviz.findings import format_ranges
from ddpviz.traces.fileformat import SUFFIX, End, TraceError, read_end
from ddpviz.traces.trace import Trace

Kind = Literal["files", "trace", "session", "run", "events"]

ACCEPTED = ("Pass a ddpviz.Run, a Session (ddpviz.listen()), a Trace, the path of a .ddpviz "
            "file or of a folder of them, or a list of events.")


class SourceError(ValueError):
    """What was handed over is not a run ddpviz can read; the message says what was wrong and
    what to pass. Each kind also is the builtin error it used to be (TypeError, OSError)."""


class SourceTypeError(SourceError, TypeError):
    """An object that is no kind of run (an int, a dict, ...)."""


class SourceMissingError(SourceError, FileNotFoundError):
    """A path with no file or folder under it, or a folder with no trace in it."""


class SourceReadError(SourceError, OSError):
    """A trace file that exists but cannot be read (permissions, I/O)."""


@runtime_checkable
class LiveSession(Protocol):
    """What the verbs read of a live session (`ddpviz.Session`, also `listen(follow=DIR)`'s):
    its growing trace, its collector (stats, and `ended` for a followed folder), subscribers."""

    @property
    def trace(self) -> Trace: ...
    @property
    def collector(self) -> Any: ...
    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False,
                  replay: bool = False, history: Callable[[Trace], None] | None = None
                  ) -> Callable[[], None]: ...


@runtime_checkable
class LiveRun(Protocol):
    """What the verbs read of a launch (`ddpviz.Run` is one): its session, whether it still
    runs, and how it was started. A protocol, so that readers never import the launcher."""

    @property
    def session(self) -> Any: ...  # a LiveSession
    @property
    def status(self) -> str: ...  # "running" | "finished" | ...
    nprocs: int
    backend: str


@dataclass
class RunSource:
    """A run, as every verb reads it.

    `kind` says what was handed over: "files" (a path, a folder, several paths: read and
    merged into `trace`), "trace" (a Trace, or an object's `.trace`), "session" and "run" (live:
    `live` is the Session or the Run; `trace` grows), "events" (an iterable of events: `trace`
    is None, `events` is the iterable, not yet read)."""

    kind: Kind
    trace: Trace | None
    label: str
    events: Iterable[Event] = ()
    live: Any = None
    files: tuple[Path, ...] = ()
    file_ranks: tuple[FileRanks, ...] = ()  # per file of `files`: the rank it says it is
    _ended: Mapping[int, End] | None = field(default=None, init=False, repr=False)
    _end_problems: tuple[str, ...] = field(default=(), init=False, repr=False)
    _collected: Trace | None = field(default=None, init=False, repr=False)

    @property
    def running(self) -> bool:
        """Whether events may still arrive: a Run whose status is "running", a Session not
        closed (a followed folder's included); False for files, Traces and events."""
        if self.kind == "run":
            return str(getattr(self.live, "status", "")) == "running"
        if self.kind == "session":
            return not bool(getattr(self.live, "closed", False))
        return False

    @property
    def ended(self) -> Mapping[int, End] | None:
        """The ranks whose trace file ends with its end record (they finished: none is named
        as hung), by rank: the files' own (kind "files"), a followed folder's as read so far
        (kind "session"); None where the source cannot tell. A record that does not count
        (See [Note: whose end record counts]) is warned about once (`end_problems`)."""
        if self.kind == "files":
            if self._ended is None:
                ends = file_ends(self.files, self.file_ranks or None)
                self._ended, self._end_problems = ends.ended, ends.problems
                _warn(ends.problems, 4)  # (at the verb's caller)
            return self._ended
        session = self.live.session if self.kind == "run" else self.live
        ended = getattr(getattr(session, "collector", None), "ended", None)
        return ended if isinstance(ended, Mapping) else None

    @property
    def end_problems(self) -> tuple[str, ...]:
        """Why end records in the files were not counted, one message each (kind "files"; a
        followed folder says its own in its `problems`)."""
        if self.kind == "files" and self._ended is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (returned here instead)
                _ = self.ended
        return self._end_problems

    @property
    def gathered(self) -> Trace | None:
        """`trace`, or the Trace `as_trace()` gathered from bare events (None before that: the
        events are then still to be read, once)."""
        return self.trace if self.trace is not None else self._collected

    def as_trace(self) -> Trace:
        """The run's events as a Trace.

        Returns:
            `trace`; for bare events, a Trace gathered from them (once: later calls return
            the same one).
        """
        if self.trace is not None:
            return self.trace
        if self._collected is None:
            self._collected = Trace(e for e in self.events if isinstance(e, Event))
        return self._collected


def open_run(source: object, *, refusal: str = "cannot read") -> RunSource:
    """The run `source` is, read where it is recorded.

    Args:
        source: a `.ddpviz` path, a folder of `.ddpviz` files (every one of them, merged), a
            list of such paths, a `Trace`, a `ddpviz.Run`, a `Session`, anything with a
            `.trace` Trace, an iterable of events, or a `RunSource` opened before (returned
            as it is: one read serves several verbs).
        refusal: the caller's words for refusing an object that is no run, before "a TYPE"
            (e.g. "diagnose() cannot read").

    Returns:
        The `RunSource`; files are read now (`Trace.load`), live objects are not copied.

    Raises:
        SourceTypeError: `source` is no kind of run.
        SourceMissingError: a path with nothing under it, or a folder without a trace.
        SourceReadError: a file that cannot be read.
        TraceError: a file that is not a readable trace (see `Trace.load`).
    """
    if isinstance(source, RunSource):  # opened already: read once, handed to every verb
        return source
    if isinstance(source, (str, os.PathLike)):
        return _open_files([source])
    if (isinstance(source, (list, tuple)) and source
            and all(isinstance(p, (str, os.PathLike)) for p in source)):
        return _open_files(list(source))  # several files: one per rank, merged
    if isinstance(source, Trace):
        return RunSource("trace", source, "trace")
    if isinstance(source, LiveRun):
        return RunSource("run", source.session.trace, "run", live=source)
    if isinstance(source, LiveSession):
        return RunSource("session", source.trace, "session", live=source)
    inner = getattr(source, "trace", None)
    if isinstance(inner, Trace):
        return RunSource("trace", inner, "trace")
    if isinstance(source, Iterable):
        return RunSource("events", None, "events", events=source)
    raise SourceTypeError(f"ddpviz: {refusal} a {type(source).__name__}.\n{ACCEPTED}")


def trace_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The trace files `paths` name: a file as itself, a folder as its `*.ddpviz` files.

    Args:
        paths: files and folders, as the user named them (messages quote them so).

    Returns:
        The files, in the order named; a folder's sorted by name.

    Raises:
        SourceMissingError: a path with nothing under it, or a folder without a trace.
    """
    files: list[Path] = []
    for arg in paths:
        path, said = Path(arg), os.fspath(arg)
        if path.is_dir():
            found = sorted(p for p in path.glob(f"*{SUFFIX}") if p.is_file())
            if not found:
                raise SourceMissingError(
                    f"ddpviz: the folder {said!r} holds no *{SUFFIX} file.\nPass the trace "
                    "files, or the folder `ddpviz record --out` or Trace.save wrote them to.")
            files += found
        elif not path.exists():
            raise SourceMissingError(
                f"ddpviz: no trace file {said!r}: there is no file or folder by that name.\n"
                f"Pass the path of a {SUFFIX} file (Trace.save, `ddpviz record`, a Session's "
                "record=) or of a folder of them; a relative path starts at the current "
                "directory.")
        else:
            files.append(path)
    return files


def _open_files(paths: Sequence[str | os.PathLike[str]]) -> RunSource:
    files = trace_files(paths)
    traces = []
    for f in files:
        try:
            traces.append(Trace.load(f))
        except OSError as e:
            raise SourceReadError(f"ddpviz: cannot read {str(f)!r}: {e.strerror or e}.\n"
                                  f"Pass a {SUFFIX} trace file or a folder of them.") from e
    ranks = tuple(FileRanks.of(t) for t in traces)
    trace = traces[0] if len(traces) == 1 else Trace.merge(traces)
    label = (f"trace {Path(paths[0]).name}" if len(paths) == 1
             else f"{len(files)} trace files")
    return RunSource("files", trace, label, files=tuple(files), file_ranks=ranks)


# [Note: whose end record counts]
# An END frame says "this file's writer closed it" (See [Note: a rank's end in its file],
# fileformat.py), and diagnose reads it as "this rank ended cleanly, it is not hung" (See [Note:
# ranks that ended cleanly], diagnosis.py): a record counted for the wrong rank turns a hang
# into a clean end. A trace folder is shared (anyone who can write there can plant a file, and
# files get copied and misplaced), so a record counts only for the rank of its own file: the
# rank it names must be the rank its file's header says the file is (a Sender writes both),
# every event in the file must be that rank's, and no other file may say it is that rank's. Of
# two files claiming one rank only one can be its own, and which cannot be told: neither's
# record counts, and both are named. A record that does not count is said (a warning; `ddpviz
# diagnose` prints it), never dropped silently: the rank then reads as having no end record,
# the verdict ddpviz gives without one. follow.py holds the same rules for a folder followed
# live.


class FileRanks(NamedTuple):
    """What a trace file says of its rank: its header's `rank` (an int in a rank's own file,
    as a Sender writes it; absent from a saved or merged trace) and the ranks of its events."""

    header: object
    events: frozenset[int]

    @classmethod
    def of(cls, trace: Trace) -> FileRanks:
        return cls(trace.meta.get("rank"), frozenset(trace.ranks))


class FileEnds(NamedTuple):
    """The end records that count, by rank, and why the others do not (one message each)."""

    ended: dict[int, End]
    problems: tuple[str, ...]


_CHECK = ("\nA rank's file holds only its own events and end record: this one is damaged, "
          "misplaced or planted; check where it came from.")


def file_ends(files: Sequence[Path], ranks: Sequence[FileRanks] | None = None) -> FileEnds:
    """The end records of the files that count (See [Note: whose end record counts]).

    Args:
        files: trace files; one that cannot be read has no end record.
        ranks: per file, what it says of its rank (`FileRanks.of` its loaded trace); None:
            each file is loaded here for it.

    Returns:
        The records that count by rank, and a message for each that does not.
    """
    files = list(files)
    ends: list[End | None] = []
    for f in files:
        end = None
        with contextlib.suppress(OSError):
            end = read_end(f)
        ends.append(end)
    if all(e is None for e in ends):
        return FileEnds({}, ())  # (nothing to count: no file is loaded for it)
    said = list(ranks) if ranks is not None else [_ranks_of(f) for f in files]
    claims: dict[int, list[Path]] = {}  # header rank -> the files saying they are its
    seen: set[tuple[int, int]] = set()  # (a file named twice is one claim)
    for f, r in zip(files, said, strict=True):
        if type(r.header) is int:
            with contextlib.suppress(OSError):
                st = os.stat(f)
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            claims.setdefault(r.header, []).append(f)
    out: dict[int, End] = {}
    problems: list[str] = []
    for f, r, end in zip(files, said, ends, strict=True):
        if end is None:
            continue
        rank = r.header
        if type(rank) is not int:
            problems.append(f"ddpviz: {str(f)!r} ends with an end record for rank {end.rank}, "
                            "but its header names no rank (it is not a rank's own file): the "
                            f"record is not counted.{_CHECK}")
        elif end.rank != rank:
            problems.append(f"ddpviz: {str(f)!r} is rank {rank}'s file by its header but ends "
                            f"with an end record for rank {end.rank}: the record is not "
                            f"counted, for either rank.{_CHECK}")
        elif r.events - {rank}:
            others = format_ranges(r.events - {rank}, most=8)
            problems.append(f"ddpviz: {str(f)!r} is rank {rank}'s file by its header but holds "
                            f"events of other ranks ({others}): its end record is not counted."
                            f"{_CHECK}")
        elif len(claims.get(rank, ())) == 1:
            out[rank] = end
    for rank, paths in claims.items():
        if len(paths) > 1 and any(e is not None and r.header == rank
                                  for r, e in zip(said, ends, strict=True)):
            named = ", ".join(repr(str(p)) for p in paths[:4]) + (", ..." if len(paths) > 4
                                                                  else "")
            problems.append(
                f"ddpviz: {len(paths)} files say they are rank {rank}'s: {named}. Only one can "
                f"be, and which cannot be told, so no end record counts for rank {rank} (it "
                "reads as not having ended).\nRemove the files that are not rank "
                f"{rank}'s (a copy, another run's, a planted one) and read the run again.")
    return FileEnds(out, tuple(dict.fromkeys(problems)))  # (a file named twice: once)


def ended_files(files: Iterable[Path], ranks: Sequence[FileRanks] | None = None
                ) -> dict[int, End]:
    """The end records of the files that have one and count for their rank (See [Note: a
    rank's end in its file], fileformat.py, and [Note: whose end record counts]); each one that
    does not count is warned about.

    Args:
        files: trace files; one that cannot be read has no end record.
        ranks: per file, what it says of its rank (see `file_ends`); None: read here.

    Returns:
        The end records by rank.
    """
    ends = file_ends(list(files), ranks)
    _warn(ends.problems, 3)
    return ends.ended


def _ranks_of(path: Path) -> FileRanks:
    """What the file at `path` says of its rank, read whole (nothing when it cannot be)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a torn tail: said when the file is loaded)
        try:
            return FileRanks.of(Trace.load(path))
        except (OSError, TraceError):
            return FileRanks(None, frozenset())


def _warn(problems: Iterable[str], stacklevel: int) -> None:
    for message in problems:
        warnings.warn(message, UserWarning, stacklevel=stacklevel)


def job_folder(folder: str | os.PathLike[str]) -> Path:
    """The folder a running job records into, checked before it is followed as its files
    grow (`listen(follow=DIR)`); it may hold no file yet (ranks that have not started).

    Args:
        folder: the job's `ddpviz record --out` folder.

    Returns:
        It, as a Path.

    Raises:
        SourceMissingError: there is no folder there.
    """
    path = Path(folder)
    if not path.is_dir():
        raise SourceMissingError(
            f"ddpviz: no folder {str(path)!r} to attach to.\nPass the folder the job records "
            "into (`ddpviz record --out DIR`), as seen from this machine.")
    return path
