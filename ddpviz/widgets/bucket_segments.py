"""What the BucketMap draws, as plain data: one segment per parameter, one marker per size limit.

Pure functions of a BucketPlan's buckets (no plotly, no ipywidgets), so the picture can be
checked against the planner without a browser, and the figure code only copies lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ddpviz import markup
from ddpviz.plan import PlannedBucket, limit_text
from ddpviz.units import human_bytes


class Segment(NamedTuple):
    """One parameter's stretch of its bucket's flat buffer."""

    bucket: int  # bucket index, reduction order
    label: str  # the bucket's row label on the y axis
    param_index: int  # index in DDP's parameter list
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    nbytes: int  # the bar's width
    offset: int  # element offset in the bucket buffer
    byte_offset: int  # the bar's base


class LimitMarker(NamedTuple):
    """The byte limit a bucket was filled against (only finite, non-sparse limits are drawn)."""

    bucket: int
    label: str
    limit: int
    filled: int  # bytes in the bucket


def bucket_label(bucket: PlannedBucket) -> str:
    """Row label: index, dtype and the limit, so unlimited and sparse buckets read as such."""
    return f"{bucket.index} · {bucket.dtype} · {'' if bucket.sparse else 'cap '}" \
        f"{limit_text(bucket)}"


def segments(buckets: Sequence[PlannedBucket]) -> list[Segment]:
    """Every parameter of every bucket, buckets in reduction order, slots in buffer order."""
    out = []
    for b in buckets:
        label = bucket_label(b)
        for s in b.slots:
            p = s.param
            out.append(Segment(b.index, label, p.index, p.name, p.shape, p.dtype, p.device,
                               p.numel, p.nbytes, s.offset, s.byte_offset))
    return out


def limit_markers(buckets: Sequence[PlannedBucket]) -> list[LimitMarker]:
    """One marker per bucket whose limit can be drawn: sys.maxsize ('unlimited'), sparse
    buckets (limit 0) and caps not recorded show their limit in the row label only."""
    return [LimitMarker(b.index, bucket_label(b), b.limit, b.nbytes) for b in buckets
            if not b.sparse and 0 <= b.limit < 2**62]


def hover_text(s: Segment) -> str:
    """The tooltip of one segment (plotly hover text: <br> separates lines)."""
    shape = "(" + ", ".join(map(str, s.shape)) + ("," if len(s.shape) == 1 else "") + ")"
    return markup.fmt("<b>{}</b> [param {}]<br>shape {} · {} · {}<br>"
                      "{:,} bytes ({}), {:,} elements<br>"
                      "bucket {}, byte offset {:,} (element {:,})", s.name, s.param_index,
                      shape, s.dtype, s.device, s.nbytes, human_bytes(s.nbytes), s.numel,
                      s.bucket, s.byte_offset, s.offset)


def limit_hover_text(m: LimitMarker) -> str:
    """The tooltip of one limit marker."""
    return (markup.fmt("bucket {} limit {} ({:,} bytes)<br>filled {} ({:.0%})", m.bucket,
                       human_bytes(m.limit), m.limit, human_bytes(m.filled), m.filled / m.limit)
            if m.limit else markup.fmt("bucket {} limit 0 bytes<br>filled {}", m.bucket,
                                       human_bytes(m.filled)))
