"""diagnose() over hand-built event lists: one test per finding kind, no processes.

Each test plants one situation in the events of one rank (as the engine or watch() would have
emitted them) and asserts the exact finding: kind, parameter name, ranks, field, step, bucket
and the per-rank values.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose, mismatch_findings
from ddpviz.events import Mismatch
from ddpviz.findings import Finding, Findings, format_findings
from ddpviz.traces.trace import Trace
from tests.diagnose.synthetic import Ranks


def only(findings: list[Finding], kind: str) -> Finding:
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, findings
    return matching[0]


def clean_run(world_size: int = 2, steps: int = 3) -> Ranks:
    run = Ranks(world_size)
    run.construct()
    for step in range(steps):
        for r in range(world_size):
            run.iteration(r, step)
    return run


def test_a_clean_run_has_no_findings() -> None:
    assert diagnose(clean_run().events) == []


def test_verification_mismatches_become_findings_naming_parameter_ranks_and_field() -> None:
    run = Ranks(3)
    shape = Mismatch("param", 2, "fc2.weight", "shape", (("(4, 16)", (0, 1)), ("(5, 16)", (2,))))
    count = Mismatch("count", -1, "parameters", "count", (("8", (0, 1)), ("10", (2,))))
    for r in range(3):
        run.emit(r, ev.VerificationFailed, 3, (count, shape), step=-1)
    findings = diagnose(run.events)
    assert [f.kind for f in findings] == ["param_mismatch", "param_mismatch"]
    counted, shaped = findings
    assert counted.matches(field="count", name="parameters", ranks=(2,),
                           values=(("8 parameters", (0, 1)), ("10 parameters", (2,))))
    assert shaped.matches(field="shape", name="fc2.weight", param=2, ranks=(2,), world_size=3)
    assert str(shaped).splitlines() == [
        "ddpviz: parameter 2 'fc2.weight' has a different shape across ranks (world_size=3):",
        "  ranks 0,1: (4, 16)",
        "  rank 2:    (5, 16)",
        "All ranks must build the same model; look for rank-dependent construction.",
    ]


@pytest.mark.parametrize(("field", "fix_word"), [("dtype", "Cast"), ("stride", "memory format"),
                                                  ("order", "Register"), ("name", "Name")])
def test_each_mismatch_field_gets_its_own_fix(field: str, fix_word: str) -> None:
    m = Mismatch("param", 0, "w", field, (("a", (0,)), ("b", (1,))))
    (finding,) = mismatch_findings([m], 2)
    assert finding.field == field and fix_word in finding.fix
    assert finding.ranks == (1,)


def test_buffer_count_mismatch_is_a_buffer_finding() -> None:
    m = Mismatch("count", -1, "buffers", "count", (("4", (0,)), ("3", (1,))))
    (finding,) = mismatch_findings([m], 2)
    assert finding.matches(kind="buffer_mismatch", field="count", name="buffers")


def test_reported_findings_from_every_rank_count_once() -> None:
    run = clean_run()
    f = Finding(kind="initial_values", severity="warning", title="values differ", ranks=(1,),
                name="fc1.weight", field="values", world_size=2)
    for r in range(2):
        run.emit(r, ev.FindingReported, f)
    assert diagnose(run.events) == [f]


def test_rank_local_reassigned_buffer_findings_merge_into_one_naming_both_ranks() -> None:
    run = clean_run()
    for r in range(2):
        run.emit(r, ev.FindingReported, Finding(
            kind="buffer_reassigned", severity="warning",
            title=f"buffer 'stats' was reassigned at step 1 on rank {r}", ranks=(r,),
            name="stats", field="identity", step=1, values=(("reassigned", (r,)),)))
    (finding,) = diagnose(run.events)
    assert finding.ranks == (0, 1)
    assert finding.values == (("reassigned", (0, 1)),)
    assert "ranks 0,1" in finding.title


def test_unused_parameter_on_one_rank_is_diffed_across_ranks() -> None:
    run = clean_run(steps=0)
    for r in range(2):
        run.emit(r, ev.ForwardStarted, step=0)
    run.emit(1, ev.UnusedParametersFound, (2,), ("fc2.weight",))
    for step in (1, 2):
        run.emit(0, ev.ForwardStarted, step=step)
        run.emit(1, ev.ForwardStarted, step=step)
        run.emit(1, ev.UnusedParametersFound, (2,), ("fc2.weight",))
    finding = only(diagnose(run.events), "unused_parameter")
    assert finding.matches(name="fc2.weight", param=2, ranks=(1,), field="unused", step=0,
                           values=(("used", (0,)), ("unused", (1,))))
    assert "(and 2 later steps)" in finding.title
    assert "find_unused_parameters=True" in finding.fix


def test_parameter_unused_everywhere_is_named_as_such() -> None:
    run = clean_run(steps=0)
    for r in range(2):
        run.emit(r, ev.ForwardStarted, step=0)
        run.emit(r, ev.UnusedParametersFound, (0, 1), ("fc1.weight", "fc1.bias"))
    findings = [f for f in diagnose(run.events) if f.kind == "unused_parameter"]
    assert [f.name for f in findings] == ["fc1.weight", "fc1.bias"]
    assert all(f.ranks == (0, 1) and "every rank" in f.title for f in findings)


def test_an_engine_reported_unused_error_replaces_the_computed_warning() -> None:
    run = clean_run(steps=0)
    run.emit(1, ev.ForwardStarted, step=0)
    run.emit(1, ev.UnusedParametersFound, (2,), ("fc2.weight",))
    reported = Finding(kind="unused_parameter", severity="error", title="t", name="fc2.weight",
                       ranks=(1,))
    run.emit(1, ev.FindingReported, reported)
    assert [f for f in diagnose(run.events) if f.kind == "unused_parameter"] == [reported]


def test_a_hook_firing_twice_in_one_iteration_is_named() -> None:
    run = clean_run(steps=1)
    run.iteration(0, 1)
    run.iteration(1, 1, order=(3, 2, 2, 1, 0))
    finding = only(diagnose(run.events), "hook_fired_twice")
    assert finding.matches(name="fc2.weight", param=2, ranks=(1,), step=1, field="hook",
                           values=(("fired once", (0,)), ("fired twice", (1,))))


def test_grad_ready_order_difference_is_mapped_to_the_bucket_it_delays() -> None:
    buckets = ((3, 1), (2, 0))
    run = Ranks(2)
    run.construct(buckets=buckets)
    for step in range(2):
        run.iteration(0, step, order=(3, 1, 2, 0), buckets=buckets)
        run.iteration(1, step, order=(3, 2, 1, 0), buckets=buckets)
    finding = only(diagnose(run.events), "grad_order")
    assert finding.matches(ranks=(1,), step=0, bucket=0, field="grad_order", param=1,
                           name="fc1.bias", severity="warning")
    assert finding.values == (("fc2.bias -> fc1.bias -> fc2.weight -> fc1.weight", (0,)),
                              ("fc2.bias -> fc2.weight -> fc1.bias -> fc1.weight", (1,)))
    assert "  rank 0: after 2 of 4 gradients" in finding.detail
    assert "  rank 1: after 3 of 4 gradients" in finding.detail
    assert "the order differs in 2 steps (0, 1)" in finding.detail


def test_a_rank_skipping_an_all_reduce_is_a_collective_mismatch() -> None:
    run = clean_run(steps=1)
    run.iteration(0, 1)
    run.iteration(1, 1, reduce=False)  # no_sync() on rank 1 only
    for r in range(2):
        run.iteration(r, 2)
    finding = only(diagnose(run.events), "collective_mismatch")
    assert finding.matches(step=1, ranks=(1,), field="collectives",
                           values=(("all-reduce b0", (0,)), ("no collectives", (1,))))


def test_an_extra_forward_on_one_rank_names_that_rank() -> None:
    """An evaluation through the DDP on rank 0 only, after step 1's backward: its buffer
    broadcast is rank 0's extra collective (rank 1 is not the odd one because it comes later
    in the values); a broadcast at the start of a step on rank 0 only, seen before at every
    step, sets no rank apart."""
    run = clean_run(steps=1)
    for r in range(2):
        run.iteration(r, 1)
    run.emit(0, ev.BuffersSynced, 2, 64)  # rank 0's evaluation forward (no step of its own)
    for r in range(2):
        run.iteration(r, 2)
    finding = only(diagnose(run.events), "collective_mismatch")
    assert finding.matches(step=1, ranks=(0,), field="collectives")
    assert finding.title == "rank 0 issued collectives at step 1 that rank 1 did not"

    both = Ranks(2)
    both.construct()
    for step in range(3):
        for r in range(2):
            both.emit(r, ev.ForwardStarted, step=step)
            if step < 2 or r == 1:  # rank 0 skips its broadcast at step 2
                both.emit(r, ev.BuffersSynced, 2, 64)
            both.emit(r, ev.BackwardStarted)
            both.emit(r, ev.BackwardFinished)
    for r in range(2):
        both.emit(r, ev.ForwardStarted, step=3)
    finding = only(diagnose(both.events), "collective_mismatch")
    assert finding.matches(step=2, ranks=(0, 1))
    assert finding.title == "ranks issued different collectives at step 2"


def test_a_rank_with_no_events_is_missing() -> None:
    run = Ranks(3)
    run.construct(ranks=[0, 1], world_size=3)
    finding = only(diagnose(run.events), "missing_rank")
    assert finding.matches(ranks=(2,), values=(("sent events", (0, 1)), ("no events", (2,))))


def test_a_lagging_rank_is_named_with_where_the_others_wait() -> None:
    run = clean_run(steps=2)
    run.iteration(0, 2, finish=False)  # rank 0 is left inside step 2's all-reduce
    findings = diagnose(run.events)
    uneven = only(findings, "uneven_iterations")
    assert uneven.matches(ranks=(1,), step=2,
                          values=(("last step 2", (0,)), ("last step 1", (1,))))
    hang = only(findings, "rank_hang")
    assert hang.ranks == (1,)
    assert hang.values[0] == ("inside the all-reduce of bucket 0 at step 2", (0,))
    assert hang.values[1][1] == (1,) and "BackwardFinished at step 1" in hang.values[1][0]


def test_a_reported_hang_replaces_the_one_guessed_from_events() -> None:
    run = clean_run(steps=2)
    run.iteration(0, 2, finish=False)
    reported = Finding(kind="rank_hang", severity="error", title="rank 1 did not reach ...",
                       ranks=(1,), world_size=2)
    run.emit(0, ev.FindingReported, reported)
    hangs = [f for f in diagnose(run.events) if f.kind == "rank_hang"]
    assert hangs == [reported]


def test_dropped_events_are_reported_as_info() -> None:
    run = clean_run(steps=1)
    run.emit(1, ev.EventsDropped, 17)
    finding = only(diagnose(run.events), "events_dropped")
    assert finding.matches(severity="info", ranks=(1,), values=(("17 dropped", (1,)),))


def test_diagnose_reads_traces_files_and_anything_with_a_trace(tmp_path: Path) -> None:
    run = clean_run(steps=1)
    run.iteration(1, 1, order=(3, 2, 2, 1, 0))
    trace = Trace(run.events)
    path = trace.save(tmp_path / "run.ddpviz")

    class HasTrace:
        def __init__(self, trace: Trace) -> None:
            self.trace = trace

    expected = diagnose(run.events)
    assert expected and diagnose(trace) == expected
    assert diagnose(path) == expected and diagnose(str(path)) == expected
    assert diagnose(HasTrace(trace)) == expected
    with pytest.raises(TypeError, match="ddpviz: diagnose"):
        diagnose(42)


def test_findings_survive_the_wire_inside_events(tmp_path: Path) -> None:
    f = Finding(kind="rank_hang", severity="error", title="t", ranks=(1,),
                values=(("waiting", (0,)), ("last seen at step 1", (1,))), world_size=2)
    run = Ranks(2)
    run.emit(0, ev.FindingReported, f)
    loaded = Trace.load(Trace(run.events).save(tmp_path / "f.ddpviz"))
    assert loaded.events()[0].finding == f  # type: ignore[attr-defined]


def test_several_findings_read_as_one_message_errors_first_fixes_last() -> None:
    warning = Finding(kind="grad_order", severity="warning", title="order differs",
                      values=(("a", (0,)), ("b", (1,))), fix="Fix order.", world_size=2)
    error = Finding(kind="rank_hang", severity="error", title="rank 1 hangs", fix="Fix hang.",
                    world_size=2)
    lines = format_findings([warning, error]).splitlines()
    assert lines[0] == "ddpviz: 2 findings (1 error, 1 warning) (world_size=2):"
    assert lines[1] == "error: rank 1 hangs:"
    assert lines[2] == "warning: order differs:"
    assert lines[-2:] == ["Fix hang.", "Fix order."]
    assert format_findings([]) == "ddpviz: no problems found."
    assert str(Findings([warning, error])) == format_findings([warning, error])
