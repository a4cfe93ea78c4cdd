"""Live sessions, the `listen` verb: `ddpviz.listen()` and its `Session` in the notebook
(live.py), `ddpviz.connect()` on every rank (connect.py), and `listen(follow=DIR)`, a job that
`ddpviz record --out DIR` is writing, followed as its files grow (follow.py).
"""
