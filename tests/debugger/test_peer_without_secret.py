"""A peer without the session's secret cannot resume parked ranks nor run code on them (real
gloo ranks, parked at a break): with the wrong secret it fails the CURVE handshake; with the
server's CURVE key but the wrong signing secret its messages are refused ("auth"). The ranks
stay parked, run nothing, and the notebook's own commands still work; the run ends bitwise as
an unpaused one. (Pausing: test_pause_abort.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from ddpviz import events as ev
from ddpviz.debugger.protocol import Resume, RunCode, Step
from ddpviz.transport.codec import Codec, make_header
from ddpviz.transport.handshake import secure_client
from tests.debugger.harness import go_ahead, launch_debug, reference, request
from tests.debugger.rank_fns import STEP
from tests.polling import eventually

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

STEPS = 6
WAIT = 120.0


def _peer(address: str, curve: bytes) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, curve)
    sock.connect(address)
    return sock


def test_a_peer_without_the_secret_cannot_resume_or_run_code(tmp_path: Path):
    ref = reference("twin", STEPS, tmp_path / "ref")
    run, go = launch_debug("twin", STEPS, tmp_path / "run")
    socks: list[zmq.Socket] = []
    try:
        dbg = run.debugger
        dbg.break_at(step=STEP, where="forward")
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        collector = run.session.collector
        wrong = b"ab" * 32
        commands = [Resume(request()), RunCode(request(), "import os; os._exit(3)"),
                    Step(request(), "step")]
        # what the collector would send each rank, signed with the wrong secret: over a
        # connection without the secret (no handshake), then with the stolen CURVE key
        socks = [_peer(collector.address, wrong),
                 _peer(collector.address, collector.secret.encode())]
        for sock in socks:
            for r in (0, 1):
                sock.send_multipart(Codec(wrong).encode(
                    make_header("control", r, "x", r, count=len(commands)), commands))
        assert eventually(lambda: collector.stats.handshakes_failed >= 1, WAIT)
        assert eventually(lambda: collector.stats.rejected["auth"] >= 2, WAIT)
        time.sleep(2.0)  # time for anything that got through to reach a rank and its answer
        events = run.trace.events()
        assert not [e for e in events if isinstance(e, (ev.Unparked, ev.CodeRan))]
        assert not run.done() and dbg.stop is not None and sorted(dbg.parked) == [0, 1]
        assert dbg.stop.step == stop.step
        # the notebook's own commands still reach the parked ranks
        ran = dbg.run("rank * 10", timeout=WAIT)
        assert {r: c.result for r, c in ran.items()} == {0: "0", 1: "10"}
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    finally:
        for sock in socks:
            sock.close(0)
        if not run.done():
            run.stop()
    assert final == [ref[0]["final"], ref[1]["final"]]
