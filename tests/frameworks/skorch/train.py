"""A skorch training script at test size. skorch has no accumulation setting: its FAQ ("How do I apply gradient
accumulation?") subclasses the net, dividing the loss by `acc_steps` in `get_loss` and stepping the optimizer in
`train_step` on every `acc_steps`-th batch of the epoch; this script does exactly that. The batch and the
accumulation come from the command line (`--batch-size={per_device_batch} --accum={accum}` in the sweep's argv).

Independent timing: a skorch Callback's `on_batch_end`, on the training batches after which the net stepped
its optimizer (the same count the FAQ's `train_step` uses); tests/frameworks/step_times.py.
"""

import os
import sys

import numpy as np
import torch
from skorch import NeuralNetRegressor
from skorch.callbacks import Callback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile, batch_arguments  # noqa: E402


class GradAccNet(NeuralNetRegressor):
    """Net that accumulates gradients (skorch's FAQ)."""

    def __init__(self, *args, acc_steps=2, **kwargs):
        super().__init__(*args, **kwargs)
        self.acc_steps = acc_steps

    def get_loss(self, *args, **kwargs):
        loss = super().get_loss(*args, **kwargs)
        return loss / self.acc_steps  # normalize loss

    def train_step(self, batch, **fit_params):
        """Perform gradient accumulation: only optimize every nth batch."""
        # note that n_train_batches starts at 1 for each epoch
        n_train_batches = len(self.history[-1, "batches"])
        step = self.train_step_single(batch, **fit_params)

        if n_train_batches % self.acc_steps == 0:
            self.optimizer_.step()
            self.optimizer_.zero_grad()
        return step


class StepTimes(Callback):
    def initialize(self):
        self.times = StepTimesFile(rank=0)
        self.steps = 0
        return self

    def on_batch_end(self, net, batch=None, training=None, **kwargs):
        if training and len(net.history[-1, "batches"]) % net.acc_steps == 0:  # the optimizer stepped
            self.steps += 1
            self.times.mark(self.steps)


class MLP(torch.nn.Module):
    def __init__(self, features=256, hidden=1024):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))

    def forward(self, X):
        return self.net(X)


def main() -> None:
    parser = batch_arguments()
    args = parser.parse_args()

    X = np.random.default_rng(0).standard_normal((args.batch_size * args.accum * args.steps, args.features), dtype=np.float32)
    y = X.sum(axis=1, keepdims=True)
    net = GradAccNet(MLP, module__features=args.features, module__hidden=args.hidden, acc_steps=args.accum, batch_size=args.batch_size,
                     max_epochs=1, lr=1e-3, optimizer=torch.optim.AdamW, train_split=None, iterator_train__shuffle=True,
                     callbacks=[StepTimes()], device="cpu")
    net.fit(X, y)


if __name__ == "__main__":
    main()
