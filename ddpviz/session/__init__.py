"""Live sessions, the `listen` verb: `ddpviz.listen()` in the notebook and `ddpviz.connect()` on
every rank (live.py), and `listen(follow=DIR)`, a job that `ddpviz record --out DIR` is writing,
followed as its files grow (follow.py).
"""
