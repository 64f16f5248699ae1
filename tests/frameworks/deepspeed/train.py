"""A DeepSpeed training script at test size, as DeepSpeed's tutorials write one: `deepspeed train.py --deepspeed
--deepspeed_config ds_config.json`, the micro-batch and the accumulation read from that config (the +sweep=deepspeed
preset writes it per trial), the loop calling engine.backward / engine.step once per micro-batch.

Independent timing: DeepSpeed has no callbacks, so the loop marks the end of each engine.step() that DeepSpeed
says closes an accumulation (engine.is_gradient_accumulation_boundary() before the step), which is when its
optimizer steps (tests/frameworks/step_times.py).
"""

import argparse
import os
import sys

import deepspeed
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--features", type=int, default=256, help="input width")
    parser.add_argument("--hidden", type=int, default=512, help="hidden width")
    args = deepspeed.add_config_arguments(parser).parse_args()

    deepspeed.init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    times = StepTimesFile(engine.global_rank)
    micro = engine.train_micro_batch_size_per_gpu()
    dtype = next(engine.module.parameters()).dtype
    generator = torch.Generator().manual_seed(engine.global_rank)
    while engine.global_steps < args.steps:
        x = torch.randn(micro, args.features, generator=generator).to(engine.device, dtype)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if boundary:
            times.mark(engine.global_steps)
    if torch.distributed.is_initialized():  # as in train_hf.py: a group left up can abort the rank at exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
