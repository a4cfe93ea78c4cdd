"""BroadcastProgress: the constructor's state sync, rank by rank, chunk by chunk.

Before the broadcast, the verification exchange (walk-through step 2); then rank 0's parameters
and buffers are broadcast coalesced into flat chunks of at most 250 MiB per dtype, at most 2
in flight (step 3). Per rank: a progress bar of bytes done, bytes/s, the chunks in flight;
below, every chunk (dtype, size, tensors) with its state on each rank. Plain ipywidgets.
With many ranks (more than `rows_up_to`) ranks in the same state share one bar labelled with
their rank ranges, a line gives percentiles of progress and rate across ranks, and the chunk
table has one column per group of ranks whose chunks are in the same states.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import ipywidgets as w

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.model.event_model import CONSTRUCTION, EventModel, RankState
from ddpviz.model.rank_groups import MANY_RANKS, ValueGroup, rank_label, spread, value_groups
from ddpviz.units import human_bytes
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.replay_controls import Cursor


class ChunkState(NamedTuple):
    chunk: int
    dtype: str  # "" until its BroadcastChunkSent arrived
    nbytes: int
    n_tensors: int
    sent: int | None  # aligned ns
    done: int | None


class RankBroadcast(NamedTuple):
    """One rank's progress through the verification exchange and the broadcast."""

    rank: int
    verification: str  # "waiting" | "exchanging" | "passed" | "failed"
    state: str  # "waiting" | "broadcasting" | "done" | "skipped"
    src: int | None
    total_bytes: int
    bytes_done: int
    n_chunks: int
    chunks_done: int
    in_flight: tuple[int, ...]  # chunk indices launched and not done
    bytes_per_s: float | None  # done bytes over the time from start to the last chunk done
    seconds: float | None  # BroadcastFinished's own measure
    chunks: dict[int, ChunkState]  # the chunks sent or done, by index (others are pending)
    extent: int  # chunk rows: n_chunks, or one past the highest chunk seen if more

    def chunk(self, i: int) -> ChunkState | None:
        return self.chunks.get(i)

    @property
    def fraction(self) -> float:
        if self.state == "done":
            return 1.0
        return self.bytes_done / self.total_bytes if self.total_bytes else 0.0


def rank_broadcast(s: RankState) -> RankBroadcast:
    """Progress of one rank from its constructor facts (already cut at the cursor's time)."""
    verification = "waiting"
    if s.verify_result is not None:
        verification = ("passed" if isinstance(s.verify_result.event, ev.VerificationPassed)
                        else "failed")
    elif s.verify_started is not None:
        verification = "exchanging"
    started = s.broadcast_started
    # Only the chunks with an event are built: a declared n_chunks (up to 65,536 on each of
    # many ranks) is a count, never a loop.
    chunks: dict[int, ChunkState] = {}
    total = n_chunks = 0
    src = None
    if started is not None:
        b = started.event
        assert isinstance(b, ev.BroadcastStarted)
        total, n_chunks, src = b.total_bytes, b.n_chunks, b.src
    for i in sorted(s.chunks_sent.keys() | s.chunks_done.keys()):
        sent, done = s.chunks_sent.get(i), s.chunks_done.get(i)
        e = sent.event if sent is not None else None
        nbytes = (e.nbytes if isinstance(e, ev.BroadcastChunkSent)
                  else done.event.nbytes if done is not None
                  and isinstance(done.event, ev.BroadcastChunkDone) else 0)
        chunks[i] = ChunkState(i, e.dtype if isinstance(e, ev.BroadcastChunkSent) else "",
                               nbytes, e.n_tensors if isinstance(e, ev.BroadcastChunkSent)
                               else 0, sent.t if sent else None, done.t if done else None)
    done_bytes = sum(c.nbytes for c in chunks.values() if c.done is not None)
    in_flight = tuple(c.chunk for c in chunks.values() if c.sent is not None and c.done is None)
    last_done = max((c.done for c in chunks.values() if c.done is not None), default=None)
    rate = None
    if started is not None and last_done is not None and last_done > started.t:
        rate = done_bytes / ((last_done - started.t) / 1e9)
    seconds = None
    if s.broadcast_finished is not None:
        f = s.broadcast_finished.event
        assert isinstance(f, ev.BroadcastFinished)
        seconds = f.seconds
        state = "done"
    elif started is not None:
        state = "broadcasting"
    elif s.maps:
        state = "skipped"  # init_sync=False: buckets were assigned without a broadcast
    else:
        state = "waiting"
    return RankBroadcast(s.rank, verification, state, src, total, done_bytes, n_chunks,
                         sum(c.done is not None for c in chunks.values()), in_flight, rate,
                         seconds, chunks, max(n_chunks, max(chunks, default=-1) + 1))


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{human_bytes(int(x))}/s"


_V_GLYPH = {"waiting": "○", "exchanging": "◔", "passed": "✔", "failed": "✘"}
_B_COLOUR = {"waiting": "#999", "broadcasting": "#4c78a8", "done": "#1e7b34",
             "skipped": "#8a6d00"}


MAX_GROUP_ROWS = 24  # bars drawn for groups of ranks; the rest are listed on one line
MAX_CHUNK_COLUMNS = 64  # columns (ranks or groups) of the chunk table; the rest are counted


class BroadcastProgress(EventView):
    """Each rank's progress through verification and the coalesced state broadcast.

    Kernel-side state: `progress` ({rank: RankBroadcast}), `bars` ({rank: FloatProgress}),
    `labels` ({rank: HTML}), `chunks_html`, `exchange_html`.

    Args:
        source: a Run, Session, Trace, `.ddpviz` path or list of events (see `EventView`).
        max_chunk_rows: chunks listed at most (those in flight or differing across ranks
            first); DDP's 250 MiB chunks make this a handful for most models.
        rows_up_to: one bar per rank up to this many ranks; above it one bar per group of
            ranks in the same state (`groups`, `group_bars`, `group_labels`), percentiles in
            `summary_html`.
    """

    def __init__(self, source: object = None, *, max_chunk_rows: int = 24,
                 rows_up_to: int = MANY_RANKS, **kwargs: Any) -> None:
        self.max_chunk_rows = max_chunk_rows
        self.rows_up_to = rows_up_to
        self.progress: dict[int, RankBroadcast] = {}
        self.bars: dict[int, w.FloatProgress] = {}
        self.labels: dict[int, w.HTML] = {}
        self.groups: list[ValueGroup[tuple[Any, ...]]] = []
        self.group_bars: list[w.FloatProgress] = []
        self.group_labels: list[w.HTML] = []
        self._key: tuple[Any, ...] | None = None
        super().__init__(source, **kwargs)

    @classmethod
    def embedded_in(cls, model: EventModel, **kwargs: Any) -> BroadcastProgress:
        return cls(model=model, embedded=True, controls=False, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.exchange_html = w.HTML()
        self.summary_html = w.HTML()
        self.rows_box = w.VBox()
        self.chunks_html = w.HTML()
        return [self.exchange_html, self.summary_html, self.rows_box, self.chunks_html]

    @property
    def grouped(self) -> bool:
        return len(self.progress) > self.rows_up_to

    def render(self, cursor: Cursor) -> bool:
        as_of = self.model.settled(CONSTRUCTION, cursor.as_of)
        key = (self.model.versions["construction"], as_of)
        if key == self._key:
            return False
        self._key = key
        states = self.model.construction(as_of)
        self.progress = {r: rank_broadcast(s) for r, s in states.items()}
        self._draw()
        return False

    def _draw(self) -> None:
        if self.grouped:
            self._draw_groups()
        else:
            self._draw_ranks()
        for name, value in (("exchange_html", self._exchange()),
                            ("summary_html", self._summary()), ("chunks_html", self._chunks())):
            widget = getattr(self, name)
            if widget.value != value:
                widget.value = value

    def _draw_groups(self) -> None:
        """One bar per group of ranks in the same state with the same bytes and chunks."""
        self.bars, self.labels = {}, {}
        groups = value_groups({r: _progress_key(p) for r, p in self.progress.items()})
        self.groups = sorted(groups, key=lambda g: (-self.progress[g.ranks[0]].fraction,
                                                    g.ranks[0]))
        shown = self.groups[:MAX_GROUP_ROWS]
        n = len(shown)
        if len(self.group_bars) != n:
            self.group_bars = [w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                               layout=w.Layout(width="220px"))
                               for _ in range(n)]
            self.group_labels = [w.HTML(layout=w.Layout(width="auto")) for _ in range(n)]
            self.group_heads = [w.HTML(layout=w.Layout(width="140px")) for _ in range(n)]
            self.more_html = w.HTML()
            self.rows_box.children = [w.HBox([head, bar, label]) for head, bar, label in
                                      zip(self.group_heads, self.group_bars,
                                          self.group_labels, strict=True)] + [self.more_html]
        rest = [r for g in self.groups[MAX_GROUP_ROWS:] for r in g.ranks]
        more = markup.fmt("<span style='font-size:12px;color:#555'>… and {} more groups: "
                          "ranks {}</span>", len(self.groups) - n,
                          _short(rank_label(rest), 400)) \
            if rest else ""
        if self.more_html.value != more:
            self.more_html.value = more
        for g, head, bar, label in zip(shown, self.group_heads, self.group_bars,
                                       self.group_labels, strict=True):
            p = self.progress[g.ranks[0]]
            title = markup.fmt("<b title='{}'>{} rank{} {}</b>", g.label, len(g.ranks),
                               "s" if len(g.ranks) != 1 else "", _short(g.label))
            if head.value != title:
                head.value = title
            if bar.value != p.fraction:
                bar.value = p.fraction
            style = "success" if p.state == "done" else ""
            if bar.bar_style != style:
                bar.bar_style = style
            text = self._label(p, len(g.ranks) > 1)
            if label.value != text:
                label.value = text

    def _summary(self) -> str:
        """Many ranks: percentiles of progress and rate across ranks."""
        if not self.grouped:
            return ""
        done = spread(p.fraction * 100 for p in self.progress.values())
        rates = spread(p.bytes_per_s for p in self.progress.values()
                       if p.bytes_per_s is not None)
        assert done is not None
        parts = [markup.fmt("done across {} ranks: min {:.0f}%, p10 {:.0f}%, median {:.0f}%, "
                            "p90 {:.0f}%, max {:.0f}%", done.n, done.min, done.p10, done.p50,
                            done.p90, done.max)]
        if rates is not None:
            parts.append(markup.fmt("rate p10 {}, median {}, p90 {} ({} ranks)",
                                    _rate(rates.p10), _rate(rates.p50), _rate(rates.p90),
                                    rates.n))
        behind = sorted(self.progress.values(), key=lambda p: (p.fraction, p.rank))
        if behind and behind[0].fraction < 1.0:
            parts.append(markup.fmt("furthest behind: {}", ", ".join(
                f"rank {p.rank} ({p.fraction * 100:.0f}%)" for p in behind[:5]
                if p.fraction < 1.0)))
        return markup.fmt("<div style='font-size:12px'>{}</div>", markup.join(parts, " · "))

    def _draw_ranks(self) -> None:
        self.groups, self.group_bars, self.group_labels = [], [], []
        ranks = sorted(self.progress)
        added = [r for r in ranks if r not in self.bars]
        for r in added:
            self.bars[r] = w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                           layout=w.Layout(width="220px"))
            self.labels[r] = w.HTML(layout=w.Layout(width="auto"))
        if added or len(self.rows_box.children) != len(ranks):
            self.rows_box.children = [
                w.HBox([w.HTML(markup.fmt("<b>rank {}</b>", r), layout=w.Layout(width="60px")),
                        self.bars[r], self.labels[r]]) for r in ranks]
        for r in ranks:
            p = self.progress[r]
            if self.bars[r].value != p.fraction:
                self.bars[r].value = p.fraction
            style = "success" if p.state == "done" else ""
            if self.bars[r].bar_style != style:
                self.bars[r].bar_style = style
            text = self._label(p)
            if self.labels[r].value != text:
                self.labels[r].value = text

    def _label(self, p: RankBroadcast, group: bool = False) -> str:
        v = f"{_V_GLYPH[p.verification]} verify"
        if p.state == "waiting":
            b = "broadcast: waiting"
        elif p.state == "skipped":
            b = "broadcast skipped (init_sync=False)"
        else:
            role = ("sends" if p.src == p.rank else
                    f"receive{'' if group else 's'} from rank {p.src}")
            flight = (" · in flight: " + ", ".join(
                f"#{c} ({p.chunks[c].dtype} {human_bytes(p.chunks[c].nbytes)})"
                for c in p.in_flight) if p.in_flight else "")
            took = (f" · {p.seconds * 1e3:,.1f} ms" if p.seconds is not None and not group
                    else "")
            b = (f"{role}: {human_bytes(p.bytes_done)} / {human_bytes(p.total_bytes)} · "
                 f"{p.chunks_done}/{p.n_chunks} chunks"
                 + ("" if group else f" · {_rate(p.bytes_per_s)}") + f"{flight}{took}")
        colour = _B_COLOUR[p.state]
        return markup.fmt("<span style='font-size:12px'>{} → <span style='color:{}'>"
                          "{}</span></span>", v, colour, b)

    def _exchange(self) -> str:
        states = [p.verification for p in self.progress.values()]
        if not states:
            return "<i style='font-size:12px'>waiting for the ranks to build DDP</i>"
        n = len(states)
        counts = {s: states.count(s) for s in ("waiting", "exchanging", "passed", "failed")}
        parts = [f"{c} {s}" for s, c in counts.items() if c]
        total = max((p.total_bytes for p in self.progress.values()), default=0)
        chunks = max((p.n_chunks for p in self.progress.values()), default=0)
        plan = (f"; then {human_bytes(total)} in {chunks} chunk{'s' if chunks != 1 else ''} "
                "(≤ 250 MiB per dtype, ≤ 2 in flight)" if total else "")
        return markup.fmt("<div style='font-size:12px'><b>2 · verification exchange</b> "
                          "({} ranks: {}) → <b>3 · broadcast from rank 0</b>{}</div>", n,
                          ", ".join(parts), plan)

    def shown_chunks(self) -> list[int]:
        """Chunk rows drawn: all when few; else those in flight or in different states on
        different ranks, plus the first and last few, up to max_chunk_rows. Linear in the
        chunks with events: a chunk none of them names is pending on every rank."""
        n = max((p.extent for p in self.progress.values()), default=0)
        if n <= self.max_chunk_rows:
            return list(range(n))
        states: dict[int, set[str]] = {}
        seen: dict[int, int] = {}  # chunk -> ranks with an event of it
        for p in self.progress.values():
            for i, c in p.chunks.items():
                states.setdefault(i, set()).add(_chunk_state(c))
                seen[i] = seen.get(i, 0) + 1
        busy = set()
        for i, found in states.items():
            if seen[i] < len(self.progress):
                found.add("pending")
            if "in flight" in found or len(found) > 1:
                busy.add(i)
        edges = {0, 1, 2, n - 3, n - 2, n - 1}
        return sorted(set(sorted(busy - edges)[: self.max_chunk_rows - len(edges)]) | edges)

    def chunk_columns(self, shown: list[int]) -> list[tuple[int, ...]]:
        """The chunk table's columns: one rank each, or (many ranks) groups of ranks whose
        shown chunks are in the same states."""
        if not self.grouped:
            return [(r,) for r in sorted(self.progress)]
        states = {r: tuple(_chunk_state(p.chunk(i)) for i in shown)
                  for r, p in self.progress.items()}
        return sorted((g.ranks for g in value_groups(states)), key=lambda rs: rs[0])

    def _chunks(self) -> str:
        shown = self.shown_chunks()
        if not shown:
            return ""
        columns = self.chunk_columns(shown)
        hidden = columns[MAX_CHUNK_COLUMNS:]
        columns = columns[:MAX_CHUNK_COLUMNS]
        head = markup.join(markup.fmt("<th title='{}'>r{}</th>", _short(rank_label(g), 400),
                                      _short(rank_label(g))) for g in columns)
        rows = []
        previous = -1
        for i in shown:
            if i != previous + 1:
                rows.append(markup.fmt("<tr><td colspan={} style='color:#999'>… chunks "
                                       "{}-{}: the same state on every rank</td></tr>",
                                       2 + len(columns), previous + 1, i - 1))
            previous = i
            info = next((c for p in self.progress.values()
                         if (c := p.chunk(i)) is not None and c.dtype), None)
            desc = (f"{info.dtype}, {human_bytes(info.nbytes)}, {info.n_tensors} tensors"
                    if info else "not launched yet")
            cells: list[markup.Markup] = []
            for g in columns:
                mine = [self.progress[r].chunk(i) for r in g]
                state = _chunk_state(mine[0])
                if state == "pending":
                    cells.append(markup.Markup("<td style='color:#999'>pending</td>"))
                elif state == "in flight":
                    cells.append(markup.Markup("<td style='background:#d6e6f5'>in flight</td>"))
                else:
                    took = spread((c.done - c.sent) / 1e6 for c in mine
                                  if c is not None and c.done is not None and c.sent is not None)
                    assert took is not None
                    if took.n == 1:
                        cells.append(markup.fmt("<td style='background:#dff3dc'>done "
                                                "{:,.2f} ms</td>", took.p50))
                    else:
                        cells.append(markup.fmt(
                            "<td style='background:#dff3dc' title='min {:,.2f}, p90 {:,.2f}, "
                            "max {:,.2f} ms'>done, median {:,.2f} ms</td>", took.min, took.p90,
                            took.max, took.p50))
            rows.append(markup.fmt("<tr><td>#{}</td><td>{}</td>{}</tr>", i, desc,
                                   markup.join(cells)))
        more = markup.fmt("<div style='font-size:11px;color:#555'>… and {:,} more columns "
                          "(groups of ranks), {:,} ranks</div>", len(hidden),
                          sum(len(g) for g in hidden)) if hidden else ""
        return markup.fmt("<table style='font-size:11px;border-collapse:collapse'><tr>"
                          "<th>chunk</th><th>contents</th>{}</tr>{}</table>{}", head,
                          markup.join(rows), more)


def _progress_key(p: RankBroadcast) -> tuple[Any, ...]:
    """What a grouped bar shows: ranks equal in it share one bar."""
    return (p.state, p.verification, p.src == p.rank, p.src, p.total_bytes, p.bytes_done,
            p.n_chunks, p.chunks_done, p.in_flight)


def _short(label: str, limit: int = 40) -> str:
    """A rank-range label cut to `limit` characters (the full one goes in a tooltip)."""
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _chunk_state(c: ChunkState | None) -> str:
    if c is None or c.sent is None:
        return "pending"
    return "in flight" if c.done is None else "done"
