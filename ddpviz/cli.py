"""The `ddpviz` command line: `ddpviz demo`, `ddpviz buckets TARGET`, `ddpviz diagnose TRACE`,
`ddpviz report TRACE`, `ddpviz record -- COMMAND`, `ddpviz postmortem DUMP_DIR`,
`ddpviz advise TRACE`.

Every verb imports what it needs when it runs: the verbs that read traces (diagnose, report)
never load torch, which takes longer to import than they take to run (tests/test_layers.py
holds this)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from ddpviz.traces.source import RunSource


class TargetError(ValueError):
    """A TARGET that does not name a module factory."""


def load_target(target: str) -> tuple[nn.Module, Any]:
    """Resolve `package.module:callable` or `path/to/file.py:callable` and call it.

    The callable returns an nn.Module, or `(module, example_inputs)` so that the gradient-ready
    order can be measured. Raises TargetError with what was wrong and how to fix it.
    """
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise TargetError(
            f"ddpviz: TARGET {target!r} must be 'package.module:callable' or "
            "'path/to/file.py:callable', e.g. 'ddpviz.zoo:tiny_transformer'.")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"ddpviz: no file {str(path)!r} (from TARGET {target!r}); check "
                              "the path, relative to the current directory.")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise TargetError(f"ddpviz: cannot import {str(path)!r} as Python source.")
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise TargetError(f"ddpviz: importing {str(path)!r} failed: "
                              f"{type(e).__name__}: {e}") from e
        finally:
            sys.path.pop(0)
    else:
        try:
            mod = importlib.import_module(where)
        except ImportError as e:
            raise TargetError(f"ddpviz: cannot import module {where!r}: {e}. Is it installed "
                              "or on PYTHONPATH?") from e
    factory = getattr(mod, attr, None)
    if factory is None:
        names = sorted(n for n, v in vars(mod).items() if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == mod.__name__)
        raise TargetError(f"ddpviz: {where!r} has no attribute {attr!r}; callables there: "
                          f"{', '.join(names[:12]) or 'none'}.")
    if _is_module(factory):
        return factory, None
    if not callable(factory):
        raise TargetError(f"ddpviz: {target!r} is a {type(factory).__name__}, not a callable "
                          "returning an nn.Module.")
    try:
        made = factory()
    except Exception as e:
        raise TargetError(f"ddpviz: calling {target}() failed: {type(e).__name__}: {e}. The "
                          "factory must need no arguments.") from e
    module, example = (made if isinstance(made, tuple) and len(made) == 2 else (made, None))
    if not _is_module(module):
        raise TargetError(f"ddpviz: {target}() returned a {type(module).__name__}; it must "
                          "return an nn.Module or (nn.Module, example_inputs).")
    return module, example


def _is_module(x: object) -> bool:
    from torch import nn

    return isinstance(x, nn.Module)


def _buckets(args: argparse.Namespace) -> int:
    from ddpviz.plan import bucket_plan

    try:
        module, example = load_target(args.target)
    except TargetError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        plan = bucket_plan(module, bucket_cap_mb=args.bucket_cap_mb,
                           bucket_cap_mb_list=args.bucket_cap_mb_list,
                           find_unused_parameters=args.find_unused,
                           static_graph=args.static_graph, example_inputs=example)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(plan.to_json() if args.json else str(plan))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ddpviz.demo import run_demo

    return run_demo(args)


class TraceArgsError(ValueError):
    """TRACE arguments that do not name readable .ddpviz traces."""


def open_traces(paths: list[str]) -> RunSource:
    """TRACE arguments as one run (traces/source.py): a file as itself, a folder as its
    *.ddpviz files, several (one per rank of a run) merged. Raises TraceArgsError, with what
    was wrong and how to fix it, for anything unreadable."""
    from ddpviz.traces.source import SourceError, open_run
    from ddpviz.traces.trace import TraceError

    try:
        return open_run(paths)
    except (SourceError, TraceError) as e:
        raise TraceArgsError(str(e)) from e


def _diagnose(args: argparse.Namespace) -> int:
    from ddpviz._diagnose.diagnosis import diagnose
    from ddpviz._diagnose.verdict import diagnosis_json, diagnosis_text

    try:
        run = open_traces(args.trace)
    except TraceArgsError as e:
        print(_terminal(str(e)), file=sys.stderr)  # (msgspec quotes a file's bad value in it)
        return 2
    # End records that do not count (See [Note: whose end record counts], source.py) are said
    # in the verdict's text, or, under --json, on stderr: never a Python warning's traceback.
    notes = run.end_problems
    trace, files, ended = run.as_trace(), list(run.files), dict(run.ended or {})
    findings = diagnose(trace, ended=ended, rings={f.parent for f in files})
    if args.json:
        for note in notes:
            print(_terminal(note), file=sys.stderr)
        print(diagnosis_json(trace, findings, files, ended))
    else:
        print(diagnosis_text(trace, findings, files, ended, notes))
    return 1 if any(f.severity == "error" for f in findings) else 0


def _terminal(text: str) -> str:
    """A message of ddpviz's own for the terminal: its lines kept, anything a file put in them
    that could steer the terminal shown escaped (See [Note: text from a file, on a terminal],
    fileformat.py)."""
    from ddpviz.traces.fileformat import printable

    return "\n".join(printable(line) for line in text.split("\n"))


def _report(args: argparse.Namespace) -> int:
    from ddpviz.report.html import write_report

    try:
        run = open_traces(args.trace)
    except TraceArgsError as e:
        print(_terminal(str(e)), file=sys.stderr)  # (msgspec quotes a file's bad value in it)
        return 2
    for note in run.end_problems:  # as _diagnose says them
        print(_terminal(note), file=sys.stderr)
    trace, files = run.as_trace(), run.files
    first = files[0].parent if Path(args.trace[0]).is_dir() else files[0]
    out = Path(args.output) if args.output else first.with_suffix(".html")
    write_report(trace, out, title=f"ddpviz report: {', '.join(args.trace)}",
                 ended=dict(run.ended or {}))  # as _diagnose reads them
    print(f"ddpviz: wrote {out} ({len(trace)} events, ranks {trace.ranks})")
    return 0


def _record(args: argparse.Namespace) -> int:
    from ddpviz.record.command import RecordError, run_recorded

    try:
        return run_recorded(args.cmd, connect=args.connect, out=args.out,
                            hang_timeout=args.hang_timeout, recording=args.recording,
                            debug=args.debug or False)
    except RecordError as e:
        print(e, file=sys.stderr)
        return 2

def _advise(args: argparse.Namespace) -> int:
    from ddpviz.advisor import AdviceError, advise

    try:
        advice = advise(args.trace)
    except AdviceError as e:
        print(_terminal(str(e)), file=sys.stderr)
        return 2
    print(advice.to_json() if args.json else _terminal(str(advice)))  # (names from the trace)
    return 0


def _postmortem(args: argparse.Namespace) -> int:
    from ddpviz._postmortem import DumpError, postmortem
    from ddpviz.plan import PlanSettings

    module, example = None, None
    if args.model:
        try:
            module, example = load_target(args.model)
        except TargetError as e:
            print(e, file=sys.stderr)
            return 2
    settings = PlanSettings(args.bucket_cap_mb, tuple(args.bucket_cap_mb_list or ()) or None,
                            args.find_unused, args.static_graph)
    try:
        pm = postmortem(args.dump_dir, module, settings=settings, example_inputs=example)
    except (DumpError, OSError, ValueError) as e:
        print(_terminal(str(e)), file=sys.stderr)
        return 2
    print(pm.to_json() if args.json else _terminal(str(pm)))  # (names from the dumps)
    if args.trace:
        path = pm.to_trace().save(args.trace)
        print(f"ddpviz: wrote {path} (open it in JupyterLab or with ddpviz.Trace.load)",
              file=sys.stderr)
    return 1 if any(f.severity == "error" for f in pm.findings) else 0


# The shell's words differ where a command is not one Python call: `buckets` prints what
# bucket_plan() returns; `record` runs a whole command with every torch DDP in it watched, where
# watch() takes one DDP object. The mapping is printed rather than the verbs renamed.
PYTHON_NAMES = """\
in Python (import ddpviz):
  ddpviz buckets TARGET        ddpviz.bucket_plan(module)
  ddpviz record -- COMMAND     ddpviz.watch(torch_ddp) on every DDP the command builds
  ddpviz diagnose TRACE        ddpviz.diagnose(ddpviz.Trace.load(path))
  ddpviz report TRACE          ddpviz.report.write_report(trace, "run.html")
  ddpviz postmortem DUMP_DIR   ddpviz.postmortem(dump_dir, model)
  ddpviz advise TRACE          ddpviz.advise(trace)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddpviz", description="An interactive debugger for "
                                "PyTorch DistributedDataParallel.", epilog=PYTHON_NAMES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("buckets", help="print the bucket plan torch's DDP builds for a model")
    b.add_argument("target", help="module factory: package.module:callable or file.py:callable")
    b.add_argument("--bucket-cap-mb", type=float, default=None)
    b.add_argument("--bucket-cap-mb-list", type=float, nargs="+", default=None)
    b.add_argument("--find-unused", action="store_true", help="find_unused_parameters=True")
    b.add_argument("--static-graph", action="store_true", help="static_graph=True")
    b.add_argument("--json", action="store_true", help="print the plan as JSON")
    b.set_defaults(func=_buckets)
    d = sub.add_parser("demo", help="bucket plan of a built-in model, then a live 2-rank job")
    d.add_argument("--out", default=".", help="folder for the trace and the HTML report")
    d.add_argument("--steps", type=int, default=3, help="training steps of the 2-rank job")
    d.add_argument("--plan-only", action="store_true", help="only print the bucket plan")
    d.set_defaults(func=_demo)
    g = sub.add_parser("diagnose", help="print what is wrong in a recorded run (exit 1 when a "
                       "finding is an error, 2 when the trace cannot be read)")
    g.add_argument("trace", nargs="+", help="trace file(s) or folder(s) of *.ddpviz files; "
                   "several (one per rank) are merged")
    g.add_argument("--json", action="store_true",
                   help="print the findings and a summary of the trace as JSON")
    g.set_defaults(func=_diagnose)
    r = sub.add_parser("report", help="write a self-contained HTML report of .ddpviz trace(s)")
    r.add_argument("trace", nargs="+", help="trace file(s) or folder(s) of *.ddpviz files; "
                   "several (one per rank) are merged")
    r.add_argument("-o", "--output", default=None,
                   help="HTML file (default: TRACE.html, or FOLDER.html for a folder)")
    r.set_defaults(func=_report)
    w = sub.add_parser("record", help="run an unmodified training command with every torch "
                       "DistributedDataParallel watched",
                       usage="ddpviz record [--connect STRING | --out DIR] [--hang-timeout S] "
                             "[--recording POLICY] -- COMMAND ...",
                       epilog="Security: ddpviz adds no listening socket to the job (ranks "
                              "send to the notebook or write files), but torchrun's own "
                              "rendezvous store (a TCPStore on --master-port) listens on all "
                              "interfaces, unauthenticated, whatever --master-addr says, and "
                              "ddpviz's watchdog uses it: it carries every rank's stack when a "
                              "hang is diagnosed (source lines and absolute paths; "
                              "--recording stack_source=false leaves the source text out), "
                              "hang alerts that stop the ranks, and the replica check's "
                              "digests and control keys (--recording replicas=never: off). "
                              "Anyone who reaches the port can read and write them: on a "
                              "shared or open network, firewall that port (or run the job "
                              "where only you can reach it). See docs/security.md.")
    where = w.add_mutually_exclusive_group()
    where.add_argument("--connect", default=None,
                       help="a notebook session's connect string (ddpviz.listen())")
    where.add_argument("--out", default=None,
                       help="folder for per-rank trace files (default: the current folder)")
    w.add_argument("--debug", nargs="?", const="on", default=None, choices=("on", "paused"),
                   help="with --connect: the ranks take the notebook debugger's commands "
                        "(pause, inspect, resume; ddpviz/debugger/); --debug=paused: every "
                        "rank also parks before its first forward, so breaks can be set "
                        "before anything runs")
    w.add_argument("--hang-timeout", type=float, default=None,
                   help="seconds before a hang is diagnosed (default: 0.6 x the process "
                        "group's timeout, at most 300; 0: off)")
    w.add_argument("--recording", default=None, metavar="POLICY",
                   help="what is recorded, as $DDPVIZ_RECORDING spells it: 'every=100' (the "
                        "default: no comm hook, per-parameter events every 100th step), "
                        "'guard,every=100' (watch's comm hook: a hang raised from backward), "
                        "'every=1', 'every=never'; 'replicas=N' checks that the ranks hold "
                        "the same parameters every N-th step (default 100; 1: every step, "
                        "never: off; docs/replicas.md); 'stack_source=false' keeps source "
                        "text out of hang stacks")
    w.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="the command, e.g. torchrun --nproc-per-node 2 train.py")
    w.set_defaults(func=_record)

    m = sub.add_parser("postmortem", help="read torch Flight Recorder dumps of a hung job and "
                       "name the bucket, step and ranks it hung on")
    m.add_argument("dump_dir", help="folder of per-rank dumps (PREFIX<rank>, JSON or pickle)")
    m.add_argument("--model", default=None, help="module factory, as for `ddpviz buckets`")
    m.add_argument("--bucket-cap-mb", type=float, default=None)
    m.add_argument("--bucket-cap-mb-list", type=float, nargs="+", default=None)
    m.add_argument("--find-unused", action="store_true", help="find_unused_parameters=True")
    m.add_argument("--static-graph", action="store_true", help="static_graph=True")
    m.add_argument("--json", action="store_true", help="print findings and positions as JSON")
    m.add_argument("--trace", default=None, metavar="OUT.ddpviz",
                   help="also write the post-mortem as a .ddpviz trace (JupyterLab viewer)")
    m.set_defaults(func=_postmortem)

    a = sub.add_parser("advise", help="predict the step time of other bucket settings from one "
                       "recorded run and recommend one")
    a.add_argument("trace", help="a .ddpviz trace of one run (3+ steps)")
    a.add_argument("--json", action="store_true", help="print the advice as JSON")
    a.set_defaults(func=_advise)
    return p


def main(argv: list[str] | None = None) -> int:
    from ddpviz.findings import on_the_command_line

    try:
        args = build_parser().parse_args(argv)  # (--help prints)
        with on_the_command_line():  # a fix names `ddpviz record --recording ...`
            code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
    except BrokenPipeError:
        # The reader left (`ddpviz diagnose DIR | head`): stop quietly, as a command killed by
        # SIGPIPE does, and point stdout at /dev/null so the interpreter's last flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    return code


if __name__ == "__main__":
    raise SystemExit(main())
