"""The environment variables that carry `ddpviz record`'s settings into a job's ranks, by name,
and the per-rank trace file it writes. Standard library only: `ddpviz record`'s launcher sets
them without importing torch, zmq or numpy (the ranks import those, not the launcher)."""

ENV_RECORD = "DDPVIZ_RECORD"  #: "1": watch every torch DDP of the job (ddpviz_autowatch.pth)
ENV_CONNECT = "DDPVIZ_CONNECT"  #: a notebook session's connect string: events go live there
ENV_TRACE_DIR = "DDPVIZ_TRACE_DIR"  #: else the folder each rank's trace file goes to
ENV_RING_DIR = "DDPVIZ_RING_DIR"  #: or, with none, where the rings of collectives go
ENV_DEBUG = "DDPVIZ_DEBUG"  #: "1": the ranks take the notebook's debugger commands;
#: "paused": and they park before their first forward (launch(debug="paused"))
ENV_HANG_TIMEOUT = "DDPVIZ_HANG_TIMEOUT"  #: seconds before a hang is named; 0: off
TRACE_FILE = "ddpviz-trace-rank{rank}.ddpviz"  #: a rank's trace file (suffix: fileformat.SUFFIX)
