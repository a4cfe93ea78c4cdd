"""A Lightning job (a small MLP in a LightningModule, synthetic data) on 2 CPU processes (no
ddpviz import). Lightning builds torch's DDP in every rank and launches the ranks itself.

FW_STRATEGY: "ddp" (Lightning re-runs this script per rank), "ddp_spawn"
(torch.multiprocessing.spawn), "ddp_notebook" (fork, as in a notebook), "static"
(DDPStrategy(static_graph=True)). FW_MANUAL=1: manual optimization. FW_TIMEOUT: the process
group's timeout in seconds (DDPStrategy(timeout=)). FW_STUCK=K plants a defect: rank 1's
dataset sleeps FW_STUCK_S seconds when asked for step K's batch. FW_BUFFERS=1 adds
a BatchNorm1d (buffers, which DDP broadcasts from rank 0 at every forward). FW_ACCUMULATE=K:
accumulate_grad_batches=K (Lightning runs the first K-1 micro-batches under no_sync()).
FW_HANG=K plants a hang in the training step: rank 1's training_step sleeps FW_HANG_S seconds
before its forward at step K (it first prints "rank 1 hangs at <time.time()>"). Either planted
sleep ends early once rank 0 has exited (under strategy "ddp" rank 0 launched rank 1: rank 1's
parent): the job has ended then, and nothing is left for rank 1 to wait out.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from tests.frameworks.jobs import report

BATCH = 4


def planted_sleep(seconds: float) -> Iterator[float]:
    """The ticks of a planted sleep of `seconds` (the caller sleeps each, so the caller's line
    stays the innermost frame while it sleeps); they end early once this process's parent
    (rank 0 for rank 1 under strategy "ddp") has exited: rank 0's error or the group's timeout
    has ended the job by then, and sleeping out the rest only kept the test waiting."""
    parent = os.getppid()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and os.getppid() == parent:
        yield min(left, 0.1)


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(256, 8, generator=g)
        self.y = torch.randn(256, 2, generator=g)
        self.calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        stuck = os.environ.get("FW_STUCK")
        if stuck is not None and dist.is_initialized() and dist.get_rank() == 1 and \
                self.calls == int(stuck) * BATCH:
            for tick in planted_sleep(float(os.environ.get("FW_STUCK_S", "60"))):
                time.sleep(tick)
        self.calls += 1
        return self.x[i], self.y[i]


class Model(L.LightningModule):
    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32))
        if os.environ.get("FW_BUFFERS") == "1":  # buffers: DDP broadcasts them every forward
            self.encoder.append(nn.BatchNorm1d(32))
        self.head = nn.Linear(32, 2)
        self.automatic_optimization = not manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _i: int) -> torch.Tensor:
        x, y = batch
        hang = os.environ.get("FW_HANG")
        if hang is not None and self.global_rank == 1 and self.global_step == int(hang):
            print(f"rank 1 hangs at {time.time():.3f}", flush=True)
            for tick in planted_sleep(float(os.environ.get("FW_HANG_S", "60"))):
                time.sleep(tick)  # <hang>: rank 1's innermost frame while it hangs
        loss = (self(x) - y).square().mean()
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(Data(), batch_size=BATCH)


class Report(L.Callback):
    """Writes the rank's report at the end of training, inside the rank (ddp_spawn's ranks
    are children of this process)."""

    def __init__(self) -> None:
        self.clock = report.StepClock()

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        self.clock.start(trainer.strategy.model)

    def on_train_batch_end(self, *args: object) -> None:
        self.clock.stop()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ddp = trainer.strategy.model
        assert isinstance(ddp, nn.parallel.DistributedDataParallel), type(ddp)
        report.write(trainer.global_rank, model=pl_module, ddp_module=ddp.module,
                     step_s=self.clock.times, step_cpu_s=self.clock.cpu,
                     watched=self.clock.watched)


def main() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    name = os.environ.get("FW_STRATEGY", "ddp")
    timeout = datetime.timedelta(seconds=float(os.environ.get("FW_TIMEOUT", "60")))
    strategy: str | DDPStrategy
    if name == "static":
        strategy = DDPStrategy(static_graph=True, timeout=timeout)
    elif name == "ddp":
        strategy = DDPStrategy(timeout=timeout)
    else:
        strategy = name  # "ddp_spawn", "ddp_notebook": Lightning's registered names
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy,
                        max_steps=report.steps(), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accumulate_grad_batches=int(os.environ.get("FW_ACCUMULATE", "1")),
                        callbacks=[Report()])
    trainer.fit(Model(manual=os.environ.get("FW_MANUAL") == "1"))


if __name__ == "__main__":
    main()
