"""The same model and flags as ../train.py, trained by Lightning: docs/tutorial.md sweeps it the same way."""

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=256)  # samples per micro-batch, on each device
parser.add_argument("--accum", type=int, default=1)  # micro-batches per optimizer step
parser.add_argument("--steps", type=int, default=50)  # optimizer steps
args = parser.parse_args()


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.manual_seed(0)
n = args.batch_size * args.accum * args.steps
data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
trainer = L.Trainer(max_steps=args.steps, accumulate_grad_batches=args.accum, devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), DataLoader(data, batch_size=args.batch_size))
print(f"trained {trainer.global_step} steps of {args.batch_size * args.accum} samples")
