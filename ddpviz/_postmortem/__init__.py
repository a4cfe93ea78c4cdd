"""Post-mortem from torch's Flight Recorder: per-rank dumps read safely (dumps.py), each
entry's call site and launcher read from its stack (callsite.py), aligned by process group and
sequence id (align.py), named in DDP's terms through the exact bucket planner (ddp_map.py) or as
the job's own collectives by call site (naming.py), turned into findings per process group
(group_findings.py) and reported (report.py)."""

from ddpviz._postmortem.dumps import DumpError
from ddpviz._postmortem.report import PostMortem, postmortem

__all__ = ["DumpError", "PostMortem", "postmortem"]
