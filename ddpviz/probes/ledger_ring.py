"""Each rank's last collectives in a crash-safe file: a fixed-size ring of the collectives the
rank issued (collectives.py's ledger) and of its DDP marks, mmap'ed MAP_SHARED in the run's
trace folder, written before each collective runs. What a rank wrote is in the page cache the
moment it is written, so it outlives the process however it ends (gloo's SIGABRT, torchrun's
SIGTERM, SIGKILL). After the job, `ring_findings` compares the rings position by position
(collective_compare.py) and names the first position where ranks differ. See [Note: the ring].

Standard library and msgspec only (no torch): `ddpviz diagnose` reads rings too.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ddpviz.findings import Finding
from ddpviz.probes.collective_compare import Entry, Mark, compare_at

# [Note: the ring]
# A mismatch at a call site that ran before (log_metrics' all_gather, one rank's size
# different at step 5 only) is not claimed in the store (See [Note: claiming a position],
# collective_check.py): only the comparison twice a second sees it, and gloo aborts one rank at
# once (SIGABRT) while torchrun SIGTERMs the others (no atexit): nothing is posted. So each
# rank also writes every collective it records, and every DDP mark, into the next slot of a
# ring file before the collective runs: the payload first, then the header's count of records
# written. The file is MAP_SHARED: the kernel keeps a killed process's writes. The ring holds
# the last SLOTS records of the rank (every group); a group's table (its name -> its global
# ranks) is written once per group into the header's area. Costly text is made once per call
# site (the site text, cached by the ledger) and the signature text per call (`_text`).
# After the job, the positions every rank's ring still holds are compared as the live check
# compares the store's histories, up to the least position every rank reached (a call in
# progress counts as reached: it was issued). The ring is only read after the job ended: a
# file a rank is still writing is never compared.

MAGIC = b"DDPVZRNG"
VERSION = 1
RING_FILE = "ddpviz-ledger-rank{rank}.ring"
SLOTS = 256  # records a ring holds
SLOT = 256  # bytes a record takes (its payload is cut to fit)
GROUPS_BYTES = 4096  # the group table's area
HEADER = 64
# magic, version, rank, world, slot size, slot count, (pad), job tag, written, groups' bytes
_HEAD = struct.Struct("<8sIIIIII QQI")
_WRITTEN_AT = 40
_GROUPS_LEN_AT = 48
_WRITTEN = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# a slot: its text's length, span (-1: still inside the call), the record's index among those
# the rank wrote, position, step, bucket, forward, asym, kind (1: a collective, 0: a mark);
# then its text: msgpack [group, op, sig, site] ([group] for a mark)
_SLOT_HEAD = struct.Struct("<Hiqqii3B")
_SPAN = struct.Struct("<i")
# bounds on what a file says (it is untrusted: See read_ring)
MAX_SLOT = 4096
MAX_SLOTS = 1 << 16
MAX_RANK = 1 << 20
MAX_SITE, MAX_SIG = 100, 60  # characters kept when a record does not fit its slot

_enc = msgspec.msgpack.Encoder()
_dec_text = msgspec.msgpack.Decoder(list[str])
_dec_groups = msgspec.msgpack.Decoder(dict[str, list[int]])


def job_tag(env: Mapping[str, str] = os.environ) -> int:
    """Which job a ring belongs to (a folder can hold rings of several runs): torchrun's run
    id and rendezvous address, hashed."""
    key = "|".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                                             "MASTER_PORT", "GROUP_WORLD_SIZE"))
    return zlib.crc32(key.encode())


class Ring:
    """This rank's ring file, open for writing (the training thread writes; callers hold the
    ledger's lock)."""

    def __init__(self, path: Path, rank: int, world: int, *, slots: int = SLOTS,
                 slot: int = SLOT, job: int | None = None) -> None:
        if not (64 <= slot <= MAX_SLOT and 0 < slots <= MAX_SLOTS):
            raise ValueError(f"a ring of {slots} slots of {slot} bytes")
        self.slots, self.slot = slots, slot
        self.room = slot - _SLOT_HEAD.size
        size = HEADER + GROUPS_BYTES + slots * slot
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _HEAD.pack_into(self.mm, 0, MAGIC, VERSION, rank, world, slot, slots, 0,
                        job_tag() if job is None else job, 0, 0)
        self.path = path
        self.n = 0  # records written
        self.groups: dict[str, list[int]] = {}

    def _group(self, name: str, ranks: Sequence[int]) -> None:
        self.groups[name] = list(ranks)
        data = _enc.encode(self.groups)
        if len(data) > GROUPS_BYTES:  # (thousands of groups: the later ones go untabled)
            return
        self.mm[HEADER:HEADER + len(data)] = data
        _U32.pack_into(self.mm, _GROUPS_LEN_AT, len(data))

    def text(self, group: str, op: str = "", sig: str = "", site: str = "") -> bytes:
        """A record's text, encoded (the caller keeps it per call site: See [Note: the ring])."""
        data = _enc.encode([group, op, sig, site] if op else [group])
        keep = MAX_SITE
        while len(data) > self.room and keep:  # cut to fit: the site's end is kept
            data = _enc.encode([group[:40], op[:40], sig[:MAX_SIG], site[-keep:]] if op
                               else [group[:40]])
            keep //= 2
        if len(data) > self.room:
            data = _enc.encode([group[:8], op[:8], "", ""] if op else [group[:8]])
        return data

    def write(self, group: str, ranks: Sequence[int], pos: int, step: int, bucket: int,
              text: bytes, forward: int = 0, asym: bool = False) -> int:
        """Write one record (`text` from `text()`: with an op, a collective, else a mark);
        returns its index (for `span`)."""
        if group not in self.groups:
            self._group(group, ranks)
        i = self.n
        off = HEADER + GROUPS_BYTES + (i % self.slots) * self.slot
        mm = self.mm
        n = len(text)
        _SLOT_HEAD.pack_into(mm, off, n, -1, i, pos, step, bucket, forward, asym,
                             text[0] == 0x94)  # (msgpack's array of 4: a collective)
        start = off + _SLOT_HEAD.size
        mm[start:start + n] = text
        self.n = i + 1
        _WRITTEN.pack_into(mm, _WRITTEN_AT, i + 1)
        return i

    def span(self, index: int, span: int) -> None:
        """The call written as record `index` returned, having taken `span` positions."""
        if self.n - index <= self.slots:
            _SPAN.pack_into(self.mm, HEADER + GROUPS_BYTES + (index % self.slots) * self.slot
                            + 2, span)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.mm.close()


# --- reading -----------------------------------------------------------------------------------


class RingError(ValueError):
    """A file that is not a readable ring (foreign, truncated, or sizes out of bounds)."""


@dataclass
class RankRing:
    """What one rank's ring held: per group, its collectives and marks (oldest first)."""

    rank: int
    world: int
    job: int
    written: int
    groups: dict[str, tuple[int, ...]]
    entries: dict[str, list[Entry]] = field(default_factory=dict)
    marks: dict[str, list[Mark]] = field(default_factory=dict)
    skipped: int = 0  # slots that did not decode


def read_ring(path: Path) -> RankRing:
    """One ring file, decoded. Every size read from it is bounded before it sizes anything;
    an undecodable slot is skipped (counted). Raises RingError for a file that is not a ring
    of this format or whose sizes are out of bounds or disagree with its length."""
    try:
        with open(path, "rb") as f:
            data = f.read(HEADER)
            if len(data) < HEADER or data[:8] != MAGIC:
                raise RingError(f"{path} is not a ddpviz ring (no ring header)")
            (_, version, rank, world, slot, slots, _, job, written,
             groups_len) = _HEAD.unpack_from(data, 0)
            if version != VERSION:
                raise RingError(f"{path} is a ring of format {version}, not {VERSION}")
            if not (_SLOT_HEAD.size + 8 <= slot <= MAX_SLOT and 0 < slots <= MAX_SLOTS
                    and rank < MAX_RANK and 0 < world <= MAX_RANK and rank < world
                    and groups_len <= GROUPS_BYTES):
                raise RingError(f"{path}: sizes out of bounds (slot {slot}, slots {slots}, "
                                f"rank {rank}, world {world})")
            # the rest is read only as far as the header says it goes (and one byte more, to
            # tell a padded file): a file's own length never sizes the read
            data += f.read(GROUPS_BYTES + slot * slots + 1)
    except OSError as exc:
        raise RingError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) != HEADER + GROUPS_BYTES + slot * slots:
        raise RingError(f"{path}: {len(data)} bytes, not the {HEADER + GROUPS_BYTES + slot * slots}"
                        " its header says (truncated or padded)")
    try:
        table = _dec_groups.decode(data[HEADER:HEADER + groups_len]) if groups_len else {}
    except (msgspec.DecodeError, msgspec.ValidationError):
        table = {}
    groups = {name: tuple(r for r in ranks if 0 <= r < world) for name, ranks in table.items()}
    ring = RankRing(rank, world, job, written, groups)
    base = HEADER + GROUPS_BYTES
    for i in range(max(0, written - slots), written):
        off = base + (i % slots) * slot
        length, span, index, pos, step, bucket, forward, asym, kind = _SLOT_HEAD.unpack_from(
            data, off)
        start = off + _SLOT_HEAD.size
        try:
            if index != i or length > slot - _SLOT_HEAD.size:
                raise ValueError
            text = _dec_text.decode(data[start:start + length])
            if len(text) != (4 if kind else 1):
                raise ValueError
        except (ValueError, msgspec.DecodeError):
            ring.skipped += 1
            continue
        if kind:
            group, op, sig, site = text
            ring.entries.setdefault(group, []).append(Entry(
                pos, span, op, sig, site, step, bool(asym), bucket, forward))
        else:
            ring.marks.setdefault(text[0], []).append(Mark(pos, step, bucket))
    return ring


@dataclass
class Rings:
    """A folder's rings: one per rank of one job, and what was left out (one line each)."""

    rings: dict[int, RankRing]
    skipped: list[str]


def read_rings(folder: str | os.PathLike[str], since: float | None = None) -> Rings:
    """Every rank's ring in `folder` (`ddpviz-ledger-rank*.ring`). A file that is not a ring,
    is damaged, names a rank other than its file name's, or belongs to another job than the
    newest ring's is left out, said in `skipped`; so is one last changed before `since` (a
    time.time(): an earlier run's, when the job's own ranks made none)."""
    found: list[tuple[float, Path]] = []
    skipped: list[str] = []
    for path in Path(folder).glob(RING_FILE.format(rank="*")):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                mtime = path.stat().st_mtime
                if since is not None and mtime < since:
                    skipped.append(f"{path} is older than the job")
                else:
                    found.append((mtime, path))
    rings: dict[int, RankRing] = {}
    newest = None
    for _, path in sorted(found, reverse=True):
        try:
            ring = read_ring(path)
        except RingError as exc:
            skipped.append(str(exc))
            continue
        if path.name != RING_FILE.format(rank=ring.rank):
            skipped.append(f"{path} says it is rank {ring.rank}'s ring")
            continue
        if newest is None:
            newest = ring
        if (ring.job, ring.world) != (newest.job, newest.world):
            skipped.append(f"{path} is another job's ring")
            continue
        rings[ring.rank] = ring
    return Rings(rings, skipped)


class _History:
    def __init__(self, entries: Iterable[Entry], marks: list[Mark]) -> None:
        self.by_pos = {e.pos: e for e in entries}
        self.marks = marks
        self.gap = False


AFTER = ("found after the job ended, from each rank's last collectives as its ring file "
         "(ddpviz-ledger-rank*.ring in the trace folder) held them: the job ended before the "
         "live comparison saw this call")


def ring_findings(rings: Rings | Mapping[int, RankRing]) -> list[Finding]:
    """The first position where the ranks' rings differ, per process group (at most one
    finding a group). Only groups whose every member left a ring are compared, from the first
    position every member's ring still holds up to the least position every member reached."""
    by_rank = rings.rings if isinstance(rings, Rings) else rings
    out: list[Finding] = []
    names = sorted({name for ring in by_rank.values() for name in ring.groups})
    for name in names:
        table = next((by_rank[r].groups[name] for r in sorted(by_rank)
                      if name in by_rank[r].groups), ())
        ranks = tuple(table)
        if len(ranks) < 2 or any(r not in by_rank for r in ranks):
            continue
        histories = {}
        start, horizon = -1, None
        for r in ranks:
            entries = by_rank[r].entries.get(name, [])
            marks = by_rank[r].marks.get(name, [])
            if not entries and not marks:
                break
            first = min([e.pos for e in entries] + [m.pos for m in marks])
            reach = max([e.pos + (0 if e.asym else max(e.span, 1)) for e in entries]
                        + [m.pos + 1 for m in marks])
            start = max(start, first)
            horizon = reach if horizon is None else min(horizon, reach)
            histories[r] = _History(entries, marks)
        else:
            assert horizon is not None
            positions = sorted({p for h in histories.values() for p in h.by_pos
                                if start <= p < horizon})
            for pos in positions:
                finding = compare_at(name, ranks, histories, pos, after=AFTER)
                if finding is not None:
                    out.append(finding)
                    break
    return out


def folder_findings(folder: str | os.PathLike[str], since: float | None = None
                    ) -> list[Finding]:
    """`ring_findings` of the rings in `folder` (`since`: as `read_rings`); [] when there are
    none or none differ."""
    return ring_findings(read_rings(folder, since))


# --- the writer's life in this process ---------------------------------------------------------


def open_ring(folder: str, rank: int, world: int) -> Ring | None:
    """This rank's ring in `folder`, or None when it cannot be made (said once, by
    `step_aside`)."""
    try:
        return Ring(Path(folder) / RING_FILE.format(rank=rank), rank, world)
    except Exception as exc:
        step_aside(f"cannot make it in {folder}: {exc!r}")
        return None


SAID_FILE = "ddpviz-ledger-said"  # made when a rank said a collective mismatch live


def mark_said(folder: str | os.PathLike[str]) -> None:
    """Note in `folder` that a rank of this job named a mismatch of its collectives live, so
    the rings' comparison after the job does not say it again (`said_since`)."""
    with contextlib.suppress(OSError):
        (Path(folder) / SAID_FILE).touch()


def said_since(folder: str | os.PathLike[str], since: float | None = None) -> bool:
    """Whether a rank marked `folder` (`mark_said`) since `since` (the job's start)."""
    try:
        made = (Path(folder) / SAID_FILE).stat().st_mtime
    except OSError:
        return False
    return since is None or made >= since


_said: list[str] = []


def step_aside(why: str) -> None:
    """The ring failed: the job runs on, said once."""
    if not _said:
        _said.append(why)
        print(f"ddpviz: stopped writing the ring of this rank's last collectives ({why}); the "
              "job runs on unaffected, but a mismatch that ends the job before the live "
              "comparison is no longer named after it.", file=sys.stderr)
