"""Real-looking log tails of trials that ended badly, for the classifier's tests (tests/test_classify.py) and
bench/reliability_evidence.py."""

from __future__ import annotations

SITE = "/usr/local/lib/python3.11/site-packages"


RNNT = "/opt/sweep/src/sweep/workloads/rnnt.py"


TRAIN = "/opt/sweep/src/sweep/workloads/train.py"


PROGRESS = (
    "DLL 2024-01-02 10:11:05.000001 - epoch    1 | iter    3/10 | step    3 | train_loss :  120.1 "
    "| train_throughput-audio-samples-per-sec :  1391.74 | train_took :  0.7357\n"
)


TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.20 GiB is free. Process 12345 has 77.94 GiB memory in use. Of the allocated memory "
    "75.10 GiB is allocated by PyTorch, and 1.30 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def traceback(*frames: tuple[str, int, str, str], error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines += [f'  File "{path}", line {lineno}, in {func}', f"    {code}"]
    return "\n".join(lines) + "\n" + error + "\n"


OUTER = [(TRAIN, 210, "<module>", "main()"), (TRAIN, 160, "main", "train_step(model, batch, opt)")]


MODULE_CALL = (
    f"{SITE}/torch/nn/modules/module.py", 1532, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"
)


JOINT_OOM = PROGRESS + traceback(
    *OUTER,
    (TRAIN, 121, "train_step", "loss = model.joint_and_loss(f, f_lens, g, y, y_lens)"),
    (RNNT, 120, "joint_and_loss", "logits = self.joint(f, g)"),
    MODULE_CALL,
    (RNNT, 98, "joint", "h = torch.tanh(self.enc_proj(f).unsqueeze(2) + self.pred_proj(g).unsqueeze(1))"),
    error=TORCH_OOM,
)


# issue 30: the exception that ended the process decides, not the first OOM-looking line.
CAUGHT_OOM_THEN_MISSING_FILE = PROGRESS + "WARNING: CUDA out of memory at batch 256; retrying with 128\n" + traceback(
    *OUTER, (TRAIN, 60, "load_manifest", "with open(path) as f:"),
    error="FileNotFoundError: [Errno 2] No such file or directory: '/data/dev.json'",
)


# The block torch prints by default when NCCL cannot allocate (torch >= 2.2 prefixes each rank's lines).
NCCL_CUDA_FAILURE_2 = "".join(
    f"[rank0]: {line}\n"
    for line in traceback(
        (TRAIN, 150, "train_step", "dist.all_reduce(grads)"),
        (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 2501, "all_reduce", "work = group.allreduce([tensor], opts)"),
        error="torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:"
        "317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'",
    ).splitlines()
)


RANK1_OOM_THEN_OTHERS_FAIL = (
    "".join(f"[rank1]: {line}\n" for line in JOINT_OOM.splitlines())
    + "".join(f"[rank0]: {line}\n" for line in traceback(
        *OUTER, (f"{SITE}/torch/distributed/distributed_c10d.py", 2288, "all_reduce", "work = group.allreduce([t])"),
        error="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[10.0.0.2]:43211",
    ).splitlines())
    + "".join(f"[rank2]: {line}\n" for line in traceback(
        *OUTER, error="torch.distributed.elastic.multiprocessing.api.SignalException: Process 1236 got signal: 15",
    ).splitlines())
    + traceback(
        (f"{SITE}/torch/distributed/launcher/api.py", 263, "launch_agent", "raise ChildFailedError("),
        error="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    )
    + "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 1235)\n"
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
)
