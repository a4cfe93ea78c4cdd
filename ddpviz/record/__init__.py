"""The `record` verb: `ddpviz record -- COMMAND` (command.py) runs an unmodified training command
with every torch DDP in every rank watched; autowatch.py is what runs in each rank (the stdlib
startup hook `ddpviz_autowatch`, at the repository's top level, calls it).
"""
