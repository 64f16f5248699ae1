"""A PyTorch training script that breaks, on purpose, an assumption a figure rests on (issue 43).

It knows nothing of sweep: a real model, real backward passes, and step times set by a sleep so a test
knows the truth: each micro-batch of `--batch` samples takes the time --rates gives its (accum, split)
pair, as samples/s of the global batch. What it breaks, by --attack:

    none          a steady trainer stepping a torch.optim optimizer once per --accum micro-batches
    stall         every third optimizer step takes 4.2x as long (a starved data loader, a periodic flush): --rates
                  gives its typical step, so it trains at 3 / (2 + 4.2) of that over wall time (issue 50)
    cold_first    the sweep's first trial (no marker file yet in --marker-dir) runs its first 6 steps 3x slow,
                  as a cold page cache or compile cache would; later trials are warm
    caught_oom    a real allocation failure (an address-space cap) inside `joint` at step 2, which it
                  catches and carries on at half the batch, as HF's auto_find_batch_size does; exit 0
    no_accum      ignores --accum: one micro-batch per optimizer step, so each step trains 1/accum of
                  the global batch and is accum times too short for the pair asked
    own_optimizer its own parameter update (no torch.optim) once every --accum micro-batches, as Keras 3's
                  gradient_accumulation_steps does, and a Keras-like bar per micro-batch:
                  `1/1 - 0s 12ms/step` for each micro-batch, not each optimizer step
    own_update_no_accum
                  its own parameter update (no torch.optim) after every micro-batch, whatever --accum says:
                  no optimizer step for the probe to count, only the parameters' values changing
    prep_subprocess  (issue 50) first runs a preparation subprocess that steps a torch.optim optimizer 40 times,
                  as fast as it can, and exits; then trains as `none` does
    lr_find       (issue 50) first a learning-rate range test in the same process, as fastai's lr_find and
                  Lightning's Tuner do: 40 steps with the rate rising 1.3x a step, 4x faster than training (no
                  data to wait for), then the model's weights restored and a fresh optimizer made; then as `none`
    two_losses_no_accum  (issue 50) a GAN's or an auxiliary loss's two backward passes (retain_graph) a
                  micro-batch, and ignores --accum: one micro-batch a step, so 2 passes a step at any accum
    mean_loss     (issue 50) accumulates by averaging: the losses of --accum micro-batches are summed and
                  divided, and backward runs once a step: 1 backward pass a step at any accum, accum forwards

--attacks "1:1=caught_oom,2:1=no_accum" picks one per pair instead (the rest: --attack). --oom-pairs "1:1,..."
makes those pairs fail at once with a CUDA out-of-memory traceback, before torch is even imported.
It prints `iter N: ... time X ms` per optimizer step (nanoGPT's form) except under own_optimizer.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

HUGE = 1 << 36  # far over any cap here


def pairs(spec: str) -> dict[tuple[int, int], str]:
    """{(accum, split): value} from "a:s=value,..." (or "a:s,..." for a set: value "")."""
    out = {}
    for item in filter(None, spec.split(",")):
        pair, _, value = item.partition("=")
        a, s = pair.split(":")
        out[(int(a), int(s))] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)  # per-device batch
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rates", default="")
    p.add_argument("--attack", default="none", choices=ATTACKS)
    p.add_argument("--attacks", default="")
    p.add_argument("--oom-pairs", default="")
    p.add_argument("--marker-dir", default=".")
    p.add_argument("--prep-only", action="store_true", help="the preparation subprocess of prep_subprocess")
    args = p.parse_args()
    if args.prep_only:
        prepare()
        return
    pair = (args.accum, args.split)
    if pair in pairs(args.oom_pairs):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
        sys.exit(1)
    args.attack = pairs(args.attacks).get(pair, args.attack)
    if args.attack == "prep_subprocess":
        import subprocess

        subprocess.run([sys.executable, os.path.abspath(__file__), "--prep-only", "--batch=1", "--accum=1", "--global-batch=1"], check=True)
    train(args, float(pairs(args.rates).get(pair) or 1000.0))


def prepare() -> None:
    """A preparation step before training (a calibration, a data statistics pass) that steps an optimizer of its own."""
    import torch
    from torch import nn

    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    for _ in range(PREP_STEPS):
        net(torch.randn(2, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


ATTACKS = ["none", "cold_first", "caught_oom", "no_accum", "own_optimizer", "own_update_no_accum", "stall"]
ATTACKS += ["prep_subprocess", "lr_find", "two_losses_no_accum", "mean_loss"]  # issue 50's
PREP_STEPS = 40
RANGE_TEST_STEPS = 40


def train(args: argparse.Namespace, rate: float) -> None:
    import torch
    from torch import nn

    class Joint(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.out = nn.Linear(width, 4)
            self.explode = False

        def forward(self, x):
            if self.explode:
                torch.empty(HUGE, dtype=torch.uint8)  # the allocator fails inside `joint`
            return self.out(x)

    class Net(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.encoder = nn.Linear(width, width)
            self.joint = Joint(width)

        def forward(self, x):
            return self.joint(torch.relu(self.encoder(x)))

    torch.manual_seed(0)
    net = Net(16)
    own_update = args.attack in ("own_optimizer", "own_update_no_accum")
    optimizer = None if own_update else torch.optim.SGD(net.parameters(), lr=1e-3)
    step_s = args.global_batch / rate
    micro_batches = 1 if args.attack == "no_accum" else args.accum
    cold = 0
    if args.attack == "cold_first":
        marker = os.path.join(args.marker_dir, "warmed")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            cold = 6  # this is the sweep's first trial
        except FileExistsError:
            pass
    if args.attack == "caught_oom":
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 2**20, hard))
    batch = args.batch
    if args.attack == "lr_find":
        saved = {k: v.clone() for k, v in net.state_dict().items()}
        lr = 1e-7
        for _ in range(RANGE_TEST_STEPS):
            for group in optimizer.param_groups:
                group["lr"] = lr
            started = time.perf_counter()
            net(torch.randn(batch, 16)).pow(2).mean().backward()
            time.sleep(max(0.0, step_s / 4 - (time.perf_counter() - started)))
            optimizer.step()
            optimizer.zero_grad()
            lr *= 1.3
        net.load_state_dict(saved)
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)  # the trainer's own, made afresh for the fit
    for it in range(args.steps):
        started = time.perf_counter()
        slow = 3.0 if it < cold else 4.2 if args.attack == "stall" and it % 3 == 2 else 1.0
        total = None  # mean_loss: the sum of the step's micro-batch losses so far
        for micro in range(micro_batches):
            micro_started = time.perf_counter()
            net.joint.explode = args.attack == "caught_oom" and it == 2 and batch == args.batch
            if args.attack == "two_losses_no_accum":
                out = net(torch.randn(batch, 16))
                out.pow(2).mean().backward(retain_graph=True)  # a generator's and a discriminator's, or a main and an auxiliary loss
                out.abs().mean().backward()
                time.sleep(max(0.0, step_s / args.accum - (time.perf_counter() - micro_started)))
                break
            if args.attack == "mean_loss":
                loss = net(torch.randn(batch, 16)).pow(2).mean() / args.accum
                total = loss if total is None else total + loss
                time.sleep(max(0.0, step_s / args.accum - (time.perf_counter() - micro_started)))
                if micro == micro_batches - 1:
                    total.backward()  # one backward pass a step, over the average of the micro-batches' losses
                continue
            try:
                loss = net(torch.randn(batch, 16)).pow(2).mean()
            except RuntimeError as exc:
                if "can't allocate memory" not in str(exc):
                    raise
                print(f"out of memory at batch {batch}: retrying at {batch // 2}", flush=True)
                batch //= 2  # what automatic batch sizing does: the pair asked for no longer trains
                net.joint.explode = False
                loss = net(torch.randn(batch, 16)).pow(2).mean()
            loss.backward()
            time.sleep(max(0.0, slow * step_s / args.accum - (time.perf_counter() - micro_started)))
            if own_update and (args.attack == "own_update_no_accum" or micro == micro_batches - 1):
                with torch.no_grad():
                    for param in net.parameters():
                        param -= 1e-3 * param.grad
                        param.grad = None
            if own_update:
                ms = (time.perf_counter() - micro_started) * 1000
                print(f"1/1 - 0s {ms:.0f}ms/step - loss: 1.0000", flush=True)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
            print(f"iter {it}: loss 1.0000, time {(time.perf_counter() - started) * 1000:.2f}ms, mfu 30.00%", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
