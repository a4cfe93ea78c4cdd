"""Advice on synthetic runs whose answer is known, its outputs, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpviz import events as ev
from ddpviz.advisor import Advice, AdviceError, Candidate, CostModel, Line, advise
from ddpviz.cli import main
from ddpviz.traces.trace import Trace
from tests.advise.synthetic import linear_stack, run_trace

LATENCY, PER_BYTE = 2e-4, 5e-9  # 1 MiB takes 5.4 ms


def _exposed_last_bucket() -> Trace:
    # 8 parameters of 1 MiB, ready 10 ms apart; one 256 MiB bucket: its 42 ms all-reduce
    # starts only when the backward is over
    return run_trace(linear_stack(8, 512), bucket_cap_mb=256, latency_s=LATENCY,
                     seconds_per_byte=PER_BYTE, steps=6)


MEASURED = CostModel({"float32": Line(LATENCY, PER_BYTE)}, "measured")


def test_an_exposed_last_bucket_is_found_and_small_buckets_recommended() -> None:
    advice = advise(_exposed_last_bucket(), cost_model=MEASURED)
    cur, rec = advice.current, advice.recommended
    assert len(cur.buckets) == 1
    one_bucket = LATENCY + 8 * 2**20 * PER_BYTE
    assert cur.prediction.exposed_s == pytest.approx(one_bucket, rel=0.02)
    assert cur.prediction.step_s == pytest.approx(advice.measured_step_s)
    # per-MiB buckets: each all-reduce (5.4 ms) ends before the next gradient (10 ms), so only
    # the last one is exposed and the step shrinks by the difference
    assert len(rec.buckets) == 8
    one_mib = LATENCY + 2**20 * PER_BYTE
    assert rec.prediction.exposed_s == pytest.approx(one_mib, rel=0.05)
    assert advice.delta_s(rec) == pytest.approx(one_mib - one_bucket, rel=0.05)
    assert "exposed for" in advice.reason and "Use bucket_cap_mb" in advice.reason
    assert "Uncertain" not in advice.reason
    # candidates that build the same map predict the same step
    same = [r for r in advice.rows if len(r.buckets) == 8]
    assert len({round(r.prediction.step_s, 9) for r in same}) == 1


def test_a_setting_with_nothing_exposed_is_kept() -> None:
    # 1 MiB buckets already overlap; bigger ones expose more, no candidate beats it by 1%
    trace = run_trace(linear_stack(8, 512), bucket_cap_mb=1, latency_s=LATENCY,
                      seconds_per_byte=PER_BYTE, steps=6)
    advice = advise(trace, cost_model=MEASURED)
    assert advice.recommended is advice.current
    assert advice.reason.startswith("Keep the current setting (bucket_cap_mb=1)")
    worst = max(advice.rows, key=lambda r: r.prediction.step_s)
    assert len(worst.buckets) == 1


def test_contention_charges_hidden_all_reduces() -> None:
    trace = run_trace(linear_stack(8, 512), bucket_cap_mb=1, latency_s=LATENCY,
                      seconds_per_byte=PER_BYTE, steps=6)
    free = advise(trace, cost_model=MEASURED, candidates=[256])
    taking_turns = advise(trace, cost_model=MEASURED, candidates=[256], contention=1.0)
    # with contention 1 the 8 buckets' extra 7 latencies count, hidden or not
    gain_free = -free.delta_s(free.rows[1])
    gain_turns = -taking_turns.delta_s(taking_turns.rows[1])
    assert gain_free < 0  # one big bucket is worse when overlap is free
    assert gain_turns > gain_free


def test_too_few_sizes_makes_the_advice_say_so() -> None:
    advice = advise(_exposed_last_bucket())
    assert not advice.cost_model.separable
    assert "Uncertain" in advice.reason
    assert "only 1 distinct size(s)" in str(advice)


def test_records_table_and_json() -> None:
    advice = advise(_exposed_last_bucket(), cost_model=MEASURED,
                    candidates=[4, [1, 25], {"bucket_cap_mb": 0.5, "label": "half"},
                                Candidate("last", set_last_bucket_cap=True)])
    rows = advice.to_records()
    assert [r["candidate"] for r in rows] == [
        "current: as recorded", "cap 4 MiB", "list [1, 25]", "half", "last"]
    assert rows[0]["current"] and rows[0]["delta_vs_current_ms"] == 0
    assert sum(r["recommended"] for r in rows) == 1
    assert rows[2]["bucket_cap_mb_list"] == [1.0, 25.0]
    assert rows[1]["buckets"] == 2 and rows[3]["buckets"] == 8
    text = str(advice)
    assert "predicted" not in text.split("\n")[0] and "exposed comm ms" in text
    assert "<- recommended" in text
    data = json.loads(advice.to_json())
    assert data["recommended"] == advice.recommended.label
    assert data["cost_model"]["float32"]["latency_us"] == pytest.approx(LATENCY * 1e6)


def test_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _exposed_last_bucket().save(tmp_path / "run.ddpviz")
    assert main(["advise", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 2 and data["candidates"][0]["current"]
    assert {"candidate", "buckets", "predicted_exposed_comm_ms", "predicted_step_ms",
            "delta_vs_current_ms"} <= set(data["candidates"][0])
    assert main(["advise", str(path)]) == 0
    assert "bucket advice: 2 ranks" in capsys.readouterr().out


def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(tmp_path / "missing.ddpviz")]) == 2
    assert "ddpviz: no trace file" in capsys.readouterr().err
    junk = tmp_path / "junk.ddpviz"
    junk.write_bytes(b"not a trace at all")
    assert main(["advise", str(junk)]) == 2
    assert capsys.readouterr().err.startswith("ddpviz:")
    short = run_trace(linear_stack(4, 64), bucket_cap_mb=1, latency_s=LATENCY,
                      seconds_per_byte=PER_BYTE, steps=2).save(tmp_path / "short.ddpviz")
    assert main(["advise", str(short)]) == 2
    assert "Record at least 3 training steps" in capsys.readouterr().err


@pytest.mark.parametrize(("candidates", "says"), [
    ("4", "candidates is a str"),
    ([], "candidates is empty"),
    ([-1], "candidate 0 is -1"),
    ([float("nan")], "finite number"),
    ([True], "candidate 0 is True"),
    ([[1, "x"]], "candidate 0[1] is 'x'"),
    ([[]], "non-empty list"),
    ([{"bucket_cap": 4}], "unknown key(s) ['bucket_cap']"),
    ([{"bucket_cap_mb": 4, "bucket_cap_mb_list": [1, 4]}], "sets both"),
    ([{"set_last_bucket_cap": "yes"}], "set_last_bucket_cap is 'yes'"),
    ([None], "candidate 0 is None"),
])
def test_bad_candidates_are_named(candidates: object, says: str) -> None:
    with pytest.raises(AdviceError, match=r"^ddpviz: ") as info:
        advise(_exposed_last_bucket(), candidates=candidates)
    assert says in str(info.value)


def test_bad_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(AdviceError, match="cannot read a int"):
        advise(3)
    with pytest.raises(AdviceError, match="holds no events"):
        advise(Trace())
    no_grads = Trace(e for e in _exposed_last_bucket() if not isinstance(e, ev.GradReady))
    with pytest.raises(AdviceError, match=r"(?s)no GradReady events.*Recording\(every=1\)"):
        advise(no_grads)
    no_ctor = Trace(e for e in _exposed_last_bucket() if not isinstance(e, ev.ParamsBuilt))
    with pytest.raises(AdviceError, match="no ParamsBuilt event"):
        advise(no_ctor)
    with pytest.raises(AdviceError, match="contention is 2"):
        advise(_exposed_last_bucket(), contention=2)
    with pytest.raises(AdviceError, match="cost_model is a dict"):
        advise(_exposed_last_bucket(), cost_model={"float32": 1})  # type: ignore[arg-type]


def test_advise_is_public_and_lazy() -> None:
    import ddpviz

    assert ddpviz.advise is advise
    assert ddpviz.advisor.measure.__module__ == "ddpviz.advisor.measure"
    assert isinstance(advise(_exposed_last_bucket(), candidates=[1]), Advice)
