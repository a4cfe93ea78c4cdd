"""The live event stream from ranks to the notebook: rank-side `Sender`, kernel-side
`Collector`, and the wire `codec` between them (the only module that knows the encoding);
`handshake` keeps peers without the session secret out (CURVE keys derived from it)."""

from ddpviz.transport.codec import REASONS, WireError
from ddpviz.transport.collector import Collector, CollectorStats
from ddpviz.transport.sender import Sender, SenderStats

__all__ = ["REASONS", "Collector", "CollectorStats", "Sender", "SenderStats", "WireError"]
