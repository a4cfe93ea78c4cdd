"""The bucket advisor: which bucket_cap_mb (or bucket list) a DDP job should use, predicted
from one recorded run. `ddpviz.advise(source)` returns an `Advice`;
`ddpviz.advise.measure(process_group)` measures all-reduce costs where the run cannot.

Modules: timeline (per-rank backward timelines from events), costmodel (latency + bandwidth
fitted from the run), commqueue (the in-order all-reduce queue), measure (microbenchmark),
candidates (the settings tried), replay (the reducer replayed with the exact planner), advice
(the answer), advisor (the pipeline).
"""

from ddpviz.advise.advice import Advice, Row
from ddpviz.advise.advisor import advise
from ddpviz.advise.candidates import Candidate
from ddpviz.advise.costmodel import CostModel, Line, fit_cost_model
from ddpviz.advise.measure import measure
from ddpviz.advise.source import AdviceError
from ddpviz.advise.timeline import Timeline, build_timeline

# `ddpviz.advise` is the function (ddpviz's package __getattr__ resolves it); its helpers ride
# on it so that `ddpviz.advise.measure(pg)` works as the issue spells it.
for _name, _value in (("measure", measure), ("Advice", Advice), ("Candidate", Candidate),
                      ("CostModel", CostModel), ("AdviceError", AdviceError)):
    setattr(advise, _name, _value)

__all__ = ["Advice", "AdviceError", "Candidate", "CostModel", "Line", "Row", "Timeline",
           "advise", "build_timeline", "fit_cost_model", "measure"]
