"""Reading Flight Recorder dumps as untrusted input: a malicious pickle is refused without
running, hostile sizes and other versions get clear errors; alignment on crafted dumps."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz._postmortem.dumps import MAX_DIMS, DumpError, load_dumps
from ddpviz.findings import fix_for


def entry(seq: int, op: str = "all_reduce", numel: int = 4, retired: bool = True,
          dtype: str = "Float") -> dict[str, Any]:
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"gloo:{op}", "input_sizes": [[numel]], "input_dtypes": [dtype],
            "output_sizes": [[numel]], "output_dtypes": [dtype], "state": "scheduled",
            "retired": retired, "is_p2p": False, "time_created_ns": 1, "timeout_ms": 1000,
            "frames": [{"name": "train", "filename": "train.py", "line": 3}]}


def dump(entries: list[dict[str, Any]], ranks: str = "[0, 1]") -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": ranks}},
            "pg_status": {}, "comm_lib_version": "", "entries": entries}


class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused_without_running(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fr_0").write_bytes(pickle.dumps({"version": "2.10", "x": Boom()}))
    with pytest.raises(DumpError, match=r"refused to load posix.system"):
        load_dumps(tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_pickle_and_json_forms_read_alike(tmp_path: Path) -> None:
    d = dump([entry(1), entry(2, retired=False)])
    (tmp_path / "fr_0").write_bytes(pickle.dumps(d))
    (tmp_path / "fr_1").write_text(json.dumps(d))
    a, b = load_dumps(tmp_path)
    assert (a.rank, b.rank) == (0, 1) and a.entries == b.entries
    assert a.entries[1].completed is False and a.entries[0].frames == ("train (train.py:3)",)


def test_other_version_names_version_and_fields() -> None:
    bad = dump([{k: v for k, v in entry(1).items() if k != "input_dtypes"} | {"new_field": 1}])
    bad["version"] = "3.0"
    with pytest.raises(DumpError) as e:
        load_dumps([bad])
    msg = str(e.value)
    assert "version '3.0'" in msg and "torch 2.13" in msg
    bad["version"] = "2.11"
    with pytest.raises(DumpError, match=r"missing field\(s\) input_dtypes; unknown field\(s\) "
                                        r"new_field"):
        load_dumps([bad])
    with pytest.raises(DumpError, match=r"missing field\(s\) entries"):
        load_dumps([{"version": "2.10", "pg_config": {}}])


@pytest.mark.parametrize("field,value,match", [
    ("input_sizes", [[1] * (MAX_DIMS + 1)], "dimensions"),
    ("input_sizes", [[2**60]], "dimension"),
    ("input_sizes", "x" * 10, "list of at most"),
    ("collective_seq_id", -1, "integer in"),
    ("collective_seq_id", True, "integer in"),
    ("profiling_name", "a" * 100_000, "at most 4096 characters"),
])
def test_hostile_sizes_are_refused(field: str, value: Any, match: str) -> None:
    e = entry(1)
    e[field] = value
    with pytest.raises(DumpError, match=match):
        load_dumps([dump([e])])


def test_shared_references_cannot_blow_up_parsing(tmp_path: Path) -> None:
    # one shapes list of 4096 x 64 dims, shared by reference by 100 entries in a pickle:
    # 26M dimensions for a file of a few KB
    shapes = [[1] * MAX_DIMS] * 4096
    e = entry(1)
    e["input_sizes"] = shapes
    data = pickle.dumps(dump([e] * 100))
    assert len(data) < 100_000
    with pytest.raises(DumpError, match="more than 16,000,000 shape dimensions"):
        load_dumps([tmp_path / "fr_0"] if (tmp_path / "fr_0").write_bytes(data) else [])


def test_oversized_file_is_refused_before_reading(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpviz._postmortem import dumps

    monkeypatch.setattr(dumps, "MAX_FILE_BYTES", 100)
    (tmp_path / "fr_0").write_text(json.dumps(dump([entry(1)])))
    with pytest.raises(DumpError, match="more than the 100"):
        load_dumps(tmp_path)


def test_alignment_on_crafted_dumps() -> None:
    r0 = dump([entry(1), entry(2), entry(3, retired=False)])
    r1 = dump([entry(1), entry(2, numel=8)])
    pm = ddpviz.postmortem([r0, r1])
    kinds = sorted(f.kind for f in pm.findings)
    assert kinds == ["collective_mismatch", "rank_hang"]
    hang = next(f for f in pm.findings if f.kind == "rank_hang")
    assert hang.ranks == (1,) and "never launched collective #3" in hang.title
    mm = next(f for f in pm.findings if f.kind == "collective_mismatch")
    # both from train.py:3 (the frames of entry()): one line, other sizes
    assert mm.field == "size" and mm.ranks == (0, 1)
    assert dict(mm.values)["all_reduce [8] float32 at train.py:3 in train"] == (1,)
    assert mm.fix == fix_for("collective_mismatch", "same_site")
    rows = json.loads(pm.to_json())["ranks"]
    assert rows[1]["last_completed"].startswith("#2 ") and rows[1]["first_pending"] == "-"


def test_missing_dump_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "fr_0").write_text(json.dumps(dump([entry(1)], ranks="[0, 1, 2]")))
    (tmp_path / "fr_2").write_text(json.dumps(dump([entry(1)], ranks="[0, 1, 2]")))
    pm = ddpviz.postmortem(tmp_path)
    assert [f.ranks for f in pm.findings if f.kind == "missing_rank"] == [(1,)]


def test_cli_bad_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    from ddpviz.cli import main

    assert main(["postmortem", str(tmp_path)]) == 2
    assert "ddpviz: no Flight Recorder dumps in" in capsys.readouterr().err


def test_show_escapes_dump_text() -> None:
    r0 = dump([entry(1), entry(2, op="<script>alert(1)</script>", retired=False)])
    r1 = dump([entry(1)])
    view = ddpviz.postmortem([r0, r1]).show()
    text = view.html.value
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "rank 1 never launched collective #2" in text
    assert text.count("background:#f04438") == 1  # the one pending collective, in red


def test_unknown_setting_is_a_clear_error() -> None:
    from tests.postmortem.jobs import make_model

    with pytest.raises(ValueError, match=r"unknown key\(s\) 'bucket_cap'; expected some of "
                                         r"bucket_cap_mb, bucket_cap_mb_list"):
        ddpviz.postmortem([dump([entry(1)])], make_model(), settings={"bucket_cap": 1})
