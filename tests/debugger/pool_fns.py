"""What the %%ddp debugger tests' cells call on their ranks (kept light: the ranks import this).

`build(kind)` makes the small model of rank_fns under ddpviz's DDP ("twin"), torch's DDP under
watch(guard=True) ("guard") or torch's DDP alone ("torch", the reference), and records, like
rank_fns.train, the local gradients of step STEP (gradient hooks, before any all-reduce) and
the averaged ones after its backward; the training loop itself is in the test's cell.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.debugger.rank_fns import STEP, digest, sequential_ddp


def build(kind: str) -> SimpleNamespace:
    import torch
    import torch.distributed as dist


    rank = dist.get_rank()
    model, ddp = sequential_ddp(kind)
    st = SimpleNamespace(model=model, ddp=ddp, step=0, local={}, averaged={},
                         opt=torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9),
                         gen=torch.Generator().manual_seed(100 + rank))

    def hook(name: str) -> Any:
        def on_grad(g: Any) -> Any:
            if st.step == STEP:
                st.local[name] = digest(g)
            return g
        return on_grad

    for n, p in model.named_parameters():
        p.register_hook(hook(n))
    return st


def train_step(st: SimpleNamespace, s: int) -> float:
    """One step of the training cell; returns the loss."""
    import torch

    st.step = s
    x = torch.randn(16, 8, generator=st.gen)
    y = torch.randn(16, 4, generator=st.gen)
    st.opt.zero_grad(set_to_none=True)
    loss = ((st.ddp(x) - y) ** 2).mean()
    loss.backward()
    if s == STEP:
        st.averaged = {n: digest(p.grad) for n, p in st.model.named_parameters()}
    st.opt.step()
    return float(loss.item())


def final(st: SimpleNamespace) -> dict[str, str]:
    """The parameters' digests."""
    return {n: digest(p) for n, p in st.model.named_parameters()}
