"""A "kernel" that interrupts itself during launch()/wait() at each given offset, like Jupyter's
interrupt button (SIGINT to the kernel process), and reports what happened as JSON lines.

Run: python -m tests.launch.interrupt_sweep TOKEN OFFSET [OFFSET ...]
Every rank gets DDPVIZ_SWEEP=TOKEN in its environment, so the test can find orphans by it.
For each offset it prints {"offset": s, "raised": "KeyboardInterrupt" | other, "where": ...}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

import ddpviz
from tests.launch import rank_fns


def one(token: str, offset: float) -> dict[str, object]:
    timer = threading.Timer(offset, os.kill, (os.getpid(), signal.SIGINT))
    where = "launch"
    raised = "nothing"
    pid_dir = tempfile.mkdtemp(prefix="sweep-")
    start = time.monotonic()
    try:
        timer.start()
        run = ddpviz.launch(rank_fns.sleep_forever, 2, args=(pid_dir,),
                            env={"DDPVIZ_SWEEP": token})
        where = "wait"
        run.wait()
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    except BaseException as exc:
        raised = f"{type(exc).__name__}: {exc}"
    finally:
        timer.cancel()
        timer.join()
    return {"offset": offset, "raised": raised, "where": where,
            "seconds": round(time.monotonic() - start, 2)}


def main() -> None:
    # A kernel always handles SIGINT (ipykernel installs its handler); a process started in the
    # background by a non-interactive shell inherits SIGINT ignored, which would make every
    # interrupt below a no-op.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    token, offsets = sys.argv[1], [float(x) for x in sys.argv[2:]]
    for offset in offsets:
        print(json.dumps(one(token, offset)), flush=True)


if __name__ == "__main__":
    main()
