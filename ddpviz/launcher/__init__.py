"""Run notebook-defined code on N local ranks: `launch` (one function) and the %%ddp rank pool.

process.py starts and ends rank processes; channel.py frames the private pipes to them; rank.py
is what runs inside a rank; output.py relays rank output into the notebook; stacks.py shows
where a hung rank waits (a run's files live in a ddpviz.private_dir: 0700, swept after a
crash); stream.py connects the ranks' events to a Session; run.py is
`launch`/`Run`; pool.py keeps the long-lived ranks of %%ddp, pool_debugger.py is their debugger
(%%ddp --debug); errors.py is what they raise.
"""

from ddpviz.launcher.errors import LaunchError, LaunchTimeout, RankError
from ddpviz.launcher.run import Run, launch

__all__ = ["LaunchError", "LaunchTimeout", "RankError", "Run", "launch"]
