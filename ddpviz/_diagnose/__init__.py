"""The `diagnose` verb: findings from the events of a run (diagnosis.py), who is slow
(straggler.py), and the verdict as `ddpviz diagnose` prints it (verdict.py). Named with an
underscore because `ddpviz.diagnose` is the function (see ddpviz/__init__.py)."""
