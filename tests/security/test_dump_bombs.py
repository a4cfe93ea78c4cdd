"""Hostile Flight Recorder dumps (tests/security/dump_bombs.py) are refused with a DumpError
naming what was wrong, each in a child process under a 2 GiB address-space cap (RLIMIT_AS) and
a time cap, so a dump that allocates without bound dies with MemoryError and one that hangs
hits the cap; either fails here. A real dump torch writes parses to what pickle.loads builds."""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ddpviz._postmortem.dumps import DumpError, load_dumps
from ddpviz._postmortem.pickle_reader import PickleRefused, load_plain
from tests.security.dump_bombs import DUMP_BOMBS, tuple_dag_key

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30
TIME_CAP_S = 240  # each is refused in seconds on an idle machine

CHILD = r"""
import json, sys
from ddpviz._postmortem.dumps import DumpError, load_dumps
try:
    load_dumps(sys.argv[1])
    print(json.dumps(["loaded", ""]))
except DumpError as e:
    print(json.dumps(["DumpError", str(e)]))
"""

EXPECTED = {  # what each refusal says
    "pickle memo index 0x0C000000": "memo index 201,326,592, more than",
    "pickle list flood 48 MiB": "MiB of objects",
    "pickle None flood 200 MiB": "more than 16,000,000 opcodes",
    "pickle tuple-DAG dict key": "nested more than 64 deep",
    "JSON empty lists 64 MiB": "values, more than",
}


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.mark.timeout(TIME_CAP_S + 60)
@pytest.mark.parametrize("name", list(DUMP_BOMBS))
def test_a_hostile_dump_is_refused_within_the_caps(tmp_path: Path, name: str) -> None:
    (tmp_path / "fr_0").write_bytes(DUMP_BOMBS[name]())
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "fr_0")],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          preexec_fn=_cap_memory, capture_output=True, text=True,
                          timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome, message = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome == "DumpError" and message.startswith("ddpviz: "), message
    assert EXPECTED[name] in message and "fr_0" in message, message


def test_only_str_and_int_dict_keys_are_accepted() -> None:
    with pytest.raises(PickleRefused, match="a dict key of type tuple"):
        load_plain(tuple_dag_key(levels=30))  # within the depth bound: refused for its key
    with pytest.raises(PickleRefused, match="a dict key of type NoneType"):
        load_plain(pickle.dumps({None: 1}))
    assert load_plain(pickle.dumps({"a": 1, 2: "b"})) == {"a": 1, 2: "b"}


def test_opcodes_outside_plain_data_are_refused_by_name() -> None:
    for value, opcode in (({1, 2}, "EMPTY_SET"), (b"raw", "SHORT_BINBYTES"),
                          (frozenset(), "FROZENSET")):
        with pytest.raises(PickleRefused, match=f"opcode {opcode} \\(0x"):
            load_plain(pickle.dumps(value, protocol=4))
    with pytest.raises(PickleRefused, match=r"refused to load __builtin__\.print"):
        load_plain(pickle.dumps(print, protocol=2))  # GLOBAL (protocol 2 names Python 2's)
    with pytest.raises(PickleRefused, match=r"refused to load builtins\.print"):
        load_plain(pickle.dumps(print, protocol=4))  # STACK_GLOBAL
    with pytest.raises(PickleRefused, match="not a pickle of protocol 2 to 5"):
        load_plain(pickle.dumps([], protocol=1))
    with pytest.raises(PickleRefused, match="pickle protocol 1;"):
        load_plain(b"\x80\x01N.")


def test_cycles_and_containers_changed_after_placement_are_refused() -> None:
    selfref: list[object] = []
    selfref.append(selfref)
    with pytest.raises(PickleRefused, match="placed inside itself"):
        load_plain(pickle.dumps(selfref, protocol=2))
    a: list[object] = []
    b = [a]
    a.append(b)  # a -> b -> a
    with pytest.raises(PickleRefused, match="modified after it was placed"):
        load_plain(pickle.dumps(a, protocol=2))
    shared = [1]
    assert load_plain(pickle.dumps([shared, shared], protocol=2)) == [[1], [1]]


def test_truncated_and_garbage_pickles_are_refused(tmp_path: Path) -> None:
    data = pickle.dumps({"version": "2.10", "entries": []}, protocol=2)
    for cut in range(2, len(data)):
        with pytest.raises(PickleRefused):
            load_plain(data[:cut])
    (tmp_path / "fr_0").write_bytes(b"\x80\x02" + b"\xff" * 10)
    with pytest.raises(DumpError, match=r"not a Flight Recorder pickle: opcode 0xff"):
        load_dumps(tmp_path)


REAL_DUMP = r"""
import os, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(4))
dist.broadcast(torch.ones(2, 3, dtype=torch.float64), 0)
dist.all_gather([torch.ones(5, dtype=torch.int64)], torch.ones(5, dtype=torch.int64))
c10d = torch._C._distributed_c10d
open(sys.argv[1], "wb").write(c10d._dump_fr_trace(True, True))
dist.destroy_process_group()
"""


def test_a_real_flight_recorder_pickle_parses_as_pickle_loads_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "fr_0"
    subprocess.run([sys.executable, "-c", REAL_DUMP, str(path)], check=True, timeout=300,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    data = path.read_bytes()
    expected = pickle.loads(data)  # torch wrote it in this test: trusted here
    assert len(expected["entries"]) == 5
    assert load_plain(data) == expected
    for protocol in (2, 3, 4, 5):  # the same data as Python's pickler writes it
        assert load_plain(pickle.dumps(expected, protocol=protocol)) == expected
    (dump,) = load_dumps(tmp_path)
    assert [e.op for e in dump.entries] == ["all_reduce"] * 3 + ["broadcast", "all_gather"]
    assert dump.entries[3].input_sizes == ((2, 3),) and dump.entries[3].dtypes == ("float64",)


def test_a_group_rank_list_is_read_as_integers_only() -> None:
    from tests.postmortem.test_dumps import dump, entry

    for ranks in ("[" * 100_000 + "]" * 100_000, "[[], [], []]", "[0, 1.5]", "[1e9]"):
        with pytest.raises(DumpError, match="is not a list of integers"):
            load_dumps([dump([entry(1)], ranks=ranks)])
    (parsed,) = load_dumps([dump([entry(1)], ranks=" [0, 1 ,2] ")])
    assert parsed.groups["0"][1] == (0, 1, 2)


INTERRUPTED = r"""
import signal
# Ctrl-C raises KeyboardInterrupt only where Python installed its handler, which it does not
# when the parent ignores SIGINT (a background job's children inherit that, CI run with `&`)
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddpviz._postmortem import pickle_reader
from tests.security.dump_bombs import none_flood
pickle_reader.MAX_OPS = pickle_reader.MAX_BYTES = 1 << 40  # a parse of many opcodes
data = none_flood(16)
# Ctrl-C in the middle of the parse, one million opcodes in (a timer raced the parse: on a
# loaded machine the parse reached its end, and the memory cap, before the timer fired)
push_none, calls = pickle_reader._TABLE[ord("N")], [0]
def counted(r):
    calls[0] += 1
    if calls[0] == 1_000_000:
        signal.raise_signal(signal.SIGINT)
    return push_none(r)
pickle_reader._TABLE[ord("N")] = counted
try:
    pickle_reader.load_plain(data)
    print("finished")
except KeyboardInterrupt:
    print("interrupted", calls[0] < 2_000_000)
"""


def test_a_long_parse_stops_at_an_interrupt() -> None:
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED], cwd=ROOT, timeout=TIME_CAP_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          preexec_fn=_cap_memory, text=True)
    # stopped right there: the interrupt is seen between opcodes, never swallowed
    assert proc.stdout.strip() == "interrupted True", proc.stdout + proc.stderr[-2000:]
