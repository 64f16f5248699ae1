"""A fastai training script at test size, as fastai's docs write one: a `Learner` over `DataLoaders`, fastai's own
accumulation, the `GradientAccumulation(n_acc)` callback (n_acc counts samples: it steps the optimizer once that
many have gone through, here `batch-size x accum`), and `learn.fit`. The batch and the accumulation come from the
command line (`--batch-size={per_device_batch} --accum={accum}` in the sweep's argv).

`--opt=default` trains with the Learner's default `opt_func`, fastai's own `Adam` (a `fastai.optimizer.Optimizer`,
not a `torch.optim.Optimizer`: the probe times it by its backward passes); `--opt=adamw` with
`partial(OptimWrapper, opt=torch.optim.AdamW)`, fastai's documented way to train with a PyTorch optimizer (the
probe sees its steps).

Independent timing: a fastai `Callback`'s `after_step`, which fastai runs only after a real optimizer step
(GradientAccumulation cancels the others before the step); tests/frameworks/step_times.py.
"""

import os
import sys
from functools import partial

import torch
from fastai.callback.core import Callback
from fastai.callback.training import GradientAccumulation
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from fastai.optimizer import OptimWrapper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile, batch_arguments  # noqa: E402


class StepTimes(Callback):
    order = GradientAccumulation.order + 1

    def before_fit(self):
        self.times, self.steps = StepTimesFile(rank=0), 0

    def after_step(self):
        self.steps += 1
        self.times.mark(self.steps)


def main() -> None:
    parser = batch_arguments()
    parser.add_argument("--opt", choices=("default", "adamw"), default="default", help="fastai's own Adam, or torch.optim.AdamW")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size * args.accum * args.steps, args.features, generator=generator)
    valid = torch.randn(args.batch_size, args.features, generator=generator)
    dls = DataLoaders.from_dsets(list(zip(x, x.sum(dim=1, keepdim=True))), list(zip(valid, valid.sum(dim=1, keepdim=True))),
                                 bs=args.batch_size, device="cpu")
    model = torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
                                torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
    extra = {} if args.opt == "default" else {"opt_func": partial(OptimWrapper, opt=torch.optim.AdamW)}
    learn = Learner(dls, model, loss_func=torch.nn.MSELoss(), cbs=[GradientAccumulation(n_acc=args.batch_size * args.accum), StepTimes()],
                    **extra)
    learn.fit(1, lr=1e-3)


if __name__ == "__main__":
    main()
