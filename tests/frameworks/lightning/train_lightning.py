"""A Lightning script at test size, configured NeMo-style by Hydra-like `key=value` overrides (OmegaConf dot-list),
so the +sweep=lightning preset's overrides (data.micro_batch_size, trainer.accumulate_grad_batches, trainer.*)
apply unchanged. The module has a validation loader, as most do. Lightning picks its RichProgressBar because
rich is installed (a dependency of sweep).

Independent timing: a Lightning Callback's on_train_batch_end, which Lightning calls after every micro-batch;
it marks a step only when trainer.global_step (the optimizer steps taken) has moved, i.e. after the last
micro-batch of an accumulation, once the optimizer has stepped (tests/frameworks/step_times.py).
"""

import os
import sys

import lightning as L
import torch
from omegaconf import OmegaConf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile  # noqa: E402

DEFAULTS = {
    "data": {"micro_batch_size": 8, "samples": 4096, "features": 256},
    "model": {"hidden": 512, "layers": 3},
    "trainer": {"devices": 1, "accelerator": "cpu", "max_steps": 30, "accumulate_grad_batches": 1, "logger": False,
                "enable_checkpointing": False},
}


class Regression(L.LightningModule):
    def __init__(self, features: int, hidden: int, layers: int) -> None:
        super().__init__()
        blocks = [torch.nn.Linear(features, hidden), torch.nn.ReLU()]
        for _ in range(layers - 1):
            blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepTimesCallback(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.times = StepTimesFile(trainer.global_rank)
        self.steps_seen = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.steps_seen:  # the optimizer stepped in this batch
            self.steps_seen = trainer.global_step
            self.times.mark(trainer.global_step)


def loader(samples: int, features: int, batch: int, shuffle: bool) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(samples)
    x = torch.randn(samples, features, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=shuffle)


def main() -> None:
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_dotlist(sys.argv[1:]))
    model = Regression(cfg.data.features, cfg.model.hidden, cfg.model.layers)
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer), callbacks=[StepTimesCallback()])
    trainer.fit(model, loader(cfg.data.samples, cfg.data.features, cfg.data.micro_batch_size, True),
                loader(256, cfg.data.features, cfg.data.micro_batch_size, False))


if __name__ == "__main__":
    main()
