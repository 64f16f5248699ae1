"""A stand-in for a user's training script: prints throughput in a chosen log format, or
fails the way real training fails. Its behaviour is picked per candidate from --behaviours,
e.g. --accum=4 --behaviours=1:oom_joint,4:myrtle_new (anything unlisted: myrtle_new)."""

import argparse
import json
import os
import sys
import time


def encode(batch):  # the frame names match the built-in model's, which the phase patterns know
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity) batch={batch}")


def joint_and_loss(batch):
    raise RuntimeError("CUDA out of memory. Tried to allocate 9.77 GiB (GPU 0; 79.15 GiB total capacity)")


def optimizer_step(batch):
    raise RuntimeError("CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 79.15 GiB total capacity)")


def train(args, behaviour):
    gbs = args.global_batch_size
    for epoch in (1, 2, 3):
        tput = 1000.0 * (1 + args.split / 10) / args.accum - (200 if epoch == 1 else 0)
        if behaviour == "myrtle_old":
            print(f"DLL 2023-05-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | avg train utts/s {tput:6.0f} | took {gbs / tput:.2f} s")
        elif behaviour == "myrtle_new":
            print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {tput:8.2f} | train_avg_took : {gbs / tput:6.2f}")
        elif behaviour == "dlll":
            rec = {"type": "LOG", "step": [epoch], "data": {"train_avg_throughput-audio-samples-per-sec": tput, "train_avg_took": gbs / tput}}
            print("DLLL " + json.dumps(rec))
        elif behaviour == "regex":
            for step in range(5):
                print(f"epoch {epoch} step {step} took {gbs / tput:.4f}s -> {tput:.1f} samples/s\r", end="")
            print()
        elif behaviour == "jsonl":
            print(json.dumps({"epoch": epoch, "metrics": {"samples_per_sec": tput}}))
        sys.stdout.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--behaviours", default="")
    args = p.parse_args()
    table = dict(item.split(":") for item in args.behaviours.split(",") if item)
    behaviour = table.get(str(args.accum), "myrtle_new")
    print(f"fake_train accum={args.accum} split={args.split} behaviour={behaviour} env={os.environ.get('SWEEP_FAKE_ENV', '')}", flush=True)
    if behaviour.startswith("oom_"):
        {"oom_encoder": encode, "oom_joint": joint_and_loss, "oom_optimizer": optimizer_step}[behaviour](args.accum)
    if behaviour == "slow":
        time.sleep(12)
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "crash":
        raise ValueError("bad shard: /data/train-0042.tar is truncated")
    if behaviour == "killed":
        os.kill(os.getpid(), 9)
    if behaviour == "silent":
        return 0
    train(args, "myrtle_new" if behaviour in ("slow", "then_hang") else behaviour)
    if behaviour == "then_hang":
        time.sleep(3600)  # a long training run: the sweep has what it needs and stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
