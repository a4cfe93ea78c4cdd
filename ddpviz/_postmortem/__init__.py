"""Post-mortem from torch's Flight Recorder: per-rank dumps read safely (dumps.py), aligned by
process group and sequence id (align.py), named in DDP's terms through the exact bucket planner
(ddp_map.py), reported as findings (report.py)."""

from ddpviz._postmortem.dumps import DumpError
from ddpviz._postmortem.report import PostMortem, postmortem

__all__ = ["DumpError", "PostMortem", "postmortem"]
