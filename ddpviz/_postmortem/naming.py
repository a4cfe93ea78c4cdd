"""A recorded collective in words, in the best terms the dumps allow: DDP's in bucket terms
(with a model, ddp_map.py), the job's own with its call site (where the dump has stacks,
callsite.py), else its op, sizes and dtype; and a process group with its ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from ddpviz._postmortem.callsite import site_text
from ddpviz.findings import format_ranks
from ddpviz.limits import MAX_NAME
from ddpviz.probes.stack_text import clip

if TYPE_CHECKING:
    from ddpviz._postmortem.align import GroupAlignment
    from ddpviz._postmortem.ddp_map import Labelled
    from ddpviz._postmortem.dumps import FrEntry

# Who launched a collective, as far as the dumps tell: "ddp" (its stack or DDP's plan says so),
# "job" (the job's own: its stack says so, or it ran on another group than DDP's), "unplanned"
# (on DDP's group, no stack, and not where DDP's plan has one), "" (no stack and no model)
Who = Literal["ddp", "job", "unplanned", ""]


class Namer:
    """Names the entries of a post-mortem's dumps.

    Args:
        labels: rank -> DDP's labels of its entries on DDP's group (empty without a model).
        ddp_pg: the name of DDP's process group ("" when unknown).
        have_model: whether the post-mortem was given the model (then DDP's collectives are
            all on `ddp_pg`, and every other group's are the job's).
    """

    def __init__(self, labels: Mapping[int, Sequence[Labelled]], ddp_pg: str,
                 have_model: bool) -> None:
        self.by_seq = {r: {lab.entry.seq: lab for lab in labs} for r, labs in labels.items()}
        self.ddp_pg, self.have_model = ddp_pg, have_model

    def lab(self, pg: str, rank: int, seq: int) -> Labelled | None:
        """DDP's label of rank's collective #seq on group `pg` (None: no model, other group)."""
        return self.by_seq.get(rank, {}).get(seq) if pg == self.ddp_pg else None

    def who(self, pg: str, rank: int, e: FrEntry) -> Who:
        """Who launched the entry (see `Who`); its stack, where it has one, decides."""
        if e.origin:
            return e.origin
        lab = self.lab(pg, rank, e.seq)
        if lab is not None:
            return "ddp" if lab.ddp is not None else "unplanned"
        return "job" if self.have_model and pg != self.ddp_pg else ""

    def what(self, pg: str, rank: int, e: FrEntry) -> str:
        """The entry as a phrase: "bucket 5 of step 812 (...)", "the job's barrier at
        train.py:54 in save_checkpoint", "DDP's all_reduce [40] float32", "all_reduce [40]
        float32, not in DDP's plan", or "all_reduce [40] float32"."""
        lab = self.lab(pg, rank, e.seq)
        if lab is not None and lab.ddp is not None:
            return lab.ddp.label()
        who, d = self.who(pg, rank, e), e.describe()
        if who == "job":
            return f"the job's {d}" + (f" at {site_text(e.site)}" if e.site else "")
        if who == "ddp":
            return f"DDP's {d}" + (", not in its plan" if lab is not None else "")
        return f"{d}, not in DDP's plan" if who == "unplanned" else d

    def value(self, pg: str, rank: int, e: FrEntry) -> str:
        """The entry for a per-rank value line: its op, sizes and dtype first, then what it is
        ("= bucket 0 of step 3 (...)", "at train.py:61 in log_metrics", ", DDP's")."""
        lab = self.lab(pg, rank, e.seq)
        d = e.describe()
        who = self.who(pg, rank, e)
        if lab is not None and lab.ddp is not None:
            text = f"{d} = {lab.ddp.label()}"
        elif who == "job" and e.site is not None:
            text = f"{d} at {site_text(e.site)}"
        else:
            text = {"ddp": f"{d}, DDP's", "unplanned": f"{d}, not in DDP's plan"}.get(who, d)
        return clip(text, MAX_NAME)  # a finding's value (limits.py)


def group_text(g: GroupAlignment) -> str:
    """"process group 0 (default_pg; ranks 0,1)": its name, description and ranks (from the
    dumps' pg_config, else the ranks whose dumps hold its entries)."""
    base, p2p = g.pg.removesuffix(":p2p"), g.pg.endswith(":p2p")
    desc = g.desc or next((e.pg_desc for es in g.entries.values() for e in es.values()), "")
    inside = "; ".join(x for x in (desc if desc != "undefined" else "",
                                   format_ranks(g.members)) if x)
    return f"{'p2p ops of ' if p2p else ''}process group {base} ({inside})"
