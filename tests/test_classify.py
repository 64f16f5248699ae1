"""Failure classification: real-looking log tails -> (status, OOM phase, reason)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.failure_logs import (
    CAUGHT_OOM_THEN_MISSING_FILE,
    JOINT_OOM,
    MODULE_CALL,
    NCCL_CUDA_FAILURE_2,
    OUTER,
    PROGRESS,
    RANK1_OOM_THEN_OTHERS_FAIL,
    RNNT,
    SITE,
    TORCH_OOM,
    TRAIN,
    traceback,
)

from sweep.core.schema import FINISHED_STATUSES, OOM_PHASES
from sweep.parsers import (
    MAX_REASON_CHARS,
    KillEvidence,
    classify_failure,
    compile_phase_patterns,
    no_throughput_reason,
)

ENCODER_OOM = PROGRESS + traceback(
    *OUTER,
    (TRAIN, 117, "train_step", "f, f_lens = model.encode(x, x_lens)"),
    (RNNT, 61, "encode", "out, _ = self.encoder(x)"),
    MODULE_CALL,
    (f"{SITE}/torch/nn/modules/rnn.py", 917, "forward", "result = _VF.lstm(input, hx, self._flat_weights, self.bias,"),
    error="RuntimeError: CUDA out of memory. Tried to allocate 1.25 GiB (GPU 0; 23.69 GiB total capacity; "
    "21.02 GiB already allocated; 512.00 MiB free; 22.10 GiB reserved in total by PyTorch)",
)
BACKWARD_ENCODER_OOM = traceback(
    *OUTER,
    (TRAIN, 130, "train_step", "model.backward_encoder(f, f_grad)"),
    (RNNT, 140, "backward_encoder", "f.backward(grad)"),
    (f"{SITE}/torch/_tensor.py", 525, "backward", "torch.autograd.backward("),
    (f"{SITE}/torch/autograd/__init__.py", 267, "backward", "_engine_run_backward("),
    (f"{SITE}/torch/autograd/graph.py", 744, "_engine_run_backward", "return Variable._execution_engine.run_backward("),
    error=TORCH_OOM,
)
OPTIMIZER_OOM = traceback(
    *OUTER,
    (TRAIN, 140, "train_step", "optimizer_step(opt, scaler)"),
    (TRAIN, 88, "optimizer_step", "opt.step()"),
    (f"{SITE}/torch/optim/optimizer.py", 391, "wrapper", "out = func(*args, **kwargs)"),
    (f"{SITE}/torch/optim/adam.py", 168, "step", "adam("),
    (f"{SITE}/torch/optim/adam.py", 318, "adam", "func(params,"),
    (f"{SITE}/torch/optim/adam.py", 560, "_multi_tensor_adam", "exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)"),
    error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.52 GiB.",
)
CUDNN_OOM = traceback(
    *OUTER,
    (RNNT, 61, "encode", "out, _ = self.encoder(x)"),
    (f"{SITE}/torch/nn/modules/rnn.py", 917, "forward", "result = _VF.lstm(input, hx, self._flat_weights,"),
    error="RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
)
CUBLAS_OOM = traceback(
    (RNNT, 98, "joint", "h = self.out(torch.tanh(h))"),
    (f"{SITE}/torch/nn/modules/linear.py", 116, "forward", "return F.linear(input, self.weight, self.bias)"),
    error="RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
)
CPU_OOM = traceback(
    *OUTER,
    (RNNT, 120, "joint_and_loss", "logits = self.joint(f, g)"),
    (RNNT, 98, "joint", "h = torch.tanh(f.unsqueeze(2) + g.unsqueeze(1))"),
    error="RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 6442450944 bytes. Error code 12 (Cannot allocate memory)",
)
PY_MEMORY_ERROR = traceback(
    *OUTER, (RNNT, 30, "predict", "g = self.embed(y)"), error="MemoryError"
)
NUMPY_MEMORY_ERROR = traceback(
    (TRAIN, 40, "load_batch", "feats = np.zeros((1000, 1000, 500))"),
    error="numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.73 GiB for an array with shape "
    "(1000, 1000, 500) and data type float64",
)
GENERIC_CRASH = PROGRESS + traceback(
    *OUTER,
    (TRAIN, 101, "train_step", 'x, x_lens = batch["audio"], batch["audio_lens"]'),
    error="KeyError: 'audio'",
)
ILLEGAL_ACCESS = traceback(
    (RNNT, 98, "joint", "h = torch.tanh(f.unsqueeze(2) + g.unsqueeze(1))"),
    error="RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
    "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
)
NCCL_ERROR = "".join(
    f"[rank1]: {line}\n"
    for line in traceback(
        *OUTER,
        (TRAIN, 150, "train_step", "dist.all_reduce(loss_sum)"),
        (f"{SITE}/torch/distributed/c10d_logger.py", 79, "wrapper", "return func(*args, **kwargs)"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 2288, "all_reduce", "work = group.allreduce([tensor], opts)"),
        error="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
        ":1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.\n"
        "Last error:\nsocketStartConnect: Connect to 10.0.0.2<43211> failed : Software caused connection abort",
    ).splitlines()
)
NCCL_WARN_ABORT = (
    "node01:1234:5678 [0] NCCL INFO Channel 00/02 :    0   1\n"
    "node01:1234:5680 [0] include/socket.h:409 NCCL WARN Net : Connect to 10.0.0.2<43211> failed : Connection refused\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
)
NCCL_OOM = traceback(
    (TRAIN, 150, "train_step", "dist.all_reduce(grads)"),
    (f"{SITE}/torch/distributed/distributed_c10d.py", 2288, "all_reduce", "work = group.allreduce([tensor], opts)"),
    error="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'",
)
EXIT_137_WITH_ERROR = PROGRESS + traceback(
    (TRAIN, 60, "load_manifest", "raise ValueError(f'{path}: no utterances')"),
    error="ValueError: /data/train.json: no utterances",
) + "Killed\n"
KERNEL_OOM = PROGRESS + (
    "[ 8812.334455] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0\n"
    "[ 8812.334600] Out of memory: Killed process 4321 (python) total-vm:98765432kB, anon-rss:65432100kB\n"
)
SLURM_OOM = PROGRESS + (
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4567.0. Some of your processes may have been "
    "killed by the cgroup out-of-memory handler.\n"
    "srun: error: node01: task 0: Out Of Memory\n"
)
SLURM_OOM_KILL_EVENT = "slurmstepd: error: Detected 1 oom_kill event in step 4567.batch cgroup.\n"
SACCT_OOM = "4567.0  python  OUT_OF_MEMORY  0:125\n"
TORCHRUN_CHILD_SIGKILL = PROGRESS + (
    "W0102 10:11:30.123000 140 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 1235 "
    "closing signal SIGTERM\n"
    "E0102 10:11:31.456000 140 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: -9) "
    "local_rank: 0 (pid: 1234) of binary: /usr/bin/python\n"
    + traceback(
        (f"{SITE}/torch/distributed/run.py", 883, "main", "run(args)"),
        (f"{SITE}/torch/distributed/launcher/api.py", 263, "launch_agent", "raise ChildFailedError("),
        error="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    )
    + "============================================================\ntrain.py FAILED\n"
    "------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n"
    "  time      : 2024-01-02_10:11:31\n  host      : node01\n  rank      : 0 (local_rank: 0)\n"
    "  exitcode  : -9 (pid: 1234)\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 1234\n"
)
SEGFAULT = PROGRESS + (
    "Fatal Python error: Segmentation fault\n\nThread 0x00007f1e2b3fe700 (most recent call first):\n"
    f'  File "{RNNT}", line 98 in joint\n  File "{TRAIN}", line 121 in train_step\n'
)
DATALOADER_KILLED = traceback(
    (f"{SITE}/torch/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()"),
    error="RuntimeError: DataLoader worker (pid 5678) is killed by signal: Killed. ",
)
INTERLEAVED_RANKS = "".join(
    f"[rank{rank}]: {line}\n"
    for pair in zip(
        traceback(
            *OUTER, (TRAIN, 121, "train_step", "loss = model.joint_and_loss(f, f_lens, g, y, y_lens)"),
            (RNNT, 120, "joint_and_loss", "logits = self.joint(f, g)"),
            (RNNT, 98, "joint", "h = torch.tanh(f.unsqueeze(2) + g.unsqueeze(1))"),
            error=TORCH_OOM,
        ).splitlines(),
        traceback(
            *OUTER, (TRAIN, 117, "train_step", "f, f_lens = model.encode(x, x_lens)"),
            (RNNT, 61, "encode", "out, _ = self.encoder(x)"),
            (f"{SITE}/torch/distributed/distributed_c10d.py", 2288, "all_reduce", "work = group.allreduce([t])"),
            error="torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout",
        ).splitlines(),
    )
    for rank, line in ((1, pair[0]), (0, pair[1]))
)
TRUNCATED_TAIL_OOM = "\n".join(JOINT_OOM.splitlines()[-5:]) + "\n"  # the tail starts mid-traceback
CAUGHT_OOM_EXIT_0 = PROGRESS + "WARNING: CUDA out of memory at batch 256; giving up\n"
SLURM_TIME_LIMIT = (
    PROGRESS + "slurmstepd: error: *** JOB 4567 ON node01 CANCELLED AT 2024-01-02T10:41:12 DUE TO TIME LIMIT ***\n"
)
SLURM_CANCELLED = PROGRESS + "slurmstepd: error: *** STEP 4567.0 ON node01 CANCELLED AT 2024-01-02T10:21:12 ***\n"
KEYBOARD_INTERRUPT = traceback(*OUTER, error="KeyboardInterrupt")


# (id, tail, exit_code, signal, expected status, expected phase, text the reason must contain)
CASES = [
    ("cuda-oom-joint", JOINT_OOM, 1, None, "oom", "joint", "torch.OutOfMemoryError: CUDA out of memory"),
    ("cuda-oom-encoder-old-torch", ENCODER_OOM, 1, None, "oom", "encoder", "RuntimeError: CUDA out of memory"),
    ("cuda-oom-backward-encoder", BACKWARD_ENCODER_OOM, 1, None, "oom", "encoder", "Tried to allocate 2.50 GiB"),
    ("cuda-oom-optimizer", OPTIMIZER_OOM, 1, None, "oom", "optimizer", "Tried to allocate 1.52 GiB"),
    ("cudnn-workspace", CUDNN_OOM, 1, None, "oom", "encoder", "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"),
    ("cublas-alloc", CUBLAS_OOM, 1, None, "oom", "joint", "CUBLAS_STATUS_ALLOC_FAILED"),
    ("cpu-allocator", CPU_OOM, 1, None, "oom", "joint", "DefaultCPUAllocator: can't allocate memory"),
    ("python-memoryerror", PY_MEMORY_ERROR, 1, None, "oom", "encoder", "MemoryError"),
    ("numpy-memoryerror", NUMPY_MEMORY_ERROR, 1, None, "oom", None, "_ArrayMemoryError"),
    ("nccl-cuda-oom", NCCL_OOM, 1, None, "oom", "optimizer", "Cuda failure 'out of memory'"),
    # A SIGKILL alone is not an OOM: anyone may send one (see test_a_kill_is_an_oom_only_on_evidence).
    ("sigkill-137", PROGRESS, 137, None, "failed", None,
     "killed by SIGKILL (exit status 137) with no sign of running out of memory (no memory evidence could be read)"),
    ("sigkill-signal", PROGRESS, None, 9, "failed", None, "killed by SIGKILL with no sign of running out of memory"),
    ("sigkill-subprocess", PROGRESS + "Killed\n", -9, None, "failed", None, "exit status -9) with no sign"),
    ("137-with-traceback", EXIT_137_WITH_ERROR, 137, None, "failed", None, "ValueError: /data/train.json"),
    ("kernel-oom-lines", KERNEL_OOM, 1, None, "oom", None, "Out of memory: Killed process 4321"),
    ("slurm-oom-kill", SLURM_OOM, 125, None, "oom", None, "task 0: Out Of Memory"),
    ("slurm-oom_kill-event", SLURM_OOM_KILL_EVENT, 1, None, "oom", None, "oom_kill event"),
    ("sacct-out-of-memory", SACCT_OOM, None, None, "oom", None, "OUT_OF_MEMORY"),
    ("torchrun-child-sigkill", TORCHRUN_CHILD_SIGKILL, 1, None, "failed", None,
     "traceback : Signal 9 (SIGKILL) received by PID 1234 with no sign of running out of memory"),
    ("dataloader-worker-killed", DATALOADER_KILLED, 1, None, "failed", None, "DataLoader worker (pid 5678)"),
    ("nccl-error", NCCL_ERROR, 1, None, "failed", None, "rank 1: torch.distributed.DistBackendError: NCCL error"),
    ("nccl-warn-abort", NCCL_WARN_ABORT, -6, None, "failed", None, "SIGABRT (exit status -6): terminate called"),
    ("generic-crash", GENERIC_CRASH, 1, None, "failed", None, "KeyError: 'audio'"),
    ("illegal-memory-access", ILLEGAL_ACCESS, 1, None, "failed", None, "an illegal memory access"),
    ("segfault-subprocess", SEGFAULT, -11, None, "failed", None, "killed by SIGSEGV (exit status -11)"),
    ("segfault-shell", PROGRESS + "Segmentation fault (core dumped)\n", 139, None, "failed", None,
     "SIGSEGV (exit status 139): Segmentation fault"),
    ("rank1-oom-rank0-nccl", INTERLEAVED_RANKS, 1, None, "oom", "joint", "rank 1: torch.OutOfMemoryError"),
    ("tail-starts-mid-traceback", TRUNCATED_TAIL_OOM, 1, None, "oom", "joint", "CUDA out of memory"),
    ("slurm-time-limit", SLURM_TIME_LIMIT, None, 15, "timeout", None, "DUE TO TIME LIMIT"),
    ("slurm-cancelled", SLURM_CANCELLED, 143, None, "cancelled", None, "CANCELLED AT"),
    ("sigterm", PROGRESS, 143, None, "cancelled", None, "SIGTERM"),
    ("keyboard-interrupt", KEYBOARD_INTERRUPT, 1, None, "cancelled", None, "KeyboardInterrupt"),
    ("plain-exit-1", PROGRESS + "some last words\n", 1, None, "failed", None, "exit status 1: some last words"),
    ("empty-log", "", 2, None, "failed", None, "exit status 2; the log tail is empty"),
    ("exit-0", PROGRESS, 0, None, "ok", None, ""),
    ("exit-0-even-with-oom-text", CAUGHT_OOM_EXIT_0, 0, None, "ok", None, ""),
]


@pytest.mark.parametrize(
    "tail,exit_code,sig,status,phase,reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_classification_table(
    tail: str, exit_code: int | None, sig: int | None, status: str, phase: str | None, reason: str
) -> None:
    got = classify_failure(tail, exit_code, sig)
    assert (got.status, got.oom_phase) == (status, phase), got.reason
    assert got.status in FINISHED_STATUSES and (got.oom_phase is None or got.oom_phase in OOM_PHASES)
    assert reason in got.reason
    assert "\n" not in got.reason and "\r" not in got.reason
    assert len(got.reason) <= MAX_REASON_CHARS
    if status == "ok":
        assert got.reason == ""


KILLS = [  # (id, tail, exit_code, signal): each way a kill shows up
    ("exit-137", PROGRESS, 137, None),
    ("signal-9", PROGRESS, None, 9),
    ("bash-killed-line", PROGRESS + "train.sh: line 3: 12345 Killed    python train.py\n", 1, None),
    ("torchrun-child", TORCHRUN_CHILD_SIGKILL, 1, None),
    ("dataloader-worker", DATALOADER_KILLED, 1, None),
]
EVIDENCE = [  # (evidence, status, text the reason must contain)
    (None, "failed", "with no sign of running out of memory (no memory evidence could be read)"),
    (KillEvidence(), "failed", "no memory evidence could be read"),
    # The case: a kill at a sampled peak of 0.014 of the host was called the OOM killer.
    (KillEvidence(oom_kills=0, kernel_oom=False, peak_fraction=0.014), "failed",
     "with no sign of running out of memory (the cgroup's oom_kill count did not rise; "
     "the kernel log names no OOM kill of it; sampled peak 0.014 of capacity)"),
    (KillEvidence(peak_fraction=0.89), "failed", "sampled peak 0.89 of capacity"),
    (KillEvidence(oom_kills=1), "oom", "out of memory (the cgroup's oom_kill count rose by 1)"),
    (KillEvidence(kernel_oom=True, peak_fraction=0.3), "oom", "the kernel log names it as OOM-killed"),
    (KillEvidence(oom_kills=0, peak_fraction=0.93), "oom", "sampled peak 0.93 of capacity"),
]


@pytest.mark.parametrize("evidence,status,reason", EVIDENCE)
@pytest.mark.parametrize("tail,exit_code,sig", [k[1:] for k in KILLS], ids=[k[0] for k in KILLS])
def test_a_kill_is_an_oom_only_on_evidence(
    tail: str, exit_code: int | None, sig: int | None, evidence: KillEvidence | None, status: str, reason: str
) -> None:
    got = classify_failure(tail, exit_code, sig, kill_evidence=evidence)
    assert (got.status, got.oom_phase) == (status, None), got.reason
    assert reason in got.reason


def test_evidence_of_an_oom_kill_without_a_kill_line() -> None:
    """A launcher that exits 1 after its child vanished: the cgroup's record is enough."""
    got = classify_failure(PROGRESS + "worker exited unexpectedly\n", 1, kill_evidence=KillEvidence(oom_kills=2))
    assert got.status == "oom" and got.reason == "exit status 1: out of memory (the cgroup's oom_kill count rose by 2)"


def test_evidence_does_not_override_a_python_error() -> None:
    got = classify_failure(GENERIC_CRASH, 1, kill_evidence=KillEvidence(peak_fraction=0.95))
    assert (got.status, got.reason) == ("failed", "KeyError: 'audio'")


OOM_TRACEBACK_THEN_MISSING_FILE = JOINT_OOM + "retrying the step on the CPU\n" + traceback(
    *OUTER, (TRAIN, 60, "load_manifest", "with open(path) as f:"),
    error="FileNotFoundError: [Errno 2] No such file or directory: '/data/dev.json'",
)
OOM_RERAISED_FROM = JOINT_OOM + "\nThe above exception was the direct cause of the following exception:\n\n" + traceback(
    *OUTER, error="RuntimeError: training step 17 failed",
)
OOM_THEN_HANDLER_FAILED = JOINT_OOM + "\nDuring handling of the above exception, another exception occurred:\n\n" + traceback(
    *OUTER, (TRAIN, 70, "save_checkpoint", "torch.save(state, path)"),
    error="OSError: [Errno 28] No space left on device",
)
RANK1_OOM_RANK0_OWN_ERROR = (
    "".join(f"[rank1]: {line}\n" for line in "WARNING: CUDA out of memory; skipping batch 12\n".splitlines())
    + "".join(f"[rank0]: {line}\n" for line in GENERIC_CRASH.splitlines())
)

ENDING_CASES = [
    ("caught-oom-then-missing-file", CAUGHT_OOM_THEN_MISSING_FILE, "failed", None, "FileNotFoundError"),
    ("oom-traceback-then-missing-file", OOM_TRACEBACK_THEN_MISSING_FILE, "failed", None, "FileNotFoundError"),
    ("oom-reraised-from", OOM_RERAISED_FROM, "oom", "joint", "torch.OutOfMemoryError"),
    ("oom-then-handler-failed", OOM_THEN_HANDLER_FAILED, "oom", "joint", "torch.OutOfMemoryError"),
    ("nccl-cuda-failure-2", NCCL_CUDA_FAILURE_2, "oom", "optimizer", "rank 0: Cuda failure 2 'out of memory'"),
    ("rank1-oom-others-fail-after", RANK1_OOM_THEN_OTHERS_FAIL, "oom", "joint", "rank 1: torch.OutOfMemoryError"),
    ("rank1-caught-oom-rank0-own-error", RANK1_OOM_RANK0_OWN_ERROR, "failed", None, "rank 0: KeyError: 'audio'"),
]


@pytest.mark.parametrize("tail,status,phase,reason", [c[1:] for c in ENDING_CASES], ids=[c[0] for c in ENDING_CASES])
def test_the_exception_that_ended_the_process_decides(tail: str, status: str, phase: str | None, reason: str) -> None:
    got = classify_failure(tail, 1)
    assert (got.status, got.oom_phase) == (status, phase), got.reason
    assert reason in got.reason


def test_long_reasons_are_cut_to_one_line() -> None:
    got = classify_failure(JOINT_OOM, 1)
    assert len(TORCH_OOM) > MAX_REASON_CHARS
    assert MAX_REASON_CHARS - 5 <= len(got.reason) <= MAX_REASON_CHARS and got.reason.endswith("...")


def test_carriage_returns_and_colour_codes_in_the_tail() -> None:
    tail = "Epoch 1: 10%|#  | 1/10\rEpoch 1: 20%|## | 2/10\r" + JOINT_OOM.replace("\n", "\r\n")
    tail = tail.replace("torch.OutOfMemoryError", "\x1b[31mtorch.OutOfMemoryError")
    got = classify_failure(tail, 1)
    assert (got.status, got.oom_phase) == ("oom", "joint")
    assert got.reason.startswith("torch.OutOfMemoryError")


def test_exit_zero_as_failure_when_asked() -> None:
    got = classify_failure(PROGRESS, 0, exit_zero_is_failure=True)
    assert got.status == "failed"
    assert got.reason.startswith("exited 0 without a throughput figure: DLL 2024-01-02")
    assert classify_failure(CAUGHT_OOM_EXIT_0, 0, exit_zero_is_failure=True).status == "oom"
    assert classify_failure(GENERIC_CRASH, 0, exit_zero_is_failure=True).reason == "KeyError: 'audio'"


USER_SCRIPT_OOM = traceback(
    ("/home/me/asr/train.py", 300, "main", "trainer.fit()"),
    ("/home/me/asr/trainer.py", 80, "fit", "loss = self.fwd_transducer(batch)"),
    ("/home/me/asr/trainer.py", 55, "fwd_transducer", "return self.model(batch)"),
    ("/home/me/asr/model.py", 20, "forward", "return self.lstm(x)"),
    error=TORCH_OOM,
)


@pytest.mark.parametrize(
    "patterns,phase",
    [
        (None, None),  # none of the built-in names
        ({"joint": [r", in fwd_transducer$"]}, "joint"),
        ({"joint": r"fwd_transducer"}, "joint"),  # a single string is one pattern
        ({"joint": [r"fwd_transducer"], "encoder": [r'model\.py", line \d+, in forward$']}, "encoder"),  # innermost
        ({"optimizer": [r"optimizer\.step"]}, None),
    ],
)
def test_custom_phase_patterns(patterns: dict | None, phase: str | None) -> None:
    got = classify_failure(USER_SCRIPT_OOM, 1, phase_patterns=patterns)
    assert (got.status, got.oom_phase) == ("oom", phase)


def test_custom_patterns_replace_the_defaults() -> None:
    assert classify_failure(JOINT_OOM, 1, phase_patterns={"encoder": [r"nothing"]}).oom_phase is None


@pytest.mark.parametrize(
    "patterns,message",
    [
        ({"decoder": ["x"]}, "phase_patterns: unknown phase 'decoder'; valid phases: encoder, joint, optimizer"),
        ({"joint": ["(unclosed"]}, "phase_patterns['joint']: '(unclosed' does not compile"),
        ({"joint": [3]}, "phase_patterns['joint']: expected regex strings, got int"),
        (["joint"], "phase_patterns: expected a mapping"),
    ],
)
def test_bad_phase_patterns_are_one_line_errors(patterns: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        compile_phase_patterns(patterns)  # type: ignore[arg-type]
    assert message in str(info.value) and "\n" not in str(info.value)


def test_no_throughput_reason(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    assert no_throughput_reason(log) == f"no throughput: the log {log} was never written"
    log.write_text("")
    assert no_throughput_reason(log) == f"no throughput: the log {log} is empty"
    log.write_text("hello\n")
    reason = no_throughput_reason(log, "regex")
    assert reason.startswith(f"no throughput line in 'regex' format in {log} (6 bytes)")
    assert "\n" not in reason and len(reason) <= MAX_REASON_CHARS


_PIECES = [
    PROGRESS, TORCH_OOM, "Traceback (most recent call last):\n", '  File "x.py", line 1, in joint\n', "    y()\n",
    "Killed\n", "[rank1]: ", "\r", "\n", "ValueError: bad\n", "\x00\x1b[0m", "é", "oom", " " * 5,
]


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES) | st.text(max_size=20), max_size=30),
       exit_code=st.none() | st.integers(-64, 300), sig=st.none() | st.integers(0, 64))
def test_fuzz_never_raises_and_reason_is_one_line(pieces: list[str], exit_code: int | None, sig: int | None) -> None:
    got = classify_failure("".join(pieces), exit_code, sig)
    assert got.status in FINISHED_STATUSES
    assert len(got.reason) <= MAX_REASON_CHARS and not any(c in got.reason for c in "\n\r\x00")
