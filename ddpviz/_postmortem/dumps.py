"""Reading torch's Flight Recorder dumps: the JSON form (`_dump_fr_trace_json`) and the pickle
form (`_dump_fr_trace`, and the file the NCCL watchdog writes to `TORCH_FR_DUMP_TEMP_FILE` +
rank), into frozen `FrDump`s. Dumps are untrusted: pickles go through an unpickler that builds
only plain data and refuses every class, and every size is bounded before it sizes memory.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpviz._postmortem.callsite import Origin, call_site, origin
from ddpviz._postmortem.pickle_reader import PickleRefused, load_plain
from ddpviz.probes.stack_text import Frame

# Bounds on what a dump may hold (a real dump: TORCH_FR_BUFFER_SIZE entries, 2,000 by default).
MAX_FILE_BYTES = 256 * 2**20
MAX_FILES = 4096
MAX_ENTRIES = 1_000_000
MAX_TENSORS_PER_ENTRY = 4096
MAX_DIMS = 64
MAX_GROUPS = 65536
MAX_GROUP_RANKS = 1 << 20
MAX_STRING = 4096
MAX_FRAMES = 256
KEPT_FRAMES = 8  # innermost frames kept per entry (for the report)
SHOWN_TENSORS = 8  # shapes of one entry shown in its description
# Shapes and frames of one dump together; a pickle can repeat one big list by reference, so
# per-entry bounds alone do not bound what parsing builds.
MAX_ITEMS_PER_DUMP = 16_000_000
MAX_JSON_BYTES = MAX_FILE_BYTES
MAX_JSON_VALUES = 16_000_000  # values one JSON dump may build (~1 GiB at worst)

# The dump versions whose fields were checked against real dumps (torch 2.13 writes "2.10").
TESTED_VERSIONS = ("2.10",)
REQUIRED_TOP = ("version", "pg_config", "entries")
REQUIRED_ENTRY = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id",
                  "profiling_name", "input_sizes", "input_dtypes", "output_sizes",
                  "output_dtypes", "state", "retired", "is_p2p", "time_created_ns")
KNOWN_ENTRY = (*REQUIRED_ENTRY, "frames", "op_id", "thread_id", "thread_name",
               "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms",
               "duration_ms")
KNOWN_TOP = (*REQUIRED_TOP, "comm_lib_version", "pg_status", "nccl_comm_state", "nccl_version")

# Flight Recorder writes c10 ScalarType names; ddpviz speaks torch's dtype names.
DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "Int": ("int32", 4),
    "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1), "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
}

_RANK_SUFFIX = re.compile(r"(\d+)(\.json|\.pkl|\.pickle)?$")


class DumpError(ValueError):
    """A Flight Recorder dump ddpviz cannot read (what was wrong, in which file, the fix)."""


@dataclass(frozen=True)
class FrEntry:
    """One Flight Recorder entry: a collective (or p2p op) as one rank launched it."""

    record_id: int  # position in the rank's ring buffer history
    pg: str  # process group name ("0" for the default group)
    pg_desc: str  # "default_pg", "undefined", ...
    seq: int  # collective_seq_id (or p2p_seq_id when is_p2p)
    is_p2p: bool
    backend: str  # "gloo", "nccl", ...
    op: str  # "all_reduce", "broadcast", ... (profiling_name without the backend)
    input_sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]  # torch names of the input dtypes
    output_sizes: tuple[tuple[int, ...], ...]
    state: str  # "scheduled" | "started" | "completed" (gloo only ever says "scheduled")
    completed: bool  # state "completed", or retired (gloo retires a work once it finished)
    time_created_ns: int
    frames: tuple[str, ...]  # "function (file:line)", innermost first (KEPT_FRAMES of them)
    # the user's frame nearest the collective, from the whole stack (callsite.py); None when
    # the entry has no stack (the JSON form) or no frame of the user's
    site: Frame | None = None
    origin: Origin = ""  # "ddp": DDP launched it; "job": the job's code did; "": no stack

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.input_sizes)

    @property
    def dtype(self) -> str:
        return self.dtypes[0] if len(set(self.dtypes)) == 1 else "/".join(self.dtypes)

    @property
    def nbytes(self) -> int:
        sizes = {n: s for n, s in DTYPES.values()}
        return sum(math.prod(s) * sizes.get(d, 0)
                   for s, d in zip(self.input_sizes, self.dtypes, strict=False))

    def describe(self) -> str:
        """'all_reduce [244] float32' (sizes as the recorder logged them; 'barrier'); the
        first SHOWN_TENSORS shapes of a coalesced collective, then their number."""
        shapes = ", ".join("[" + ", ".join(map(str, s)) + "]"
                           for s in self.input_sizes[:SHOWN_TENSORS])
        if len(self.input_sizes) > SHOWN_TENSORS:
            shapes += f", ... ({len(self.input_sizes):,} tensors)"
        dtype = self.dtype if len(self.dtype) <= 64 else self.dtype[:61] + "..."
        return " ".join(x for x in (self.op, shapes, dtype) if x)


@dataclass(frozen=True)
class FrDump:
    """One rank's dump."""

    rank: int
    source: str  # file path, or "<dict n>" for loaded data
    version: str
    groups: Mapping[str, tuple[str, tuple[int, ...]]]  # pg name -> (desc, global ranks)
    entries: tuple[FrEntry, ...]
    unknown_fields: tuple[str, ...]  # entry fields this ddpviz does not know (newer torch)


def load_plain_pickle(data: bytes) -> Any:
    """Plain data from a pickle, through ddpviz's own bounded interpreter (pickle_reader.py):
    no class is ever looked up and every size is bounded while parsing."""
    try:
        return load_plain(data)
    except PickleRefused as e:
        raise DumpError(f"ddpviz: not a Flight Recorder pickle: {e}.") from None


def load_plain_json(data: bytes) -> Any:
    """JSON, its size and the number of values it can build bounded before parsing."""
    if len(data) > MAX_JSON_BYTES:
        raise DumpError(f"ddpviz: a JSON dump of {len(data):,} bytes, more than "
                        f"{MAX_JSON_BYTES:,}.")
    # every value but the first follows a ',' or opens with '[' or '{' (also counted inside
    # strings: an over-estimate), so this bounds what json.loads builds before it runs
    values = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    if values > MAX_JSON_VALUES:
        raise DumpError(f"ddpviz: a JSON dump of about {values:,} values, more than "
                        f"{MAX_JSON_VALUES:,}; a Flight Recorder dump holds far fewer.")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise DumpError(f"ddpviz: not valid JSON ({_short(str(e))}).") from None


def _read_file(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DumpError(f"ddpviz: {path} is {size:,} bytes, more than the {MAX_FILE_BYTES:,} a "
                        "Flight Recorder dump can reasonably hold; is it a dump?")
    with path.open("rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise DumpError(f"ddpviz: {path} grew past {MAX_FILE_BYTES:,} bytes while it was read; "
                        "is it a dump?")
    reader = (load_plain_json if data[:1] in (b"{", b"[") or data[:1].isspace()
              else load_plain_pickle if data[:1] == b"\x80" else None)
    if reader is None:
        raise DumpError(f"ddpviz: {path} is neither a JSON nor a pickled Flight Recorder dump "
                        f"(starts with {data[:8]!r}).")
    try:
        return reader(data)
    except DumpError as e:
        raise DumpError(f"{e} (file {path})\nPass the files torch's Flight Recorder wrote "
                        "(TORCH_FR_DUMP_TEMP_FILE, _dump_fr_trace or _dump_fr_trace_json).") \
            from None


def rank_from_name(path: Path) -> int | None:
    """torch names dumps prefix + rank (`TORCH_FR_DUMP_TEMP_FILE` + rank)."""
    m = _RANK_SUFFIX.search(path.name)
    return int(m.group(1)) if m and len(m.group(1)) <= 7 else None


def dump_files(folder: Path) -> list[Path]:
    """The files of a dump folder that end in a rank number (hidden files skipped)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                   and rank_from_name(p) is not None)
    if not files:
        raise DumpError(f"ddpviz: no Flight Recorder dumps in {folder}: expected files named "
                        "PREFIX<rank> (what TORCH_FR_DUMP_TEMP_FILE=PREFIX writes), e.g. "
                        "'fr_0', 'fr_1.json'.")
    if len(files) > MAX_FILES:
        raise DumpError(f"ddpviz: {folder} holds {len(files):,} dump files, more than "
                        f"{MAX_FILES:,}; point at one job's dumps.")
    return files


def load_dumps(dumps: str | os.PathLike[str] | Iterable[Any] | Mapping[int, Any]
               ) -> list[FrDump]:
    """Dumps from a folder, a list of paths, a list of loaded dicts (rank = position, unless
    the dict has "rank"), or {rank: dict or path}. Sorted by rank."""
    items: list[tuple[int | None, str, Any]] = []
    if isinstance(dumps, (str, os.PathLike)):
        path = Path(dumps)
        if path.is_dir():
            items = [(rank_from_name(p), str(p), p) for p in dump_files(path)]
        elif path.is_file():
            items = [(rank_from_name(path), str(path), path)]
        else:
            raise DumpError(f"ddpviz: no such dump folder or file: {path}.")
    elif isinstance(dumps, Mapping):
        items = [(int(r), str(v) if isinstance(v, (str, os.PathLike)) else f"<dict rank {r}>",
                  v) for r, v in dumps.items()]
    else:
        for i, v in enumerate(dumps):
            if isinstance(v, (str, os.PathLike)):
                items.append((rank_from_name(Path(v)), str(v), Path(v)))
            else:
                items.append((i, f"<dict {i}>", v))
    out: list[FrDump] = []
    for rank, source, value in items[:MAX_FILES + 1]:
        data = _read_file(Path(value)) if isinstance(value, (str, os.PathLike)) else value
        if isinstance(data, Mapping) and isinstance(data.get("rank"), int):
            rank = data["rank"]
        if rank is None:
            raise DumpError(f"ddpviz: cannot tell which rank wrote {source}: name dump files "
                            "PREFIX<rank> as torch does, or pass {rank: dump}.")
        out.append(parse_dump(data, rank=rank, source=source))
    ranks = [d.rank for d in out]
    dup = sorted({r for r in ranks if ranks.count(r) > 1})
    if dup:
        raise DumpError(f"ddpviz: several dumps claim rank {dup[0]} "
                        f"({', '.join(d.source for d in out if d.rank == dup[0])}); pass one "
                        "job's dumps, one file per rank.")
    return sorted(out, key=lambda d: d.rank)


# --- validation -----------------------------------------------------------------------------

def _fail(source: str, what: str) -> DumpError:
    return DumpError(f"ddpviz: {source}: {what}")


def _int(v: Any, source: str, what: str, lo: int = -(2**62), hi: int = 2**62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(source, f"{what} must be an integer in [{lo}, {hi}], found {_short(v)}.")
    return v


def _str(v: Any, source: str, what: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_STRING:
        raise _fail(source, f"{what} must be a string of at most {MAX_STRING} characters, "
                    f"found {_short(v)}.")
    return v


def _short(v: Any) -> str:
    """A value for a message, never by str() or repr() of anything unvalidated (a container's
    repr walks all of it; an object's runs its code)."""
    if v is None or isinstance(v, (bool, float)) or (
            isinstance(v, int) and v.bit_length() <= 256):
        return repr(v)
    if isinstance(v, (str, bytes)) and len(v) < 80:
        return repr(v)[:80]
    if isinstance(v, (list, tuple, dict, str, bytes)):
        return f"a {type(v).__name__} of length {len(v)}"
    return f"a {type(v).__name__}"


def _key(k: Any) -> str:
    """A dict key for a message (keys of a parsed dump are str or int)."""
    return k[:40] if isinstance(k, str) else _short(k)[:40]


class _Budget:
    """Items (dimensions, frames) one dump may still build."""

    def __init__(self, source: str) -> None:
        self.left, self.source = MAX_ITEMS_PER_DUMP, source

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _fail(self.source, f"the dump holds more than {MAX_ITEMS_PER_DUMP:,} shape "
                        "dimensions and stack frames in all; a Flight Recorder dump of "
                        f"{MAX_ENTRIES:,} entries holds far fewer, so this is not one.")


def _sizes(v: Any, source: str, what: str, budget: _Budget) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, (list, tuple)) or len(v) > MAX_TENSORS_PER_ENTRY:
        raise _fail(source, f"{what} must be a list of at most {MAX_TENSORS_PER_ENTRY} shapes, "
                    f"found {_short(v)}.")
    budget.take(len(v))
    out = []
    for s in v:
        if not isinstance(s, (list, tuple)) or len(s) > MAX_DIMS:
            raise _fail(source, f"{what} holds {_short(s)}, not a shape of at most {MAX_DIMS} "
                        "dimensions.")
        budget.take(len(s))
        out.append(tuple(_int(d, source, f"a dimension in {what}", 0, 2**48) for d in s))
    return tuple(out)


def _version_error(source: str, version: Any, missing: Sequence[str],
                   unknown: Sequence[str]) -> DumpError:
    parts = [f"missing field(s) {', '.join(missing)}"] if missing else []
    parts += [f"unknown field(s) {', '.join(unknown[:12])}"] if unknown else []
    return _fail(source, f"Flight Recorder dump version {_short(version)} is not one ddpviz "
                 f"reads ({'; '.join(parts)}); ddpviz reads the format torch 2.13 writes "
                 f"(version {', '.join(TESTED_VERSIONS)}). Dump with that torch, or upgrade "
                 "ddpviz.")


def parse_dump(data: Any, *, rank: int, source: str) -> FrDump:
    """Validate one loaded dump (dict) and turn it into a FrDump."""
    if not isinstance(data, Mapping):
        raise _fail(source, f"a Flight Recorder dump is a dict, found {type(data).__name__}.")
    version = data.get("version")
    missing_top = [k for k in REQUIRED_TOP if k not in data]
    unknown_top = sorted(_key(k) for k in data if k not in KNOWN_TOP)
    if missing_top:
        raise _version_error(source, version, missing_top, unknown_top)
    version = _str(version, source, "version")
    if not re.fullmatch(r"\d{1,3}\.\d{1,3}", version) or int(version.split(".")[0]) != 2:
        raise _version_error(source, version, [], unknown_top)
    entries_raw = data["entries"]
    if not isinstance(entries_raw, (list, tuple)) or len(entries_raw) > MAX_ENTRIES:
        raise _fail(source, f"'entries' must be a list of at most {MAX_ENTRIES:,} entries, found "
                    f"{_short(entries_raw)}.")
    groups = _groups(data["pg_config"], source)
    budget = _Budget(source)
    entries, unknown = [], set()
    for i, e in enumerate(entries_raw):
        if not isinstance(e, Mapping):
            raise _fail(source, f"entry {i} is a {type(e).__name__}, not a dict.")
        missing = [k for k in REQUIRED_ENTRY if k not in e]
        extra = [_key(k) for k in e if k not in KNOWN_ENTRY]
        if missing:
            raise _version_error(source, version, missing, sorted(set(extra)))
        unknown.update(extra)
        entries.append(_entry(e, source, i, budget))
    return FrDump(rank=_int(rank, source, "rank", 0, MAX_GROUP_RANKS), source=source,
                  version=version, groups=groups, entries=tuple(entries),
                  unknown_fields=tuple(sorted(unknown)))


def _groups(v: Any, source: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    if not isinstance(v, Mapping) or len(v) > MAX_GROUPS:
        raise _fail(source, f"'pg_config' must be a dict of at most {MAX_GROUPS} groups, found "
                    f"{_short(v)}.")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, cfg in v.items():
        if not isinstance(cfg, Mapping):
            raise _fail(source, f"pg_config[{_short(key)}] is not a dict.")
        ranks_text = cfg.get("ranks", "[]")
        if isinstance(ranks_text, str):
            if len(ranks_text) > 16 * MAX_GROUP_RANKS:
                raise _fail(source, "a process group's rank list is too long.")
            ranks = _rank_list(ranks_text)
            if ranks is None:
                raise _fail(source, f"pg_config ranks {_short(ranks_text)} is not a list of "
                            "integers.")
        else:
            ranks = ranks_text
        if not isinstance(ranks, list) or len(ranks) > MAX_GROUP_RANKS:
            raise _fail(source, f"pg_config ranks must be a list, found {_short(ranks)}.")
        name = _str(cfg.get("name", key), source, "pg_config name") or _str(key, source, "pg")
        out[name or "0"] = (_str(cfg.get("desc", ""), source, "pg desc"),
                            tuple(_int(r, source, "a rank", 0, MAX_GROUP_RANKS) for r in ranks))
    return out


def _rank_list(text: str) -> list[int] | None:
    """'[0, 1, 2]' (how torch writes a group's ranks) -> [0, 1, 2]; None if it is anything
    else. Not json.loads: a string of nested or empty lists would build what it likes."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    body = body[1:-1].strip()
    if not body:
        return []
    out = []
    for part in body.split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit() or len(part) > 7:
            return None
        out.append(int(part))
    return out


def _entry(e: Mapping[str, Any], source: str, i: int, budget: _Budget) -> FrEntry:
    where = f"entry {i}"
    pg = e["process_group"]
    if not isinstance(pg, (list, tuple)) or len(pg) != 2:
        raise _fail(source, f"{where}: process_group must be (name, desc), found {_short(pg)}.")
    name = _str(e["profiling_name"], source, f"{where} profiling_name")
    backend, _, op = name.rpartition(":")
    in_sizes = _sizes(e["input_sizes"], source, f"{where} input_sizes", budget)
    out_sizes = _sizes(e["output_sizes"], source, f"{where} output_sizes", budget)
    raw_dtypes = e["input_dtypes"]
    if not isinstance(raw_dtypes, (list, tuple)) or len(raw_dtypes) > MAX_TENSORS_PER_ENTRY:
        raise _fail(source, f"{where}: input_dtypes must be a list, found {_short(raw_dtypes)}.")
    dtypes = tuple(DTYPES.get(d, (d, 0))[0] for d in
                   (_str(x, source, f"{where} dtype") for x in raw_dtypes))
    is_p2p = e["is_p2p"]
    if not isinstance(is_p2p, bool) or not isinstance(e["retired"], bool):
        raise _fail(source, f"{where}: is_p2p and retired must be booleans.")
    seq_key = "p2p_seq_id" if is_p2p else "collective_seq_id"
    state = _str(e["state"], source, f"{where} state")
    stack = _frames(e.get("frames"), source, where, budget)
    return FrEntry(
        record_id=_int(e["record_id"], source, f"{where} record_id", 0),
        pg=_str(pg[0], source, f"{where} process group name") or "0",
        pg_desc=_str(pg[1], source, f"{where} process group desc"),
        seq=_int(e[seq_key], source, f"{where} {seq_key}", 0),
        is_p2p=is_p2p, backend=backend, op=op, input_sizes=in_sizes, dtypes=dtypes,
        output_sizes=out_sizes, state=state,
        completed=state == "completed" or bool(e["retired"]),
        time_created_ns=_int(e["time_created_ns"], source, f"{where} time_created_ns", 0),
        frames=tuple(f"{f.func} ({f.file}:{f.line})" for f in stack[:KEPT_FRAMES]),
        site=call_site(stack), origin=origin(stack))


def _frames(v: Any, source: str, where: str, budget: _Budget) -> tuple[Frame, ...]:
    """An entry's Python stack, innermost first (the first MAX_FRAMES frames)."""
    if not isinstance(v, (list, tuple)):
        return ()
    budget.take(min(len(v), MAX_FRAMES))
    out = []
    for f in v[:MAX_FRAMES]:
        if isinstance(f, Mapping):
            name = _str(f.get("name", "?"), source, f"{where} frame name")
            file = _str(f.get("filename", "?"), source, f"{where} frame file")
            line = f.get("line", 0)
            line = line if isinstance(line, int) and not isinstance(line, bool) and \
                0 <= line < 2**31 else 0
            out.append(Frame(file, line, name))
    return tuple(out)
