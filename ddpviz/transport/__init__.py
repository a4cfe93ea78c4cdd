"""The live event stream from ranks to the notebook: rank-side `Sender`, kernel-side
`Collector`, and the wire `codec` between them (the only module that knows the encoding)."""

from ddpviz.transport.codec import REASONS, WireError
from ddpviz.transport.collector import Collector, CollectorStats
from ddpviz.transport.sender import Sender, SenderStats

__all__ = ["REASONS", "Collector", "CollectorStats", "Sender", "SenderStats", "WireError"]
