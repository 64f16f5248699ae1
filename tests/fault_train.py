"""A stand-in training command for the fault-injection tests: quick, and able to fail on purpose.

Its behaviour is picked per accum from --behaviours (e.g. --behaviours=4:crash,8:hang; anything
unlisted: ok). Every start is appended to $FAULT_LEDGER ("accum split pid" per line, one
O_APPEND write), so a test can tell a trial that ran twice. $FAULT_DURATION_S sets how long an
ok trial trains (default 1 s); $FAULT_DELAY_S how long every behaviour waits first (default 0).

    ok         train for FAULT_DURATION_S, print Myrtle-style throughput for 3 epochs, exit 0
    oom        a CUDA out-of-memory traceback in the joint network
    crash      a Python traceback (ValueError), exit 1
    segv       killed by SIGSEGV, no traceback
    sigkill    killed by SIGKILL, no traceback
    silent     exit 0 without printing any throughput
    hang       never ends (its pid goes to hang.pid in the working directory)
    truncated  leave a cut-off result.json in the trial dir (the working directory) and kill the
               trial process that would have written the real one: a torn record, as after a crash
    garbage    the same with bytes that are not even text
"""

import argparse
import os
import signal
import sys
import time


def joint_and_loss(batch):
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 9.77 GiB (GPU 0; 79.15 GiB total capacity) batch={batch}")


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
    print(f"fault_train accum={args.accum} split={args.split} behaviour={behaviour}", flush=True)
    time.sleep(float(os.environ.get("FAULT_DELAY_S", "0")))

    if behaviour == "oom":
        joint_and_loss(args.global_batch_size // args.accum)
    if behaviour == "crash":
        raise ValueError("bad shard: /data/train-0042.tar is truncated")
    if behaviour in ("segv", "sigkill"):
        os.kill(os.getpid(), signal.SIGSEGV if behaviour == "segv" else signal.SIGKILL)
    if behaviour == "silent":
        return 0
    if behaviour == "hang":
        with open("hang.pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
    if behaviour in ("truncated", "garbage"):
        with open("result.json", "wb") as f:
            f.write(b'{"accum": %d, "split": %d, "status": "o' % (args.accum, args.split) if behaviour == "truncated" else b"\x80\xff\x00{")
        os.kill(os.getppid(), signal.SIGKILL)  # the trial process: it never writes its own record
        return 1

    time.sleep(float(os.environ.get("FAULT_DURATION_S", "1")))
    gbs = args.global_batch_size
    for epoch in (1, 2, 3):
        tput = 1000.0 * (1 + args.split / 10) / args.accum - (200 if epoch == 1 else 0)
        print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {tput:8.2f} | train_avg_took : {gbs / tput:6.2f}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
