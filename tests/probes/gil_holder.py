"""A process standing for one rank, for tests/probes/test_stuck_stack.py: a `Beacon` (what
ddpviz's pulse thread runs, stuck_stack.py) on a thread that stamps every 0.05 s, posting to
stdout instead of a store ("contact {json}" lines). Then, by the first argument:

  hold SECONDS  its main thread calls libc's sleep(SECONDS) through ctypes.PyDLL, which keeps
                the GIL, and prints "slept LEFT ELAPSED" when it returns;
  own SECONDS   the job sets its own faulthandler first (enable(); register() on SIGRTMAX into
                its own file; a Python handler on SIGRTMAX-1; dump_traceback_later(SECONDS)),
                prints "job {json}" with what ddpviz must have left alone, sleeps SECONDS + 1 with
                the GIL released, and prints "done";
  none          every real-time signal is ignored: two beacons, and ddpviz steps aside;
  takeover      after ddpviz armed, the job installs a Python handler on ddpviz's signal.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
import time

from ddpviz.probes.stuck_stack import Beacon


class Posts:
    """Stands for the notice board: prints what is posted."""

    def post(self, name: str, data: str) -> None:
        print(f"contact {data}", flush=True)


def pulse(beacon: Beacon) -> None:
    beacon.started(Posts())  # type: ignore[arg-type]
    while True:
        beacon.stamp()
        time.sleep(0.05)


def start() -> Beacon:
    beacon = Beacon(threading.get_ident())
    threading.Thread(target=pulse, args=(beacon,), daemon=True).start()
    return beacon


def load_batch(seconds: int) -> None:
    libc = ctypes.PyDLL(None)
    t = time.monotonic()
    left = libc.sleep(seconds)  # PLANTED gil
    print(f"slept {left} {time.monotonic() - t:.2f}", flush=True)


def main() -> None:
    mode = sys.argv[1]
    if mode == "hold":
        start()
        time.sleep(0.3)  # (the contact is posted)
        load_batch(int(sys.argv[2]))
    elif mode == "own":
        seconds = float(sys.argv[2])
        job_file = open(sys.argv[3], "w")  # noqa: SIM115 - faulthandler writes to it until exit
        faulthandler.enable(file=job_file)
        faulthandler.register(signal.SIGRTMAX, file=job_file, all_threads=True)
        signal.signal(signal.SIGRTMAX - 1, lambda *_: print("job handler ran", flush=True))
        faulthandler.dump_traceback_later(seconds, file=job_file)
        start()
        time.sleep(0.3)
        print("job " + json.dumps({"enabled": faulthandler.is_enabled(),
                                   "handler": signal.getsignal(signal.SIGRTMAX - 1) is not None
                                   and callable(signal.getsignal(signal.SIGRTMAX - 1))}),
              flush=True)
        time.sleep(seconds + 1.0)
        print("done", flush=True)
        time.sleep(float(sys.argv[4]))
    elif mode == "none":
        for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
            signal.signal(sig, signal.SIG_IGN)
        start()
        start()
        time.sleep(0.5)
    elif mode == "takeover":
        beacon = start()
        time.sleep(0.3)
        assert beacon.armed is not None
        signal.signal(beacon.armed.signal, lambda *_: os.write(1, b"job handler ran\n"))
        for _ in range(2):  # (said once)
            beacon.check(Posts())  # type: ignore[arg-type]
        time.sleep(float(sys.argv[2]))


if __name__ == "__main__":
    main()
