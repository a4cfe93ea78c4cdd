"""What the reducer says when something fails: every error and warning text of
engine/reducer.py and engine/bucket_views.py, one function per situation (house style: starts
with `ddpviz:`, says what was expected and what was found, ends with the fix). Split out of
engine/reducer.py, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# --- the bucket map -----------------------------------------------------------------------


def empty_bucket(b: int) -> str:
    return (f"ddpviz: bucket {b} of the map is empty; every bucket must hold at least one "
            "parameter index.")


def bad_bucket_index(b: int, i: int, n: int) -> str:
    return (f"ddpviz: bucket {b} names parameter index {i}, which is "
            f"{'out of range' if not 0 <= i < n else 'already bucketed'} ({n} parameters); "
            "each index must appear exactly once.")


def unbucketed_parameters(missing: Sequence[int], first_name: str) -> str:
    return (f"ddpviz: the bucket map leaves out parameters {list(missing[:10])} "
            f"({first_name!r} first); every parameter needs a bucket.")


def sparse_bucket_shared(b: int) -> str:
    return (f"ddpviz: bucket {b} mixes a sparse-gradient parameter with others; a sparse "
            "gradient needs a bucket of its own.")


def bucket_mixes_dtypes(b: int, first: torch.Tensor, i: int, name: str, p: torch.Tensor) -> str:
    return (f"ddpviz: bucket {b} mixes {first.dtype} on {first.device} with parameter {i} "
            f"'{name}' ({p.dtype} on {p.device}); a bucket holds one dtype on one device.")


def rebuild_order_incomplete(named: int, params: int) -> str:
    return (f"ddpviz: internal error: the gradient-ready order names {named} parameters, "
            f"expected each of {params} once.")


# --- gradients ----------------------------------------------------------------------------


def graph_changed(index: int, name: str) -> str:
    return (f"ddpviz: parameter {index} '{name}' got a gradient in this iteration but not in "
            "iteration 0 (or more often than then); static_graph=True requires the same graph "
            "every iteration.")


def marked_twice(index: int, name: str) -> str:
    return (f"ddpviz: parameter {index} '{name}' was marked ready twice in one iteration: its "
            "gradient was accumulated by two backward passes (or two reentrant checkpoints) "
            "before DDP reduced it.")


def sparse_gradient_missing(index: int, name: str) -> str:
    return (f"ddpviz: parameter {index} '{name}' expects a sparse gradient, but it has none. "
            "Use the Embedding in every forward, or pass find_unused_parameters=True.")


def sparse_gradient_dense(index: int, name: str, layout: torch.layout) -> str:
    return (f"ddpviz: parameter {index} '{name}' was declared sparse (Embedding(sparse=True)) "
            f"but its gradient is {layout}. Do not mix sparse and dense uses of one embedding.")


def gradient_dtype(index: int, name: str, got: torch.dtype, expected: torch.dtype) -> str:
    return (f"ddpviz: parameter {index} '{name}' has a {got} gradient, expected {expected}. "
            "Keep .grad in the parameter's dtype.")


def gradient_strides(index: int, name: str, grad: Sequence[int], view: Sequence[int]) -> str:
    return (f"ddpviz: parameter {index} '{name}': gradient strides {tuple(grad)} differ from "
            f"its bucket view's {tuple(view)}; copies into the bucket will be slower. Keep "
            "parameters and gradients in one memory format.")


def not_bucket_view(index: int, name: str) -> str:
    return (f"ddpviz: parameter {index} '{name}' has a gradient that is not its DDP bucket view "
            "although gradient_as_bucket_view=True (was .grad replaced, or a second all-reduce "
            "hook registered?). Let DDP own .grad, or pass gradient_as_bucket_view=False.")


def unused_parameters(missing: Sequence[int], n_params: int, rank: int, lines: Sequence[str],
                      *, at_forward: bool, setting: str, torch_text: str, fix: str) -> str:
    when = ("in the previous backward, so its reduction never finished" if at_forward
            else "in this backward")
    return (f"ddpviz: {len(missing)} of {n_params} parameters got no gradient on rank {rank} "
            f"{when} ({setting}):\n" + "\n".join(lines) + "\n"
            "Their buckets could not be averaged across ranks.\n" + torch_text + f"\n{fix}")


# A parameter whose storage was replaced after DDP was built (See Reducer.unhooked).
UNHOOKED = ("its gradient was computed, but DDP's hook is no longer on it: the parameter was "
            "given new storage after DDP was built (param.set_(...), or param.data = ... of "
            "another dtype or device)")
UNHOOKED_FIX = ("Change parameters before wrapping the model: call set_(), .data = or "
                ".to(dtype/device) first, then DistributedDataParallel(model); or build the DDP "
                "again after changing them. find_unused_parameters=True does not help here.")


# --- settings -----------------------------------------------------------------------------


def comm_hook_twice(hook: object) -> str:
    return ("ddpviz: register_comm_hook can only be called once; a comm hook "
            f"({getattr(hook, '__qualname__', hook)}) is already registered. Combine the hooks "
            "into one function.")


STATIC_GRAPH_LATE = ("ddpviz: set_static_graph() should be called before training loop starts "
                     "and after DistributedDataParallel is constructed.")

ALL_PARAMETERS_USED = (
    "ddpviz: find_unused_parameters=True was specified, but this forward used every parameter; "
    "the flag costs a walk of the autograd graph every iteration. Turn it off unless later "
    "iterations leave parameters unused.")


# torch 2.15's manual backward finalization (torch's own words; the reducer raises them)
MANUAL_FINALIZATION_NOT_REQUIRED = (
    "finalize_backward() called but manual backward finalization is not required. Set "
    "require_manual_backward_finalization to true first.")
MANUAL_FINALIZATION_NOTHING = (
    "finalize_backward() called but no gradient reduction requires finalization. This can "
    "happen if no_sync() is active or finalize_backward() was already called for this "
    "backward pass.")
MANUAL_FINALIZATION_FORGOTTEN = (
    "Expected to have finalized the prior backward pass before starting a new one. Call "
    "finalize_backward() after backward() when require_manual_backward_finalization is true.")
MANUAL_FINALIZATION_MID_ITERATION = (
    "set_manual_finalization_required cannot be called after forward while a backward pass is "
    "expected or in progress. Call it before forward or after backward finalization.")


def manual_finalization_early(not_ready: int, total: int) -> str:
    return (f"ddpviz: finalize_backward() called before all gradient buckets are ready "
            f"({not_ready} of "
            f"{total} not ready yet). Call it after backward() returns, or from a backward hook "
            "once every DDP bucket is ready.")
