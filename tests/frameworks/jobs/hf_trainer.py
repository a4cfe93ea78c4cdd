"""A Hugging Face `Trainer` job (GPT-2 from a tiny config, synthetic tokens), launched by
torchrun (no ddpviz import). Trainer builds torch's DDP itself (through accelerate).

FW_UNUSED=1 plants a defect: a submodule the forward never uses, with
ddp_find_unused_parameters=False (Trainer's default for a PreTrainedModel). FW_ACCUMULATE=K:
gradient_accumulation_steps=K (accelerate runs the first K-1 micro-batches under no_sync()).
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from tests.frameworks.jobs import report

SEQ = 16


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.clock = report.StepClock()
        self.trainer: Trainer | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.start(self.trainer.model_wrapped if self.trainer is not None else None)

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.stop()


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=SEQ,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    if os.environ.get("FW_UNUSED") == "1":
        model.unused_proj = nn.Linear(32, 32)  # never called by GPT-2's forward
    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=2, max_steps=report.steps(),
            learning_rate=1e-2, use_cpu=True, ddp_backend="gloo", ddp_timeout=60,
            ddp_find_unused_parameters=False, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=0, data_seed=0,
            dataloader_num_workers=0,
            gradient_accumulation_steps=int(os.environ.get("FW_ACCUMULATE", "1")))
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[clock])
        clock.trainer = trainer
        trainer.train()
    ddp = trainer.model_wrapped
    assert isinstance(ddp, nn.parallel.DistributedDataParallel), type(ddp)
    report.write(args.process_index, model=model, ddp_module=ddp.module,
                 step_s=clock.clock.times, step_cpu_s=clock.clock.cpu,
                 watched=clock.clock.watched)


if __name__ == "__main__":
    main()
