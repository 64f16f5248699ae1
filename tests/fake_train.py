"""A stand-in for a user's training script: prints throughput in a chosen log format, or fails
the way real training fails. Used by the command-workload tests and the fault-injection suite.

Its behaviour is picked per accum from --behaviours (e.g. --accum=4 --behaviours=1:oom_joint,4:crash;
anything unlisted: ok). Every start is appended to $FAULT_LEDGER ("accum split pid" per line, one
O_APPEND write), so a test can tell a trial that ran twice. $FAULT_DELAY_S is how long every
behaviour waits first, $FAULT_DURATION_S how long a throughput-printing run trains (both default 0).

    ok, myrtle_new  Myrtle v1.12 epoch lines for 3 epochs: 1000*(1+split/10)/accum samples/s
                    from epoch 2 on (epoch 1 is 200 lower: warm-up), exit 0
    myrtle_old, dlll, regex, jsonl   the same figures in another log format
    slow            wait 12 s (FAKE_SLOW_S), then as ok
    then_hang       as ok, then never ends (a long run the sweep stops once it has measured)
    oom_encoder, oom_joint (or oom), oom_optimizer   a CUDA OOM traceback in that phase's frame
    crash           a Python traceback (ValueError), exit 1
    segv, sigkill   killed by that signal, no traceback
    silent          exit 0 without printing any throughput
    hang            never ends (its pid goes to hang.pid in the trial dir, $SWEEP_TRIAL_DIR)
    truncated       leave a cut-off result.json in the trial dir ($SWEEP_TRIAL_DIR) and kill
                    the trial process that would have written the real one: a torn record
    garbage         the same with bytes that are not even text
"""

import argparse
import json
import os
import signal
import sys
import time

TRIAL_DIR = os.environ.get("SWEEP_TRIAL_DIR", ".")  # sweep tells every command its trial dir

def encode(batch):  # the frame names match the built-in model's, which the phase patterns know
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity) batch={batch}")


def joint_and_loss(batch):
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 9.77 GiB (GPU 0; 79.15 GiB total capacity) batch={batch}")


def optimizer_step(batch):
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 79.15 GiB total capacity) batch={batch}")


OOM = {"oom_encoder": encode, "oom_joint": joint_and_loss, "oom": joint_and_loss, "oom_optimizer": optimizer_step}
PRINTS_THROUGHPUT = {"ok": "myrtle_new", "slow": "myrtle_new", "then_hang": "myrtle_new",
                     "myrtle_new": "myrtle_new", "myrtle_old": "myrtle_old", "dlll": "dlll", "regex": "regex", "jsonl": "jsonl"}


def train(args, fmt):
    gbs = args.global_batch_size
    for epoch in (1, 2, 3):
        tput = 1000.0 * (1 + args.split / 10) / args.accum - (200 if epoch == 1 else 0)
        if fmt == "myrtle_old":
            print(f"DLL 2023-05-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | avg train utts/s {tput:6.0f} | took {gbs / tput:.2f} s")
        elif fmt == "myrtle_new":
            print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {tput:8.2f} | train_avg_took : {gbs / tput:6.2f}")
        elif fmt == "dlll":
            rec = {"type": "LOG", "step": [epoch], "data": {"train_avg_throughput-audio-samples-per-sec": tput, "train_avg_took": gbs / tput}}
            print("DLLL " + json.dumps(rec))
        elif fmt == "regex":
            for step in range(5):
                print(f"epoch {epoch} step {step} took {gbs / tput:.4f}s -> {tput:.1f} samples/s\r", end="")
            print()
        elif fmt == "jsonl":
            print(json.dumps({"epoch": epoch, "metrics": {"samples_per_sec": tput}}))
        sys.stdout.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--behaviours", default="")
    args = p.parse_args()
    behaviour = dict(item.split(":") for item in args.behaviours.split(",") if item).get(str(args.accum), "ok")
    ledger = os.environ.get("FAULT_LEDGER")
    if ledger:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{args.accum} {args.split} {os.getpid()}\n".encode())
        os.close(fd)
    print(f"fake_train accum={args.accum} split={args.split} behaviour={behaviour} env={os.environ.get('SWEEP_FAKE_ENV', '')}", flush=True)
    time.sleep(float(os.environ.get("FAULT_DELAY_S", "0")))

    if behaviour in OOM:
        OOM[behaviour](args.global_batch_size // args.accum)
    if behaviour == "crash":
        raise ValueError("bad shard: /data/train-0042.tar is truncated")
    if behaviour in ("segv", "sigkill"):
        os.kill(os.getpid(), signal.SIGSEGV if behaviour == "segv" else signal.SIGKILL)
    if behaviour == "silent":
        return 0
    if behaviour == "hang":
        with open(os.path.join(TRIAL_DIR, "hang.pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
    if behaviour in ("truncated", "garbage"):
        with open(os.path.join(TRIAL_DIR, "result.json"), "wb") as f:
            f.write(b'{"accum": %d, "split": %d, "status": "o' % (args.accum, args.split) if behaviour == "truncated" else b"\x80\xff\x00{")
        os.kill(os.getppid(), signal.SIGKILL)  # the trial process: it never writes its own record
        return 1
    if behaviour == "slow":
        time.sleep(float(os.environ.get("FAKE_SLOW_S", "12")))

    time.sleep(float(os.environ.get("FAULT_DURATION_S", "0")))
    train(args, PRINTS_THROUGHPUT[behaviour])
    if behaviour == "then_hang":
        time.sleep(3600)  # a long training run: the sweep has what it needs and stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
