"""A "kernel" that interrupts itself (SIGINT, as Jupyter's interrupt button does) at random
moments while a launch's resources (its folder and event stream: a collector with its thread)
are made and closed, collecting garbage after each round; prints "survived N rounds".

Run: python -X faulthandler -m tests.launch.interrupt_resources SEED ROUNDS MAX_OFFSET_S
"""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import threading
import time

from ddpviz.launcher.resources import run_resources


def _release(resources: tuple | None) -> None:
    if resources is not None:
        folder, _, events = resources
        events.close()
        folder.remove()


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seed, rounds, most = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    _release(run_resources(2, None))  # the first imports happen outside the sweep
    pick = random.Random(seed)
    interrupted = 0
    for _ in range(rounds):
        timer = threading.Timer(pick.uniform(0, most), os.kill, (os.getpid(), signal.SIGINT))
        resources = None
        try:
            timer.start()
            resources = run_resources(2, None)
            time.sleep(0.002)
            done, resources = resources, None
            _release(done)
        except KeyboardInterrupt:
            interrupted += 1
        while timer.is_alive():
            try:
                timer.join()
            except KeyboardInterrupt:
                interrupted += 1
        _release(resources)
        gc.collect()  # what a cut-short round left half-made is collected here, if anywhere
    print(f"survived {rounds} rounds, {interrupted} interrupted", flush=True)


if __name__ == "__main__":
    main()
