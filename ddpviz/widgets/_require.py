"""Imported first by ddpviz.widgets: without the notebook-side packages, say how to get them."""

from ddpviz.lab_deps import require_lab

require_lab("the notebook widgets (ddpviz.widgets, Session.dashboard(), BucketPlan.show())")
