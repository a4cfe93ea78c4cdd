"""The bucket settings the advisor tries: torch's knobs, defaults and user-given ones.

A `Candidate` is one DDP setting that shapes buckets: `bucket_cap_mb`, `bucket_cap_mb_list`
(a small first bucket is `[1, cap]`), DDP_SET_LAST_BUCKET_CAP. The defaults sweep caps from
0.25 to 256 MiB with and without the 1 MiB first bucket, plus bucket lists cut at the model's
layer boundaries in gradient-ready order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddpviz.advisor.source import AdviceError
from ddpviz.plan import MB, PlannedParam

CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0, 64.0, 128.0, 256.0)
MAX_LIST = 1024  # entries in a layer-shaped bucket_cap_mb_list


@dataclass(frozen=True)
class Candidate:
    """One bucket setting (torch's argument names; None: torch's default)."""

    label: str
    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: tuple[float, ...] | None = None
    set_last_bucket_cap: bool = False  # DDP_SET_LAST_BUCKET_CAP=1
    family: str = "user"  # "cap" | "first+cap" | "layers" | "default" | "current" | "user"

    @property
    def cap_mb(self) -> float:
        """The largest bucket cap in MiB (the x axis of Advice.show())."""
        if self.bucket_cap_mb_list:
            return max(self.bucket_cap_mb_list)
        return 25.0 if self.bucket_cap_mb is None else self.bucket_cap_mb

    def setting(self) -> str:
        """How to write it in code."""
        if self.bucket_cap_mb_list:
            caps = ", ".join(f"{c:.6g}" for c in self.bucket_cap_mb_list[:6])
            more = f", ... ({len(self.bucket_cap_mb_list)} entries)" if len(
                self.bucket_cap_mb_list) > 6 else ""
            s = f"bucket_cap_mb_list=[{caps}{more}]"
        elif self.bucket_cap_mb is not None:
            s = f"bucket_cap_mb={self.bucket_cap_mb:g}"
        else:
            s = "bucket_cap_mb=None (torch's default: 1 MiB first bucket, 25 MiB)"
        return s + (" with DDP_SET_LAST_BUCKET_CAP=1" if self.set_last_bucket_cap else "")


def default_candidates(params: Sequence[PlannedParam], order: Sequence[int]) -> list[Candidate]:
    """Caps 0.25..256 MiB with and without the small first bucket, torch's default with the
    small bucket last, and bucket lists cut every 1, 2 and 4 layers."""
    out = [Candidate(f"cap {c:g} MiB", bucket_cap_mb=c, family="cap") for c in CAPS_MB]
    for c in CAPS_MB:
        if c == 25.0:
            out.append(Candidate("default (1 MiB first, 25 MiB)", family="default"))
        elif c > 1.0:
            out.append(Candidate(f"1 MiB first + cap {c:g} MiB", bucket_cap_mb_list=(1.0, c),
                                 family="first+cap"))
    out.append(Candidate("default, small bucket last", set_last_bucket_cap=True,
                         family="default"))
    out += layer_candidates(params, order)
    return out


def _layer(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def layer_candidates(params: Sequence[PlannedParam], order: Sequence[int]) -> list[Candidate]:
    """Bucket lists whose limits are the sizes of consecutive layers in gradient-ready order,
    so buckets close at layer boundaries: one bucket per 1, 2 and 4 layers."""
    by_index = {p.index: p for p in params}
    sizes: list[int] = []
    last = None
    for i in order:
        p = by_index.get(i)
        if p is None:
            continue
        layer = _layer(p.name)
        if layer != last:
            sizes.append(0)
            last = layer
        sizes[-1] += p.nbytes
    out = []
    for group in (1, 2, 4):
        limits = [sum(sizes[k:k + group]) for k in range(0, len(sizes), group)]
        if len(limits) < 2 or len(limits) > MAX_LIST:
            continue
        caps = tuple(max(x, 1) / MB for x in limits)
        word = "layer" if group == 1 else f"{group} layers"
        out.append(Candidate(f"one bucket per {word} ({len(limits)})", bucket_cap_mb_list=caps,
                             family="layers"))
    return out


_KEYS = ("label", "bucket_cap_mb", "bucket_cap_mb_list", "set_last_bucket_cap")


def _cap(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdviceError(f"ddpviz: {where} is {value!r} ({type(value).__name__}); expected a "
                          "number of MiB, e.g. 4 or 0.5.")
    v = float(value)
    if not math.isfinite(v) or v <= 0 or v > 1 << 20:
        raise AdviceError(f"ddpviz: {where} is {value!r}; a cap must be a finite number of MiB "
                          "in (0, 1048576], e.g. 4 or 0.5.")
    return v


def _cap_list(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise AdviceError(f"ddpviz: {where} is {value!r}; expected a non-empty list of caps "
                          "in MiB, e.g. [1, 25].")
    if len(value) > MAX_LIST:
        raise AdviceError(f"ddpviz: {where} has {len(value)} entries; at most {MAX_LIST}.")
    return tuple(_cap(c, f"{where}[{k}]") for k, c in enumerate(value))


def validate_candidates(given: object) -> list[Candidate]:
    """User candidates as Candidates. Accepts a Candidate, a cap in MiB (4), a list of caps
    ([1, 25]: a bucket_cap_mb_list) or a dict of Candidate's fields, or a list of those."""
    if isinstance(given, (Candidate, Mapping, int, float)) and not isinstance(given, bool):
        items: list[object] = [given]
    elif isinstance(given, (list, tuple)):
        items = list(given)
    else:
        raise AdviceError(f"ddpviz: candidates is a {type(given).__name__}; expected a list of "
                          "caps in MiB (e.g. [4, 16, [1, 25]]), dicts or advise.Candidate.")
    if not items:
        raise AdviceError("ddpviz: candidates is empty; pass None for the default sweep or at "
                          "least one setting, e.g. [4, 16].")
    out = []
    for k, c in enumerate(items):
        where = f"candidate {k}"
        if isinstance(c, Candidate):
            if c.bucket_cap_mb is not None:
                _cap(c.bucket_cap_mb, f"{where} bucket_cap_mb")
            if c.bucket_cap_mb_list is not None:
                _cap_list(list(c.bucket_cap_mb_list), f"{where} bucket_cap_mb_list")
            out.append(c)
        elif isinstance(c, bool):
            raise AdviceError(f"ddpviz: {where} is {c!r}; expected a cap in MiB, a list of caps "
                              "or a dict.")
        elif isinstance(c, (int, float)):
            cap = _cap(c, where)
            out.append(Candidate(f"cap {cap:g} MiB", bucket_cap_mb=cap, family="cap"))
        elif isinstance(c, (list, tuple)):
            caps = _cap_list(c, where)
            out.append(Candidate(f"list [{', '.join(f'{x:g}' for x in caps[:4])}"
                                 f"{', ...' if len(caps) > 4 else ''}]",
                                 bucket_cap_mb_list=caps))
        elif isinstance(c, Mapping):
            unknown = sorted(str(x) for x in c if x not in _KEYS)
            if unknown:
                raise AdviceError(f"ddpviz: {where} has unknown key(s) {unknown}; use "
                                  f"{', '.join(_KEYS)}.")
            cap_v = c.get("bucket_cap_mb")
            list_v = c.get("bucket_cap_mb_list")
            if cap_v is not None and list_v is not None:
                raise AdviceError(f"ddpviz: {where} sets both bucket_cap_mb and "
                                  "bucket_cap_mb_list; torch uses the list then: give one.")
            cap_f = _cap(cap_v, f"{where} bucket_cap_mb") if cap_v is not None else None
            caps_l = _cap_list(list_v, f"{where} bucket_cap_mb_list") if list_v is not None \
                else None
            last = c.get("set_last_bucket_cap", False)
            if not isinstance(last, bool):
                raise AdviceError(f"ddpviz: {where} set_last_bucket_cap is {last!r}; expected "
                                  "True or False.")
            label = c.get("label")
            probe = Candidate("", cap_f, caps_l, last)
            out.append(Candidate(str(label) if label else probe.setting(), cap_f, caps_l, last))
        else:
            raise AdviceError(f"ddpviz: {where} is {c!r} ({type(c).__name__}); expected a cap "
                              "in MiB (e.g. 4), a list of caps (e.g. [1, 25]), a dict of "
                              f"{', '.join(_KEYS)} or an advise.Candidate.")
    return out
