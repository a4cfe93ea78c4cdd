"""The bucket advisor: which bucket_cap_mb (or bucket list) a DDP job should use, predicted
from one recorded run. `ddpviz.advise(source)` returns an `Advice`;
`ddpviz.advisor.measure(process_group)` measures all-reduce costs where the run cannot. (The
package is `advisor`, not `advise`: a submodule named like the function would replace
`ddpviz.advise` when imported.)

Modules: timeline (per-rank backward timelines from events), costmodel (latency + bandwidth
fitted from the run), commqueue (the in-order all-reduce queue), measure (microbenchmark),
candidates (the settings tried), replay (the reducer replayed with the exact planner), advice
(the answer), advisor (the pipeline).
"""

import warnings
from typing import Any

from ddpviz.advisor.advice import Advice, Row
from ddpviz.advisor.advisor import advise
from ddpviz.advisor.candidates import Candidate
from ddpviz.advisor.costmodel import CostModel, Line, fit_cost_model
from ddpviz.advisor.measure import measure
from ddpviz.advisor.source import AdviceError
from ddpviz.advisor.timeline import Timeline, build_timeline


def _measure_moved(*args: Any, **kwargs: Any) -> CostModel:
    warnings.warn("ddpviz.advise.measure is deprecated: use ddpviz.advisor.measure",
                  DeprecationWarning, stacklevel=2)
    return measure(*args, **kwargs)


# The one attribute left on the function: the README's old spelling `ddpviz.advise.measure(pg)`
# as a deprecated alias (a function cannot warn when an attribute is read, so it warns when
# called). Remove in the release after next.
setattr(advise, "measure", _measure_moved)  # noqa: B010

__all__ = ["Advice", "AdviceError", "Candidate", "CostModel", "Line", "Row", "Timeline",
           "advise", "build_timeline", "fit_cost_model", "measure"]
