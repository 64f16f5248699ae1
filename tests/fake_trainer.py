"""A stand-in for a popular trainer: prints its training log exactly as the framework does, with a
throughput that depends on the micro-batch, so an end-to-end sweep through the real launcher has a
best candidate to find. tests/fake_train.py does the same for the Myrtle (caiman-asr) format.

    --kind step_time   nanoGPT train.py: `iter N: loss X, time Yms, mfu Z%` (parser nanogpt)
    --kind tokens      torchtitan metrics: coloured `step: N  loss: ...  tps: ...` per GPU behind `[rank0]:` (torchtitan)
    --kind samples     timm train.py: `Train: E [ i/N (..%)]  Loss: ...  Time: ...s, R/s ...` (timm)

Throughput: each device does 200 x b / (b + 8) samples/s at micro-batch b (bigger is faster, with
diminishing returns), times 1 - 0.02 x (accum - 1) for the accumulation overhead; the first step
(warm-up: compilation, evaluation) takes 20 times as long. A micro-batch above --oom_above dies
with a CUDA OOM traceback, as a real run would. Step-to-step jitter of about 1% is deterministic.
"""

import argparse
import sys
import time


def samples_per_s(args):
    b = args.per_device_batch
    return args.num_devices * 200.0 * b / (b + 8) * (1 - 0.02 * (args.accum - 1))


def step_seconds(args, step):
    base = args.global_batch_size / samples_per_s(args)
    jitter = 1 + 0.01 * (((step * 7) % 5) - 2) / 2
    return base * jitter * (20 if step == 0 else 1)


def nanogpt(args):
    # karpathy/nanoGPT train.py: an evaluation line at iter 0, then one line per iter (log_interval=1);
    # mfu is -100.00% until local_iter_num >= 5.
    print("step 0: train loss 10.9874, val loss 10.9890", flush=True)
    for it in range(args.steps):
        dt = step_seconds(args, it)
        mfu = -100.0 if it < 5 else 31.5
        print(f"iter {it}: loss {10.9 - 0.05 * it:.4f}, time {dt * 1000:.2f}ms, mfu {mfu:.2f}%", flush=True)
        time.sleep(args.sleep)


def torchtitan(args):
    # pytorch/torchtitan components/metrics.py MetricsProcessor.log, with its default colours, as
    # torchrun --tee prefixes it; tps is tokens per second per GPU.
    red, green, orange, turq, blue, cyan, magenta, reset = (f"\x1b[{c}m" for c in (31, 32, 33, 36, 34, 96, 35, 39))
    for step in range(1, args.steps + 1):
        tps = samples_per_s(args) * args.seq_len / args.num_devices / (20 if step == 1 else 1)
        tps *= 1 + 0.01 * (((step * 7) % 5) - 2) / 2
        print(
            f"[rank0]:[titan] 2025-06-01 10:00:00,000 - root - INFO - {red}step: {step:2}  {green}loss: {8.5 - 0.01 * step:8.5f}  "
            f"{orange}grad_norm: {1.2:7.4f}  {turq}memory: {40.12:5.2f}GiB({50.71:.2f}%)  {blue}tps: {round(tps):,}  "
            f"{cyan}tflops: {300.12:,.2f}  {magenta}mfu: {30.35:.2f}%{reset}",
            flush=True,
        )
        time.sleep(args.sleep)
    print(f"[rank0]:[titan] 2025-06-01 10:00:09,000 - root - INFO - {orange}validate step: {args.steps:2}  "
          f"{green}loss: {8.1:7.4f}  {turq}memory: {40.12:5.2f}GiB({50.71:.2f}%)  {blue}tps: {99999:,}{reset}", flush=True)


def timm(args):
    # huggingface/pytorch-image-models train.py train_one_epoch, log_interval=1 here; then validate().
    last = args.steps - 1
    for i in range(args.steps):
        dt = step_seconds(args, i)
        rate = args.global_batch_size / dt
        print(
            f"Train: 0 [{i:>4d}/{args.steps} ({100. * i / last:>3.0f}%)]  Loss: {6.9:#.3g} ({6.9:#.3g})  "
            f"Time: {dt:.3f}s, {rate:>7.2f}/s  ({dt:.3f}s, {rate:>7.2f}/s)  LR: {1e-3:.3e}  Data: {0.01:.3f} ({0.01:.3f})",
            flush=True,
        )
        time.sleep(args.sleep)
    print(f"Test: [   0/10]  Time: {0.686:.3f} ({0.686:.3f})  Loss: {6.8:>7.3f} ({6.8:>7.3f})  "
          f"Acc@1: {0.1:>7.3f} ({0.1:>7.3f})  Acc@5: {0.5:>7.3f} ({0.5:>7.3f})", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("step_time", "tokens", "samples"), required=True)
    # The frameworks' own flag names too, so a sweep's recommendation shows them (nanoGPT, torchtitan, timm).
    p.add_argument("--accum", "--gradient_accumulation_steps", "--grad-accum-steps", type=int, default=None,
                   help="default: global batch / (micro-batch x devices), as torchtitan derives it")
    p.add_argument("--per_device_batch", "--batch_size", "--training.local_batch_size", "--batch-size", type=int, required=True)
    p.add_argument("--global_batch_size", "--training.global_batch_size", type=int, default=None,
                   help="default: micro-batch x accum x devices (nanoGPT and timm take no global batch)")
    p.add_argument("--num_devices", type=int, default=1)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--oom_above", type=int, default=0, help="micro-batches above this OOM; 0: never")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds between log lines")
    args = p.parse_args()
    if args.accum is None and args.global_batch_size is None:
        p.error("give --accum or --global_batch_size")
    if args.accum is None:
        args.accum = max(1, args.global_batch_size // (args.per_device_batch * args.num_devices))
    if args.global_batch_size is None:
        args.global_batch_size = args.per_device_batch * args.accum * args.num_devices
    if args.oom_above and args.per_device_batch > args.oom_above:
        raise RuntimeError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity) micro-batch={args.per_device_batch}"
        )
    {"step_time": nanogpt, "tokens": torchtitan, "samples": timm}[args.kind](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
