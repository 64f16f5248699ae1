"""The probe inside a trained process: step times, allocator memory and OOMs, as JSON lines.

Importable on its own (stdlib at import, torch once the process imports it), so it runs in any
interpreter a trial starts, whether or not `sweep` is importable there. sweep.probe reads what it
writes; core/probe_report.py summarises it.

One file per process, `<record dir>/rank{R}-pid{P}.jsonl`, one JSON object per line, flushed per
line so a killed process leaves what it measured:
  start   pid, rank, local_rank, world_size, torch version, host
  step    one per optimizer step: index, end (epoch s), seconds, optimizers (count; skipped: those
          AMP's GradScaler skipped), backwards (backward passes in it), forwards (forward passes of the
          root modules in it, with gradients on; null where no module hook runs: torch.compile), lr
          (the first optimizer's first group's learning rate, a plain number only), memory peaks since
          the previous step (allocator on CUDA, /proc/self/status on CPU), the device
  optimizer each torch.optim optimizer made in this process: class, after_step (steps closed before it
          was made: one made after steps starts a new phase, as a learning-rate range test's reset does)
  backwards only where no torch.optim optimizer is known: first (the index of the first outermost
          backward pass in it), ats (this process's perf_counter as each returned), written once a step (the
          accumulation asked for known), else every BACKWARD_BATCH passes or BACKWARD_FLUSH_S; not one record a pass. They time
          trainers whose update is no torch.optim step (fastai's own, Keras 3's, a hand-written update).
          Where a torch.optim step exists its step record's count of passes is all core/validity.py needs
  update  with no torch.optim optimizer: backward (the index of a backward pass that found a watched
          parameter's values changed since the one sampled before it: an update ran between them)
  oom     module (path of the running module, "optimizer:<class>" in an optimizer step), where
          (forward/backward/optimizer), inside (whether that module was running or had just
          finished), via (hooks/frames/autograd node: how the module was known), message, step
  problem why part of the probe could not work (it never raises into the user's program)
  exit    at interpreter exit
Nothing is printed: the user's log stays theirs. Module hooks and OOM records are in
_sweep_probe_modules.py and _sweep_probe_oom.py, memory sampling in _sweep_probe_memory.py (the same
directory; mixins of Probe).

A step ends when the optimizers of one iteration have all stepped. Several optimizers stepping in
one iteration (Muon + AdamW, a GAN's pair) are one step: an optimizer that steps again closes the
step it already stepped in, and from then on the set seen in that step is expected, so later steps
close as soon as the whole set has stepped (not one step late). A step starts where the previous
one ended (so the time between steps, data loading included, counts) or, for the first, at the
first forward, backward or optimizer call since the probe armed; `begin_step()` lets a caller that
knows where its step starts (the built-in workload) say so.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TextIO

from _sweep_probe_counts import UpdateCounting
from _sweep_probe_memory import MemorySampling
from _sweep_probe_modules import OOM_MESSAGES, ModuleAndOomHooks, is_oom  # noqa: F401 - this module's public names too

RECORD_DIR_ENV = "SWEEP_PROBE_DIR"
# Substrings of allocators' out-of-memory messages (kept in step with sweep.workloads.rnnt.memory).
_RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
_WORLD_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
# The Slurm step the sweep's own launcher ran in ("<job>.<step>", set by sweep.probe.probe_env). Slurm's task count
# there describes that step's tasks (one launcher a node), or an allocation the sweep was started in, not the
# command's ranks: SLURM_NTASKS counts only in a step of the command's own (an `srun` inside the command).
LAUNCHER_STEP_ENV = "SWEEP_PROBE_LAUNCHER_STEP"
ACCUM_ENV = "SWEEP_PROBE_ACCUM"  # the accumulation asked for: backward passes a step where no torch.optim step is seen


def slurm_step() -> str:
    return f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"


def _env_int(names: tuple[str, ...], default: int) -> int:
    inherited = LAUNCHER_STEP_ENV in os.environ and os.environ[LAUNCHER_STEP_ENV] == slurm_step()
    for name in names:
        if inherited and name == "SLURM_NTASKS":
            continue  # the launcher's step's, or the allocation's: not this command's ranks (SLURM_PROCID still names a node's)
        value = os.environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return default


class _Writer:
    """This process's record file; opened on first use, again after a fork (the child's own file)."""

    def __init__(self, record_dir: str) -> None:
        self.record_dir = record_dir
        self.pid = -1
        self.file: TextIO | None = None
        self.lock = threading.Lock()
        self.broken = False

    def write(self, record: dict, rank: int) -> None:
        if self.broken:
            return
        try:
            with self.lock:
                if self.pid != os.getpid() or self.file is None:
                    os.makedirs(self.record_dir, exist_ok=True)
                    self.pid = os.getpid()
                    self.file = open(os.path.join(self.record_dir, f"rank{rank}-pid{self.pid}.jsonl"), "a", encoding="utf-8")
                self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
                self.file.flush()
        except Exception:  # noqa: BLE001 - a full disk must not stop the training
            self.broken = True

    def close(self) -> None:
        with self.lock:
            if self.file is not None and self.pid == os.getpid():
                try:
                    self.file.close()
                except OSError:
                    pass
            self.file = None


class Probe(ModuleAndOomHooks, MemorySampling, UpdateCounting):
    """The hooks' state in one process. One instance (PROBE); arm() points it at a record dir."""

    def __init__(self) -> None:
        self.writer: _Writer | None = None
        self.file_rank = 0
        self.hooks_installed = False
        self.status_fd: int | None = None  # /proc/self/status and clear_refs, kept open
        self.clear_refs_fd: int | None = None
        self.fd_pid = -1
        self.fork_hook_registered = False
        self.keep_steps = False
        self.steps: list[dict] = []  # this arming's step records, when keep_steps (in-process callers)
        self.ooms: list[dict] = []  # this arming's oom records
        self._disabled: set[str] = set()  # hooks that failed once: off for the rest of the run
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> path, from name_modules
        self.trainer_peaks: dict[int, dict[str, int]] = {}  # _sweep_probe_memory's peak view
        self.backward_hooks: dict[int, tuple] = {}  # id(module) -> (weakref to it, its tensor hook)
        self.tracking_handles: list = []  # the global module hooks, while modules are tracked live
        self.root_hooks: list = []  # the root modules' own hooks, after that
        self.accum = 0  # the accumulation asked for (ACCUM_ENV); 0: unknown, every backward pass may end a step
        self._reset_steps()

    # ---------------------------------------------------------------- arming

    def _reset_steps(self) -> None:
        self.step_index = 0
        self.step_start: float | None = None
        self.explicit_start = False
        self.group: dict[int, int] = {}  # id(optimizer) -> times stepped in the open step
        self.group_skipped = 0
        self.group_end: float | None = None  # perf_counter at the open step's last optimizer end
        self.group_end_wall = 0.0
        self.expected: frozenset[int] | None = None  # the optimizers one step is made of, once known
        self.depth = 0  # nested optimizer steps (an optimizer wrapping another)
        self.current_optimizer: weakref.ref[Any] | None = None  # the optimizer whose step is running
        self.memory: dict[str, int] = {}
        self.retries_before: int | None = None
        self.module_stack: list = []
        self.last_module: weakref.ref[Any] | None = None  # the module whose forward ended last (while tracked live)
        self.backward_module: weakref.ref[Any] | None = None  # the module whose output's gradient was computed last
        self.backward_depth = 0
        self.last_watched: weakref.ref[Any] | None = None  # the tensor whose gradient was hooked last
        self.allocator_oom_pending = False
        self.seen_exceptions: list[int] = []
        self.backwards = 0  # backward passes in the open step
        self.backward_index = 0  # backward passes since arming
        self.forwards = 0  # root modules' forward passes (gradients on) in the open step
        self.group_lr: float | None = None  # the open step's learning rate (the first optimizer to end in it)
        self.reset_ats()

    def rank(self) -> int:
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # noqa: BLE001
            pass
        return self.file_rank

    def world_size(self) -> int:
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return int(dist.get_world_size())
        except Exception:  # noqa: BLE001
            pass
        return _env_int(_WORLD_VARIABLES, 1)

    def arm(self, record_dir: str, keep_steps: bool = False) -> None:
        """Point the probe at record_dir (again: a new dir starts a new record) and install its hooks."""
        record_dir = os.path.abspath(record_dir)
        if self.writer is not None and self.writer.record_dir == record_dir and self.hooks_installed:
            self.keep_steps = self.keep_steps or keep_steps
            return
        if self.writer is not None:
            self._finish("rearmed")
            self.writer.close()
        self._reset_steps()
        self.steps, self.ooms = [], []
        self.keep_steps = keep_steps
        self.writer = _Writer(record_dir)
        self.file_rank = _env_int(_RANK_VARIABLES, 0)
        self.accum = max(0, _env_int((ACCUM_ENV,), 0))
        import torch

        self._write(
            {
                "kind": "start",
                "pid": os.getpid(),
                "rank": self.rank(),
                "local_rank": _env_int(("LOCAL_RANK", "SLURM_LOCALID"), 0),
                "world_size": self.world_size(),
                "torch": str(torch.__version__),
                "host": socket.gethostname(),
                "argv": sys.argv[:4],
            }
        )
        self.record_known_optimizers()  # a re-armed process made its optimizers under the earlier record
        if not self.hooks_installed:
            self.hooks_installed = True
            self._install_hooks(torch)
        elif "module hooks" not in self._disabled:
            self.start_tracking()  # the new record's first step is tracked live, as the first arming's was

    def _write(self, record: dict) -> None:
        if self.writer is None:
            return
        if "t" not in record:
            record["t"] = time.time()
        if "rank" not in record:  # not setdefault: the rank is looked up (torch.distributed) only when missing
            record["rank"] = self.rank()
        self.writer.write(record, self.file_rank)

    def problem(self, where: str, exc: BaseException) -> None:
        if where in self._disabled:
            return
        self._disabled.add(where)
        self._write({"kind": "problem", "message": f"{where}: {type(exc).__name__}: {exc}"[:500]})

    # ---------------------------------------------------------------- hooks

    def _install_hooks(self, torch) -> None:
        self.torch = torch
        self.compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
        steps = [
            ("optimizer hooks", self._install_optimizer_hooks),
            ("module hooks", self._install_module_hooks),
            ("backward wrapper", self._install_backward_wrapper),
            ("GradScaler wrapper", self._install_scaler_wrapper),
            ("CUDA OOM observer", self._install_cuda_observer),
            ("CUDA peak view", self._install_peak_view),
            ("excepthook", self._install_excepthook),
        ]
        self.undo: list[Callable[[], object]] = []
        for name, install in steps:
            try:
                install(torch)
            except Exception as exc:  # noqa: BLE001
                self.problem(name, exc)
        if not self.fork_hook_registered:  # cannot be unregistered: once per process
            self.fork_hook_registered = True
            os.register_at_fork(after_in_child=self._after_fork)
            atexit.register(self._at_exit)

    def disarm(self) -> None:
        """Close the record and take every hook out again (the overhead bench compares with and without)."""
        if self.writer is not None:
            self._finish("disarmed")
            self.writer.close()
            self.writer = None
        for undo in reversed(getattr(self, "undo", [])):
            undo()
        self.undo = []
        self.hooks_installed = False

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) writes only if it ever steps, to its own file.
        self.module_stack = []
        self.depth = 0

    def _install_optimizer_hooks(self, torch) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.undo.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook).remove)
        self.undo.append(register_optimizer_step_post_hook(self._optimizer_post_hook).remove)
        self._install_optimizer_made_hook(torch)


    # ---------------------------------------------------------------- steps

    def _activity(self) -> None:
        if self.step_start is None:
            self.step_start = time.perf_counter()

    def begin_step(self) -> None:
        """The next step starts now (a caller that knows where its step begins)."""
        self._sync()
        self.step_start = time.perf_counter()
        self.explicit_start = True

    def end_step(self) -> dict | None:
        """Close the open step now (a caller that knows its step is over); its record, or None."""
        if not self.group:
            return None
        return self._close_step()

    def _sync(self) -> None:
        torch = self.torch if self.hooks_installed else None
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def _optimizer_pre_hook(self, optimizer, args, kwargs) -> None:
        if self.writer is None or self.compiling():
            return
        if self.depth > 0 and self.current_optimizer is not None and optimizer is self.current_optimizer():
            self.depth = 0  # its last step never finished (an exception the trainer caught): start afresh
        self.depth += 1
        if self.depth > 1:
            return
        self.optimizer_calls += 1
        try:
            self._optimizer_begins(optimizer)
        except Exception as exc:  # noqa: BLE001
            self.problem("optimizer pre-hook", exc)

    def _optimizer_post_hook(self, optimizer, args, kwargs) -> None:
        if self.writer is None or self.compiling() or self.depth == 0:
            return
        self.depth -= 1
        if self.depth > 0:
            return
        try:
            self._optimizer_ends(optimizer, skipped=False)
        except Exception as exc:  # noqa: BLE001
            self.problem("optimizer post-hook", exc)

    def _optimizer_begins(self, optimizer) -> None:
        self._activity()
        if id(optimizer) in self.group:  # it stepped in the open step already: that step is over
            if self.expected is None or not self.expected <= set(self.group):
                self.expected = frozenset(self.group)
            self._close_step()
            self._activity()
        self.current_optimizer = weakref.ref(optimizer)  # weak, as last_module: the probe keeps no trainer object alive

    def _optimizer_ends(self, optimizer, skipped: bool) -> None:
        # Where the step's optimizers are known, only the last to step ends it: the device is waited for there alone
        # (a GAN's two optimizers: one wait a step, not two). Until then, at every optimizer step's end.
        if self.expected is None or self.expected <= {*self.group, id(optimizer)}:
            self._sync()
        # Memory first, then the clock: the probe's own work belongs to the step that ends here, so the
        # boundary falls where the optimizer step returns to the trainer.
        self._sample_memory()
        self.group_end = time.perf_counter()
        self.group_end_wall = time.time()
        self.group[id(optimizer)] = self.group.get(id(optimizer), 0) + 1
        self.group_skipped += int(skipped)
        if self.group_lr is None:
            self.group_lr = _plain_lr(optimizer)
        self.current_optimizer = None
        self.last_module = None
        if self.expected is not None and self.expected <= set(self.group):
            self._close_step()

    def _close_step(self) -> dict:
        torch = self.torch
        memory, self.memory = self.memory, {}
        device = "cpu"
        retries = None
        try:
            if torch.cuda.is_initialized():
                device = "cuda"
                total = int(torch.cuda.memory_stats(torch.cuda.current_device()).get("num_alloc_retries", 0))
                retries = total - (self.retries_before if self.retries_before is not None else 0)
                self.retries_before = total
        except Exception as exc:  # noqa: BLE001
            self.problem("CUDA retries", exc)
        end = self.group_end if self.group_end is not None else time.perf_counter()
        start = self.step_start if self.step_start is not None else end
        record = {
            "kind": "step",
            "step": self.step_index,
            "rank": self.rank(),
            "end": self.group_end_wall or time.time(),
            "seconds": max(0.0, end - start),
            "optimizers": sum(self.group.values()),
            "backwards": self.backwards,
            "forwards": None if getattr(self, "dynamo_owns_modules", True) or "module hooks" in self._disabled else self.forwards,
            "lr": self.group_lr,
            "world_size": self.world_size(),  # here, not only at start: torch.distributed is up by now
            "skipped": self.group_skipped,
            "device": device,
            "allocated_peak": memory.get("allocated_peak"),
            "reserved_peak": memory.get("reserved_peak"),
            "retries": retries,
            "resident_peak": memory.get("resident_peak"),
            "resident": memory.get("resident"),
            "address_peak": memory.get("address_peak"),
            "address": memory.get("address"),
        }
        self._write(record)
        if self.keep_steps:
            self.steps.append(record)
        if self.tracking_handles:
            try:
                self.stop_tracking()
            except Exception as exc:  # noqa: BLE001
                self.problem("module hooks", exc)
        self.step_index += 1
        self.group, self.group_skipped, self.group_end, self.group_end_wall = {}, 0, None, 0.0
        self.backwards = self.forwards = 0
        self.group_lr = None
        self.step_start, self.explicit_start = end, False
        self.allocator_oom_pending = False
        return record

    def _finish(self, why: str) -> None:
        if self.group:
            self._close_step()
        self.flush_ats()
        self._write({"kind": "exit", "steps": self.step_index, "why": why})

    def _at_exit(self) -> None:
        try:
            if self.writer is not None:
                self._finish("exit")
                self.writer.close()
        except Exception:  # noqa: BLE001
            pass


def _plain_lr(optimizer) -> float | None:
    """The first parameter group's learning rate where it is a plain number (a tensor's may sit on the device)."""
    try:
        lr = optimizer.param_groups[0].get("lr")
    except Exception:  # noqa: BLE001 - an optimizer without param_groups: no rate to report
        return None
    return float(lr) if type(lr) in (float, int) else None


PROBE = Probe()


def arm_quietly(record_dir: str, keep_steps: bool = False) -> None:
    """Arm, or say in the record dir why not; never raises (boot/sitecustomize.py calls it as torch finishes importing)."""
    try:
        PROBE.arm(record_dir, keep_steps=keep_steps)
    except Exception as exc:  # noqa: BLE001
        try:
            os.makedirs(record_dir, exist_ok=True)
            with open(os.path.join(record_dir, f"problem-pid{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps({"kind": "problem", "pid": os.getpid(), "t": time.time(), "message": f"arming failed: {exc}"}) + "\n")
        except Exception:  # noqa: BLE001
            pass
