"""The diagnosis vocabulary: a `Finding` says what is wrong, where (parameter, bucket, step),
on which ranks, with which values per rank, and the likely fix; and how findings read.

Findings are frozen msgspec Structs so they can travel inside `events.FindingReported` and
land in traces. The text follows the house style: the first line says what differs (index,
dotted name, world size), then one line per distinct value with its ranks, then the fix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

from ddpviz.envvars import ENV_RECORD
from ddpviz.limits import (
    MAX_WORLD_SIZE,
    BucketIndexOrNone,
    Lines,
    Name,
    ParamIndexOrNone,
    Ranks,
    RankValues,
    Step,
    TensorGroups,
    Text,
    WorldSizeOrUnknown,
)

Severity = Literal["error", "warning", "info"]

# Every kind of finding. Keep in step with KINDS (what each means), FIXES and the docs.
Kind = Literal[
    "param_mismatch", "buffer_mismatch", "gpu_shared", "initial_values", "unused_parameter",
    "hook_fired_twice", "graph_changed", "grad_order", "missing_rank", "rank_waiting",
    "rank_hang", "rank_exited", "peer_failed", "uneven_iterations", "collective_mismatch",
    "buffer_reassigned", "events_dropped", "plan_mismatch", "straggler", "nonfinite_gradient",
    "nonfinite_parameter", "replicas_diverged", "unmatched_collective", "unsynced_gradients",
]

# Every kind of finding, with what its fields mean.
KINDS: dict[Kind, str] = {
    "param_mismatch": "a parameter differs across ranks (field: present, name, order, shape, "
                      "stride, dtype, device, requires_grad, sparse_grad; or count)",
    "buffer_mismatch": "a buffer differs across ranks (field: present, name, order, shape, "
                       "dtype, device; or count)",
    "gpu_shared": "two ranks on one host use the same GPU",
    "initial_values": "parameter values differ before DDP's broadcast (usually a missing seed)",
    "unused_parameter": "a parameter got no gradient in a backward, on some or all ranks",
    "hook_fired_twice": "a parameter's gradient hook fired twice in one iteration",
    "graph_changed": "static_graph=True, but the set of parameters with gradients changed",
    "grad_order": "gradients became ready in a different order on some ranks",
    "missing_rank": "a rank never arrived where every rank must (or sent no events)",
    "rank_waiting": "live, before the hang deadline: ranks wait for others that have not "
                    "arrived yet (who is missing, since when)",
    "rank_hang": "ranks wait in a collective that other ranks did not reach",
    "rank_exited": "a rank's connection closed while others waited for it (exit or crash), or "
                   "a rank died of an uncaught exception (field: exception; name: its type; "
                   "values: its message and where it was raised)",
    "peer_failed": "this rank stopped because another rank failed",
    "uneven_iterations": "ranks ran different numbers of iterations",
    "collective_mismatch": "ranks issued different collectives in the same iteration, or at "
                           "the same position of a process group's sequence (op, dtype, size, "
                           "source rank, group: the job's own collectives, each rank's call "
                           "site in values)",
    "buffer_reassigned": "a buffer was replaced by a new tensor instead of updated in place",
    "events_dropped": "events were lost on the way, so the diagnosis may be incomplete",
    "plan_mismatch": "a rank's collectives differ from DDP's plan for the given model and "
                     "settings (bucket sizes or order; post-mortem)",
    "straggler": "one rank is persistently the last to launch the all-reduces, so every step "
                 "waits for it (field: where it loses the time: data, forward, backward, "
                 "compute, and with the optimizer step recorded optimizer and after_backward; "
                 "cpu_wait, severity info, when its main thread's wait for a CPU accounts for "
                 "the lateness: its host's load, not its code; bucket: the bucket before "
                 "whose launch it loses most)",
    "nonfinite_gradient": "a rank's local gradient (before the all-reduce spread it) or its "
                          "loss was NaN/Inf: ranks = where it began, name = the first such "
                          "parameter in gradient-ready order, field 'loss' when the loss was "
                          "already non-finite there (docs/nonfinite.md)",
    "nonfinite_parameter": "parameters became NaN/Inf in a step's update; step = that step; "
                           "detail says whether its local gradients were seen finite",
    "replicas_diverged": "after an optimizer step, ranks hold different bytes for some "
                         "parameters or buffers (field: parameter or buffer; step: the "
                         "checked step; values: which ranks agree with which)",
    "unmatched_collective": "some ranks issued a collective through torch.distributed at a "
                            "position of a process group's sequence where the others issued "
                            "something else (DDP's collectives, or a call ddpviz does not see): "
                            "ranks = the ranks that issued it; values = what each rank did "
                            "there, with call sites",
    "unsynced_gradients": "an optimizer step used gradients that DDP never all-reduced, so "
                          "each rank applied its own (field: why: module_forward = the DDP's "
                          "forward did not run since the last step, no_sync = the last "
                          "backward ran under no_sync(), unused_ddp = the DDP was never "
                          "called; step: that optimizer's step count; values: each rank's "
                          "backward and optimizer-step call sites; docs/errors.md)",
}

# The model differs across ranks: one fix per differing field ("" for any other field).
_MODEL_FIXES = {
    "": "All ranks must build the same model; look for rank-dependent construction.",
    "dtype": "Cast the model the same way on every rank: look for .half()/.to(dtype)/autocast "
             "setup under a rank condition. (torch never checks dtypes: it crashes in the "
             "broadcast instead.)",
    "stride": "Convert the memory format on every rank or on none: look for "
              ".to(memory_format=torch.channels_last) under a rank condition.",
    "order": "Register submodules in the same order on every rank: the order of attribute "
             "assignment in __init__ decides parameters() order, and with it the buckets.",
    "name": "Name submodules the same on every rank: state_dict keys and DDP's ignore lists "
            "depend on the names.",
    "requires_grad": "Freeze the same parameters on every rank (requires_grad_(False) under a "
                     "rank condition?).",
    "device": "Move the whole model to the same kind of device on every rank.",
}
_SAME_COLLECTIVES = ("Every rank must issue the same collectives in the same order: look for "
                     "no_sync() or an extra forward/backward on some ranks only, uneven inputs "
                     "(use ddp.join()), or collectives only some ranks call.")

# The likely fix for each kind of finding, one text per situation: FIXES[kind][variant], where
# "" is the kind's usual situation. Texts with {fields} are filled by `fix_for`.
FIXES: dict[Kind, dict[str, str]] = {
    "param_mismatch": _MODEL_FIXES,
    "buffer_mismatch": _MODEL_FIXES,
    "gpu_shared": {
        "": "Give each rank its own GPU: call torch.cuda.set_device(local_rank) before building "
            "the model and move the model to that device.",
    },
    "initial_values": {
        "": "Usually a missing torch.manual_seed(...) before building the model (DDP then "
            "trains from rank 0's values, so this is harmless unless you rely on every rank's "
            "own initialization, e.g. when comparing runs). Seed every rank the same way.",
    },
    "unused_parameter": {
        # some ranks (or this rank) skipped parameters, find_unused_parameters=False
        "": "Use these parameters in every forward on every rank (and make every output that "
            "depends on them part of the loss), or pass find_unused_parameters=True to "
            "DistributedDataParallel.",
        # every rank skipped the parameter, in every step seen
        "all": "Remove the parameter or freeze it (requires_grad_(False)); or keep "
               "find_unused_parameters=True, which walks the autograd graph every iteration.",
    },
    "hook_fired_twice": {
        "": "A parameter's gradient was accumulated twice before DDP reduced it: reentrant "
            "activation checkpointing (use use_reentrant=False, or static_graph=True), or two "
            "backward passes per forward. Run one backward per forward under DDP.",
    },
    "graph_changed": {
        "": "Use the same parameters in every iteration with static_graph=True, or use "
            "find_unused_parameters=True instead.",
    },
    "grad_order": {
        "": "Not an error, but buckets are rebuilt in rank 0's order, so other ranks launch "
            "all-reduces later and overlap less. Make forward the same on every rank (no "
            "rank-dependent branches or data-dependent module order).",
        # per-parameter events not recorded at some steps (Recording.every)
        "not_recorded": "To check those steps, record every step's gradients: "
                        "{recording[every=1]}; the default, every=100, records steps 0-2, "
                        "the rebuild, every 100th step and steps with a finding in full.",
    },
    "missing_rank": {
        # a meeting (rendezvous) some ranks never reached
        "": "A rank that never arrives crashed, is stuck earlier (data loading, a collective "
            "only it runs, a deadlock), or skips this code path: read {ranks}'s output and "
            "look for rank-dependent control flow.",
        # a trace without events from some ranks
        "events": "A rank without events never built the DDP (crashed or stuck before it), or "
                  "was not connected: call ddpviz.connect() on every rank, or use "
                  "ddpviz.launch.",
        # post-mortem: Flight Recorder dumps missing
        "dumps": "Collect every rank's dump (TORCH_FR_DUMP_TEMP_FILE=PREFIX writes "
                 "PREFIX<rank>); without it the post-mortem cannot say where that rank stood.",
    },
    "rank_waiting": {
        "": "Nothing to do yet: if they do not come, a RankHangError names where they are.",
    },
    "rank_hang": {
        # the ranks that did not arrive are behind (an earlier step)
        "behind": "A rank that is behind ran out of data (uneven inputs: use ddp.join(), or "
                  "the same number of batches on every rank, e.g. DistributedSampler with "
                  "drop_last=True), is stuck outside DDP (data loading, I/O, a collective only "
                  "it runs), or is just slower than hang_timeout allows (raise it).",
        # the ranks that did not arrive are at the same step
        "": "A rank at the same step that never reached this collective skipped it: look for "
            "no_sync() or an extra backward on some ranks only, or rank-dependent control "
            "flow around forward/backward.",
        # every rank waits in the same collective
        "stuck": "The collective itself is stuck: check the network and the backend "
                 "(NCCL_DEBUG=INFO), or raise hang_timeout if it is just slow.",
        # post-mortem: some ranks never launched a collective others did
        "dumps": "Look at what the ranks that never launched it were doing at that point (their "
                 "last completed collective above): a skipped backward, an unused parameter "
                 "with find_unused_parameters=False, an exception or a rank-dependent branch.",
    },
    "rank_exited": {
        # the rank's own uncaught exception (probes/exit_error.py)
        "exception": "Fix the exception on rank {rank} (its traceback is above, and in that "
                     "rank's output); the other ranks stopped because it did.",
        "": "Read the output of the rank that stopped: it crashed, or returned early (uneven "
            "inputs: use ddp.join(), or the same number of batches on every rank).",
        "store": "Read the output of rank 0 (or the host of MASTER_ADDR): it stopped first.",
    },
    "peer_failed": {
        "": "Fix the error on rank {rank}; this rank stopped instead of hanging.",
    },
    "uneven_iterations": {
        "": "Give every rank the same number of batches (DistributedSampler with "
            "drop_last=True) or wrap the loop in `with ddp.join():`; harmless if the run used "
            "join().",
        # live: a rank left the loop while its peers went on (whereabouts.py)
        "left_loop": "Give every rank the same number of steps: DistributedSampler(..., "
                     "drop_last=True) for a map-style dataset, the same number of batches per "
                     "rank from an IterableDataset, no `break` that only some ranks take; or "
                     "wrap the loop in `with model.join():` (torch.distributed.algorithms.Join)"
                     ", which lets ranks that run out of data shadow the others' all-reduces.",
    },
    "collective_mismatch": {
        "": _SAME_COLLECTIVES,
        # post-mortem: one sequence id, different collectives
        "sequence": "Ranks launched different collectives under one sequence id: a collective "
                    "was skipped or added on some ranks before this point.",
        # live: the job's own collectives differ at one position of a group's sequence
        "job": "Every rank must issue the same collectives, with the same dtype, size, source "
               "rank and process group, in the same order: make the sizes agree (pad, or "
               "all_gather the sizes first), use the same src on every rank, and call "
               "rank-dependent collectives on every rank of the group or on none.",
        # post-mortem: one line of the job's code, called with other sizes or dtypes per rank
        "same_site": "Every rank called this collective from the same line with tensors of "
                     "other sizes or dtypes: pass the same shape and dtype on every rank (pad "
                     "to a common size, or exchange the sizes first); gloo and NCCL may "
                     "complete it with garbage instead of failing.",
        # post-mortem: a rank launched collectives beyond DDP's plan
        "extra": "Every rank must launch the same collectives in the same order on a process "
                 "group: move rank-dependent collectives (logging, metrics) out of the training "
                 "step, or run them on every rank.",
    },
    "buffer_reassigned": {
        "": "Update buffers in place: `self.stats.mul_(0.9).add_(m)` or `self.stats.copy_(new)` "
            "under torch.no_grad(), instead of assigning a new tensor.",
    },
    "events_dropped": {
        "": "Raise the sender's capacity (ddpviz.connect(capacity=...)) or emit fewer events.",
    },
    "plan_mismatch": {
        "": "Build DDP with the same bucket_cap_mb, bucket_cap_mb_list, find_unused_parameters "
            "and static_graph on every rank, or pass the settings this rank used to "
            "postmortem(settings=...) if the dumps are of a different configuration.",
    },
    "straggler": {
        # late at the forward: the gap after the previous backward
        "data": "Look at this rank's data loading and optimizer step: more DataLoader "
                "workers or pin_memory, a shard or files on slower storage, per-rank logging "
                "or checkpointing between steps, or a host with fewer free cores.",
        # the optimizer step recorded (the gap before the forward split): data loading alone
        "data_loading": "Look at this rank's data loading: more DataLoader workers or "
                        "pin_memory, a shard or files on slower storage, a sampler giving it "
                        "larger or harder samples, or a host with fewer free cores.",
        "optimizer": "Look at this rank's optimizer step: a different optimizer or settings "
                     "on this rank, optimizer state offloaded to slower memory, the foreach or "
                     "fused implementation unavailable there, per-rank work in an optimizer "
                     "hook, or a host with fewer free cores.",
        # its wait for a CPU accounts for it (probes/cpu_wait.py)
        "cpu_wait": "Look at what else runs on this rank's host (top, or ps -eLf for "
                    "threads): another job or a CPU hog, more DataLoader workers than free "
                    "cores, or OpenMP/MKL threads (OMP_NUM_THREADS) oversubscribing them; "
                    "lower those counts, or give each rank its own cores (taskset, numactl).",
        "after_backward": "Look at what this rank does between backward() and "
                          "optimizer.step(): gradient clipping, logging or metrics on this rank "
                          "only, a host sync (loss.item(), .cpu()), or a checkpoint.",
        "": "Look at what makes this rank's compute slower: another process on its cores or "
            "GPU (nvidia-smi, top), thermal throttling, a different device, or rank-dependent "
            "work in forward/backward (a hook, a larger batch, extra layers).",
    },
    "nonfinite_gradient": {
        # the loss was finite on that rank
        "": "The loss was finite but {ranks}'s own gradient was not: an overflow in that "
            "layer's backward (under fp16 use torch.amp.GradScaler, which skips such steps, "
            "or bf16), a custom autograd function or gradient hook returning NaN/Inf, or a "
            "learning rate so high that activations blow up. Check finiteness on every rank, "
            "not on rank 0 only: the all-reduce gives every rank the NaN.",
        # the loss (forward output) was already non-finite on that rank
        "loss": "{ranks}'s forward output was already non-finite at step {step}: look at the "
                "batch that rank read (NaN/Inf in the data, a bad sample or augmentation, "
                "log/sqrt/division of 0) or an overflow in forward (fp16: autocast with "
                "torch.amp.GradScaler, a lower learning rate). A finite-check on rank 0 alone "
                "misses it: every rank gets the NaN from the all-reduce.",
        # the loss (forward output) was not checked on that rank at that step
        "unchecked": "{ranks}'s own gradient was non-finite at step {step}; its forward "
                     "output (the loss) was not checked at that step, so either can be where "
                     "it began: the batch that rank read (NaN/Inf in the data, log/sqrt/division "
                     "of 0), an overflow in forward or in that layer's backward (fp16: "
                     "torch.amp.GradScaler, or bf16), or a gradient hook returning NaN/Inf. "
                     "Check the loss's finiteness on every rank at that step.",
    },
    "nonfinite_parameter": {
        # the gradients were seen finite on every rank
        "": "The gradients were finite, so the update made the parameters non-finite: a "
            "learning rate too high, Adam's eps too small for fp16 parameters, weight decay "
            "or momentum on fp16 parameters (keep fp32 master weights), or code that edits "
            "parameters between backward and forward.",
        # the step's local gradients were not checked
        "unseen": "To name the rank and parameter where it began, check every step's local "
                  "gradients: {recording[guard]} (one check per bucket) or "
                  "{recording[every=1]}. The default checks them on every step where that "
                  "costs at most 1% of the step, else on every few steps (detail says how "
                  "often), and on every step for 100 steps after something went non-finite.",
    },
    "replicas_diverged": {
        "": "Every rank must apply the same update: look for code that changes parameters or "
            "the optimizer under a rank condition (if rank == 0: ...), per-rank learning "
            "rates or schedulers, and gradient clipping or loss scaling computed from local "
            "values.",
        "optimizer": "Build the optimizer (learning rate, schedule, state) identically on every "
                     "rank, and edit gradients (clipping, scaling) and parameters (clamping, "
                     "re-initialization, loading) on every rank or on none: look for "
                     "rank-conditional code between backward() and the next forward.",
        "grads": "Make every rank reduce every bucket in every step: no no_sync() or extra "
                 "backward on some ranks only, the same parameters used on every rank (or "
                 "find_unused_parameters=True), and a comm hook that returns the same result "
                 "everywhere.",
        "no_sync": "Enter no_sync() on every rank or on none (its condition must not depend on "
                   "the rank or on local data), and step the optimizer only after a backward "
                   "that all-reduced.",
        "buffers_local": "Nothing to fix if per-rank buffers are intended (broadcast_buffers="
                         "False); otherwise pass broadcast_buffers=True, or use "
                         "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) so BatchNorm "
                         "statistics are shared.",
        "buffers": "Update buffers inside forward (or on every rank alike): DDP broadcasts "
                   "rank 0's buffers before each forward, and a rank-local change after that "
                   "is not undone until the next one.",
    },
    "unmatched_collective": {
        "": "Every rank of a process group must issue the same collectives in the same order: "
            "a collective called under a rank condition (if rank == 0: barrier(), a debug "
            "all_reduce, a checkpoint save that synchronizes) pairs with whatever the other "
            "ranks issue next, often DDP's bucket all-reduce. Call it on every rank of the "
            "group, or move it out of the collective (save on rank 0 without a barrier inside "
            "the condition, then barrier() on every rank).",
        # a forward without gradients through the DDP on some ranks only
        "evaluation": "Evaluate on every rank, or on one rank through the module the DDP "
                      "wraps (ddp.module, under torch.no_grad()): a forward through the DDP "
                      "broadcasts its buffers from rank 0 (broadcast_buffers=True), and on "
                      "some ranks only that broadcast pairs with whatever the others issue "
                      "next.",
    },
    "unsynced_gradients": {
        "": "Step the optimizer only after a backward through the DDP's own forward outside "
            "no_sync() (loss = ddp(x)), or all-reduce the gradients yourself before the step.",
        # gradients flowed into the parameters, but the DDP's forward did not run
        "module_forward": "Compute the training loss through the DDP itself: loss = "
                          "ddp(x), not ddp.module(x) or the model it wraps (accelerate's "
                          "unwrap_model returns that model); keep ddp.module for work under "
                          "torch.no_grad() (evaluation, generation), or all-reduce the "
                          "gradients yourself before the step.",
        # the last backward before the step ran under no_sync()
        "no_sync": "Use no_sync() for the first k-1 micro-batches only and run the last one "
                   "outside it, so its backward all-reduces everything accumulated: "
                   "`ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()`; or "
                   "all-reduce the gradients yourself before optimizer.step().",
        # the DDP was built but never called
        "unused_ddp": "Call the DDP in the training step (loss = ddp(x)) instead of the model "
                      "it wraps; if each rank is meant to train on its own, do not wrap the "
                      "model in DistributedDataParallel.",
    },
}


def fix_for(kind: Kind, variant: str = "", **fields: object) -> str:
    """The fix for `kind` in situation `variant` (the kind's usual one when the variant has no
    text of its own), with {fields} filled in, and each {recording[POLICY]} as
    `recording_advice(POLICY)` spells it here."""
    table = FIXES[kind]
    text = table.get(variant, table[""])
    if "{" not in text:
        return text
    return text.format_map(_Fields(fields, recording=_RecordingWords()))


# [Note: a recording policy in the user's words]
# A fix that asks for another recording policy names it as the person reading it turns it on.
# A rank of a `ddpviz record` job ($DDPVIZ_RECORD=1, whose findings print on that command's
# terminal and land in its traces) and the `ddpviz` command line (diagnose, report, advise of
# those traces) say the flag: `ddpviz record --recording every=1 -- ...`. Python (watch(),
# ddpviz's DistributedDataParallel, diagnose() in a notebook) says `Recording(every=1)`.
_command_line = False  # set by `on_the_command_line()`


@contextlib.contextmanager
def on_the_command_line() -> Iterator[None]:
    """Spell recording policies as `ddpviz record`'s flag inside (cli.main runs a verb in it)."""
    global _command_line
    before, _command_line = _command_line, True
    try:
        yield
    finally:
        _command_line = before


def recording_advice(policy: str) -> str:
    """A recording policy, written as `ddpviz record --recording` takes it ("every=1",
    "guard", "replicas=1"), in the words of the person reading this process's messages.
    See [Note: a recording policy in the user's words].

    Args:
        policy: the policy as the flag spells it.

    Returns:
        "`ddpviz record --recording every=1 -- ...`" under `ddpviz record` and on the command
        line, else "recording=ddpviz.Recording(every=1)".
    """
    if _command_line or os.environ.get(ENV_RECORD) == "1":
        return f"`ddpviz record --recording {policy} -- ...`"
    words = ", ".join(part if "=" in part else f"{part}=True" for part in policy.split(","))
    return f"recording=ddpviz.Recording({words})"


class _RecordingWords:
    def __getitem__(self, policy: str) -> str:
        return recording_advice(policy)


class _Fields(dict[str, object]):
    """A fix's {fields}; a field nobody gave stays as written."""

    def __init__(self, fields: Mapping[str, object], **more: object) -> None:
        super().__init__(fields, **more)

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One diagnosed problem. Only `kind`, `severity` and `title` are always set."""

    kind: Kind  #: one of the kinds in `KINDS` (listed in docs/reference/findings.md)
    severity: Severity  #: "error", "warning" or "info"
    title: Text  #: what is wrong, in one line (without the "ddpviz" prefix and the world size)
    ranks: Ranks = ()  #: the ranks at fault (the odd ones out), sorted
    param: ParamIndexOrNone = -1  #: parameter (or buffer) index in DDP's list; -1 if none
    name: Name = ""  #: its dotted name
    field: Name = ""  #: what differs, e.g. "shape", "dtype", "order", "grad_order"
    bucket: BucketIndexOrNone = -1  #: bucket index (reduction order); -1 when not about one
    step: Step = -1  #: DDP iteration; -1 for construction or unknown
    values: RankValues = ()  #: (value, ranks), most common first
    detail: Lines = ()  #: further lines, printed after the values
    fix: Text = ""  #: the likely fix, one or two sentences
    world_size: WorldSizeOrUnknown = 0  #: 0 when unknown
    #: For a replicas_diverged finding, per differing tensor shown in `detail`: (dotted name,
    #: ((what a group of ranks holds, its ranks as inclusive (lo, hi) spans), ...)), those
    #: lines as data
    tensors: TensorGroups = ()

    def text(self, *, header: bool = True) -> str:
        """The house-style message: title line, one line per value with its ranks, detail,
        fix (what `str()` gives).

        Args:
            header: True (default): the full message, starting with `headline()` and ending
                with `fix`. False, for findings grouped under one header: the first line is
                "SEVERITY: TITLE:" (no "ddpviz: " prefix, no world size) and `fix` is left
                out.

        Returns:
            The message, lines joined by newlines (no trailing newline).
        """
        lines = [self.headline() if header else f"{self.severity}: {self.title}:"]
        lines += value_lines(self.values)
        lines += [f"  {d}" for d in self.detail]
        if self.fix and header:
            lines.append(self.fix)
        return "\n".join(lines)

    def headline(self) -> str:
        """The message's first line: "ddpviz: TITLE (world_size=N):", without the world size
        when unknown, and ending in "." instead of ":" when no lines follow it.

        Returns:
            The line, without a newline.
        """
        size = f" (world_size={self.world_size})" if self.world_size else ""
        colon = ":" if self.values or self.detail else "."
        return f"ddpviz: {self.title}{size}{colon}"

    def __str__(self) -> str:
        return self.text()

    def matches(self, **fields: object) -> bool:
        """Whether every given field has the given value (tests and filters).

        Args:
            fields: field names and the values they must equal, e.g.
                `kind="shape_mismatch", ranks=(3,)`.

        Returns:
            True when all of them are equal (also when no field is given).
        """
        return all(getattr(self, k) == v for k, v in fields.items())


class Findings(list[Finding]):
    """A list of findings that prints (and shows in IPython) as one house-style message."""

    def __str__(self) -> str:
        return format_findings(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


class DiagnosisWarning(UserWarning):
    """A finding raised as a Python warning (e.g. initial values); `finding` is the finding
    itself when the probe raised it with `warning_of`."""

    finding: Finding | None = None


def warning_of(finding: Finding) -> DiagnosisWarning:
    """The warning that says `finding` (its text), carrying the finding itself, so that
    `ddpviz record` can say one line for the job (See [Note: one line per finding per job])."""
    warning = DiagnosisWarning(finding.text())
    warning.finding = finding
    return warning


# Rank-local findings: each rank reports its own (its own rank in `ranks`, its call sites in
# `values`); the same one from several ranks reads as one finding naming all of them. (watch's
# unused-parameter finding: each rank names the parameters its own backward left out.)
# A mismatch of the job's own collectives (probes/collective_check.py, the rings).
COLLECTIVE_KINDS: tuple[Kind, ...] = ("collective_mismatch", "unmatched_collective")


def named_live(finding: Finding) -> bool:
    """Whether `finding` is a mismatch of the job's collectives named by the ranks' own
    comparison (live or from the rings: not the per-step counts diagnose reads from the steps'
    events)."""
    return finding.kind in COLLECTIVE_KINDS and finding.field != "collectives"


def said_live(findings: Iterable[Finding]) -> bool:
    """Whether `findings` hold a mismatch of the job's collectives that `named_live` counts."""
    return any(named_live(f) for f in findings)


RANK_LOCAL: tuple[Kind, ...] = ("buffer_reassigned", "unsynced_gradients", "unused_parameter")
# Findings that every waiting rank raises from its own side ("rank 1 did not reach step 3
# within 5s; rank 0 has waited since its forward", and rank 2's the same with "rank 2"): the
# same ranks waited for, at the same place and step, are one fact, and each lists every
# rank's state in its values. The first waiting rank's stands for the job (`waited_key`).
WAITED_FOR: tuple[Kind, ...] = ("rank_waiting", "rank_hang")


def waited_key(f: Finding) -> tuple[Any, ...] | None:
    """The identity of a wait named from each waiting rank's side (WAITED_FOR), or None."""
    if f.kind not in WAITED_FOR:
        return None
    return ("waited for", f.kind, f.severity, f.ranks, f.field, f.step)


def merge_findings(reported: Iterable[tuple[int, Finding]]) -> list[Finding]:
    """Findings reported by ranks, as (rank, finding) pairs in rank order, de-duplicated: the
    same finding from several ranks counts once, a wait named from each waiting rank's side
    (`WAITED_FOR`) once, by the first rank, and a rank-local finding (`RANK_LOCAL`) that
    several ranks reported with the same facts (its title but for the rank, its name, field,
    step and detail) is one finding naming all of them, with each rank's values. Findings
    whose facts differ stay apart: no rank's evidence is dropped."""
    out: list[Finding] = []
    merged: dict[tuple[Any, ...], int] = {}
    for rank, f in reported:
        if f in out:
            continue
        waited = waited_key(f)
        if waited is not None:
            if waited not in merged:
                merged[waited] = len(out)
                out.append(f)
            continue
        key = (f.kind, f.title.replace(f"rank {rank}", "rank ?"), f.name, f.field, f.step,
               f.detail)
        if f.kind in RANK_LOCAL and key in merged:
            i = merged[key]
            old = out[i]
            ranks = tuple(sorted({*old.ranks, *f.ranks}))
            out[i] = msgspec.structs.replace(
                old, ranks=ranks, values=_merge_values(old.values, f.values),
                title=old.title.replace(format_ranks(old.ranks), format_ranks(ranks), 1))
            continue
        merged[key] = len(out)
        out.append(f)
    return out


def _merge_values(a: Sequence[tuple[str, tuple[int, ...]]],
                  b: Sequence[tuple[str, tuple[int, ...]]]
                  ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    per: dict[int, str] = {}
    for value, ranks in (*a, *b):
        for r in ranks:
            per[r] = value
    return group_ranks(per)


def format_ranges(numbers: Iterable[int], *, run: int = 3, most: int | None = None,
                  sep: str = ", ") -> str:
    """Numbers (ranks, steps) in ascending order as ranges: [7, 0, 1, 2, 3, 5, 8] ->
    '0-3, 5, 7, 8'. A run of `run` or more consecutive numbers reads 'a-b'; past `most` items
    '...' follows; '' for none. Every range label in ddpviz is spelled here (its browser twin
    is formatRanges in extension/src/rankGroups.ts), each kind of label with its own `run`."""
    streaks: list[tuple[int, int]] = []  # (first, last) of each run of consecutive numbers
    for n in sorted(numbers):
        if streaks and n == streaks[-1][1] + 1:
            streaks[-1] = (streaks[-1][0], n)
        else:
            streaks.append((n, n))
    parts = _span_labels(streaks, run)
    if most is not None and len(parts) > most:
        return sep.join(parts[:most]) + sep + "..."
    return sep.join(parts)


def format_ranks(ranks: Sequence[int]) -> str:
    """(3,) -> 'rank 3'; (0, 1, 2) -> 'ranks 0,1,2'; runs of 4 or more as 'a-b'."""
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranges(ranks, run=4, sep=",")


def group_ranks(values: Mapping[int, str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """{rank: value} -> ((value, ranks), ...), most common value first, ties by lowest rank."""
    by_value: dict[str, list[int]] = {}
    for r in sorted(values):
        by_value.setdefault(values[r], []).append(r)
    groups = [(v, tuple(rs)) for v, rs in by_value.items()]
    return tuple(sorted(groups, key=lambda g: (-len(g[1]), g[1][0])))


def odd_ranks(values: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """The ranks outside the most common group (all ranks when every group is one rank and
    there are only two: then nobody is "the odd one", so the later groups are)."""
    return tuple(sorted(r for _, rs in values[1:] for r in rs))


def value_lines(values: Sequence[tuple[str, tuple[int, ...]]]) -> list[str]:
    """'  ranks 0,1: value' lines, labels padded to one width."""
    if not values:
        return []
    width = max(len(format_ranks(rs)) for _, rs in values) + 1
    return [f"  {(format_ranks(rs) + ':').ljust(width)} {v}" for v, rs in values]


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable otherwise."""
    return sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))


def format_findings(findings: Sequence[Finding], world_size: int | None = None) -> str:
    """All findings in one message: a single one as itself; several as a summary line, one
    block each (errors first), then each distinct fix once."""
    if not findings:
        suffix = f" (world_size={world_size})" if world_size else ""
        return f"ddpviz: no problems found{suffix}."
    ordered = sort_findings(findings)
    if len(ordered) == 1:
        return ordered[0].text()
    size = world_size or max(f.world_size for f in ordered)
    counts = {s: sum(f.severity == s for f in ordered) for s in _SEVERITY_ORDER}
    summary = ", ".join(f"{n} {s}{'s' if n > 1 else ''}" for s, n in counts.items() if n)
    lines = [f"ddpviz: {len(ordered)} findings ({summary})"
             f"{f' (world_size={size})' if size else ''}:"]
    for f in ordered:
        lines.append(f.text(header=False))
    fixes: list[str] = []
    for f in ordered:
        if f.fix and f.fix not in fixes:
            fixes.append(f.fix)
    lines += fixes
    return "\n".join(lines)


Spans = tuple[tuple[int, int], ...]  # ranks as inclusive (lo, hi) runs, sorted
TensorRow = tuple[str, list[tuple[Spans, str]]]  # (tensor, [(its ranks, what they hold)])


def rank_spans(ranks: Iterable[int]) -> Spans:
    """Ranks as inclusive (lo, hi) runs of consecutive ranks: (0, 1, 2, 5) -> ((0, 2), (5, 5))."""
    return merge_spans((r, r) for r in ranks)


def merge_spans(spans: Iterable[tuple[int, int]]) -> Spans:
    """Inclusive (lo, hi) spans sorted, overlapping or adjacent ones joined: ((5, 6), (0, 1),
    (2, 2)) -> ((0, 2), (5, 6))."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def format_spans(spans: Iterable[tuple[int, int]], *, run: int = 3, sep: str = ", ") -> str:
    """`format_ranges` of the ranks that inclusive (lo, hi) spans cover, without listing them
    one by one (a column of 131,072 ranks costs one span): ((0, 3), (5, 5)) -> '0-3, 5'."""
    return sep.join(_span_labels(merge_spans(spans), run))


def _span_labels(spans: Iterable[tuple[int, int]], run: int) -> list[str]:
    """Each inclusive (lo, hi) span as 'lo-hi' when it holds `run` numbers or more, else as its
    numbers one by one (fewer than `run`: a short list)."""
    parts: list[str] = []
    for lo, hi in spans:
        parts += [f"{lo}-{hi}"] if hi - lo + 1 >= run else [str(x) for x in range(lo, hi + 1)]
    return parts


_RANK_DIGITS = len(str(MAX_WORLD_SIZE))  # more digits: past the rank bound


def _rank_number(text: str) -> int | None:
    """A rank as format_ranks writes it; MAX_WORLD_SIZE for any number past the rank bound
    (without converting a long digit string); None when it is not a number."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    text = text.lstrip("0") or "0"
    return MAX_WORLD_SIZE if len(text) > _RANK_DIGITS else min(int(text), MAX_WORLD_SIZE)


def tensor_groups(detail_line: str) -> TensorRow | None:
    """A per-tensor detail line of a replicas_diverged finding (as probes/replica_verdict.py's
    `judge` writes it: "name: ranks 0,2: norm ..., ...; rank 1: norm ...") read back as
    (name, [(rank spans, what they hold)]); None for the other lines. For traces written
    before findings carried `Finding.tensors`: the text is untrusted, so a range "a-b" is kept
    as one span, cut at the rank bound (MAX_WORLD_SIZE), never listed rank by rank.

    Args:
        detail_line: one line of `Finding.detail`.

    Returns:
        (tensor name, [(inclusive (lo, hi) rank spans, what those ranks hold)]), or None.
    """
    name, sep, rest = detail_line.partition(": ")
    if not sep or " " in name or not rest.startswith("rank"):
        return None
    top = MAX_WORLD_SIZE - 1
    groups: list[tuple[Spans, str]] = []
    for part in rest.split("; "):
        label, sep, value = part.partition(": ")
        if not sep or not label.startswith("rank"):
            continue
        spans: list[tuple[int, int]] = []
        for item in label.split(" ", 1)[-1].split(","):
            lo_text, dash, hi_text = item.partition("-")
            lo = _rank_number(lo_text)
            hi = _rank_number(hi_text) if dash else lo
            if lo is None or hi is None:
                return None
            if lo <= min(hi, top):  # ranks past the bound, and "b-a", name no rank
                spans.append((lo, min(hi, top)))
        groups.append((merge_spans(spans), value))
    return (name, groups) if groups else None


def replica_groups(finding: Finding) -> list[TensorRow]:
    """The per-tensor groups of a replicas_diverged finding: its `tensors` when it carries
    them, else read from its detail lines (`tensor_groups`: traces written before `tensors`).

    Args:
        finding: any finding (other kinds have no per-tensor groups).

    Returns:
        [(tensor name, [(inclusive (lo, hi) rank spans, what those ranks hold)])], in the
        finding's order; empty when it names none.
    """
    if finding.tensors:
        return [(name, [(merge_spans(spans), held) for held, spans in groups])
                for name, groups in finding.tensors if groups]
    rows = (tensor_groups(line) for line in finding.detail)
    return [row for row in rows if row is not None]
