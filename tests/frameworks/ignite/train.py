"""A pytorch-ignite training script at test size, as ignite's docs write one: `create_supervised_trainer` with its
own `gradient_accumulation_steps`, run for a number of iterations (micro-batches); the batch and the accumulation
come from the command line (`--batch-size={per_device_batch} --accum={accum}` in the sweep's argv).

Independent timing: an ignite event handler on `Events.ITERATION_COMPLETED(every=accum)`, the iterations whose
update stepped the optimizer (ignite steps it when `iteration % gradient_accumulation_steps == 0`);
tests/frameworks/step_times.py.
"""

import os
import sys

import torch
from ignite.engine import Events, create_supervised_trainer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile, batch_arguments  # noqa: E402


def main() -> None:
    parser = batch_arguments()
    args = parser.parse_args()

    model = torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
                                torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = create_supervised_trainer(model, optimizer, torch.nn.MSELoss(), device="cpu", gradient_accumulation_steps=args.accum)

    x = torch.randn(args.batch_size * args.accum * args.steps, args.features, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=args.batch_size, shuffle=True)

    times = StepTimesFile(rank=0)

    @trainer.on(Events.ITERATION_COMPLETED(every=args.accum))
    def mark_step(engine):
        times.mark(engine.state.iteration // args.accum)

    trainer.run(loader, max_epochs=1)


if __name__ == "__main__":
    main()
