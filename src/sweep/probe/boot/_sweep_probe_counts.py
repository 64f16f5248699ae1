"""The probe's count of what updates the parameters: backward passes, and the torch.optim optimizers made.

A mixin of sweep/probe/boot/_sweep_probe.py's Probe (stdlib at import, as every boot module). Every PyTorch
training step runs backward passes, whoever's optimizer then updates the parameters (fastai's own, Keras 3's,
a hand-written update): they time the trainers that make no torch.optim optimizer, `accum` of them a step, and
count the micro-batches of those that do (core/validity.py checks the accumulation). A torch.optim optimizer
made in the process means its steps, not the backward passes, time the training: a trainer's warm-up or a
gradient check backpropagates before the first step.

Where no torch.optim optimizer exists, the probe cannot see an update happen, only its effect: it watches one
parameter a backward pass reaches, and records `update` at each sampled backward pass that finds the parameter's
values changed since the one sampled before. The backward passes between those records are the trainer's
accumulation, checked against the one asked for as the optimizer steps' count is (a trainer that ignores --accum
updates after each).

What it costs must not grow with the accumulation, nor wait for a CUDA device more than timing a step does
(issue 50): with the accumulation asked for known (ACCUM_ENV), the device is synchronised only at the backward pass
that ends a step (every accum-th), and the watched parameter is sampled three times a step, at the first, second
and last pass of each window of `accum`: an update between steps shows at the first (gaps of accum), one after every
pass at the second and the last too (gaps of 1 between the first two: the median says 1), one every few passes
at the last (gaps that are not accum). The samples are compared only after that synchronisation, when the device has
finished them (a comparison reads its result on the host). The backward passes' times go to the record file in
one record a step. With the accumulation unknown (an older launcher), every pass is synchronised and sampled, as before.
Where a torch.optim optimizer is known (made, or stepped: one made before the probe armed), none of this runs:
its step record counts the passes.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

BACKWARD_BATCH = 64  # backward passes' times written in one record
BACKWARD_FLUSH_S = 0.5  # ... or after this long, so a reader following the run sees them soon


class UpdateCounting:
    """Backward-pass records, optimizer-made records, and the optimizer steps AMP's GradScaler skips (the Probe provides
    _write, _sync, writer, compiling and the optimizer step hooks)."""

    backwards = 0  # backward passes in the open step (Probe._reset_steps and _close_step reset it)
    backward_index = 0  # backward passes since arming
    optimizer_calls = 0  # optimizer steps seen (Probe's pre-hook counts them)
    optimizer_classes: set = set()  # torch.optim classes made in this process (one record each per arming)
    watched = None  # weakref to the parameter watched for updates (no torch.optim optimizer made), once one is found
    watched_before = None  # its sampled values' bytes at the previous sample
    accum = 0  # the accumulation asked for (Probe.arm reads ACCUM_ENV); 0: unknown

    if TYPE_CHECKING:  # Probe's (_sweep_probe.py): the state and methods these share with it
        torch: Any
        writer: Any  # _sweep_probe._Writer, None while disarmed
        undo: list[Callable[[], object]]
        _disabled: set[str]
        compiling: Callable[[], bool]

        def problem(self, where: str, exc: BaseException) -> None: ...
        def _write(self, record: dict) -> None: ...
        def _sync(self) -> None: ...

    def reset_ats(self) -> None:
        self.ats: list[float] = []  # backward passes' times not written yet
        self.ats_first = 0  # the index of the first of them
        self.ats_flushed_at = time.perf_counter()
        self.samples: list = []  # (backward index, sample) taken, not compared yet

    def torch_optimizer_known(self) -> bool:
        return bool(self.optimizer_classes) or self.optimizer_calls > 0

    def backward_done(self) -> None:
        """An outermost backward pass returned (the backward wrapper calls this): count it, and where no torch.optim
        step times the training, record when (the step's last pass synchronised first) and sample the watch."""
        if self.writer is None or self.compiling():
            return
        index = self.backward_index
        self.backward_index += 1
        self.backwards += 1
        if self.torch_optimizer_known():
            return  # the optimizer steps time the training; the step record counts the passes
        accum = self.accum
        ends_step = accum <= 0 or index % accum == accum - 1
        watching = "parameter watch" not in self._disabled
        if watching and (ends_step or index % accum <= 1):
            try:
                self._sample_watched(index)  # queued before the sync, which then waits for it too
            except Exception as exc:  # noqa: BLE001 - a watch that fails is off, never the trainer's problem
                self.problem("parameter watch", exc)
        if ends_step:
            self._sync()  # no optimizer step syncs for it: the step's last backward pass is the clock (CUDA runs ahead)
        at = time.perf_counter()
        if not self.ats:
            self.ats_first = index
        self.ats.append(at)
        if ends_step and self.samples and watching:
            try:
                self._compare_samples()
            except Exception as exc:  # noqa: BLE001
                self.problem("parameter watch", exc)
        # One record a step where the step is known (a reader follows the steps as they end, and a process the sweep
        # stops loses no whole step); else in batches.
        if (ends_step and accum > 0) or len(self.ats) >= BACKWARD_BATCH or at - self.ats_flushed_at >= BACKWARD_FLUSH_S:
            self.flush_ats()

    def flush_ats(self) -> None:
        """Write the backward passes' times not written yet, as one record."""
        if self.ats and self.writer is not None:
            self._write({"kind": "backwards", "first": self.ats_first, "ats": self.ats})
        self.ats = []
        self.ats_flushed_at = time.perf_counter()

    def watch_a_parameter(self, tensors) -> None:
        """Before an outermost backward pass with no torch.optim optimizer made and no parameter watched: watch the
        first parameter its graph reaches (an AccumulateGrad node's variable), found once, not at every pass."""
        if self.torch_optimizer_known() or self.writer is None or (self.watched is not None and self.watched() is not None):
            return
        if "parameter watch" in self._disabled or self.compiling():
            return
        try:
            roots = [tensors] if hasattr(tensors, "grad_fn") else list(tensors or ())
            queue = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None]
            seen: set[int] = set()
            while queue and len(seen) < 10_000:
                node = queue.pop(0)
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                variable = getattr(node, "variable", None)
                # A plain tensor only: reading a DTensor (FSDP2) or another subclass's values may run collectives.
                if variable is not None and type(variable.detach()) is self.torch.Tensor and variable.numel() > 0:
                    self.watched, self.watched_before = weakref.ref(variable), None
                    return
                queue.extend(next_node for next_node, _ in node.next_functions)
        except Exception as exc:  # noqa: BLE001
            self.problem("parameter watch", exc)

    def _sample_watched(self, index: int) -> None:
        """Copy 64 values spread over the watched parameter (queued on its device: no wait), to compare later."""
        param = self.watched() if self.watched is not None else None
        if param is None:
            return
        with self.torch.no_grad():
            flat = param.detach().reshape(-1)
            self.samples.append((index, flat[:: max(1, flat.numel() // 64)][:64].clone().view(self.torch.uint8)))

    def _compare_samples(self) -> None:
        """Record `update` at each sample that differs from the one before it: an update ran between the two. Called
        after the step's synchronisation, so reading a comparison waits for nothing. Compared as bytes: a NaN equals
        itself."""
        samples, self.samples = self.samples, []
        for index, sample in samples:
            before, self.watched_before = self.watched_before, sample
            if before is not None and before.shape == sample.shape and not self.torch.equal(before, sample):
                self._write({"kind": "update", "backward": index})

    def record_known_optimizers(self) -> None:
        """At (re-)arming: the optimizer classes made before, in the new record too."""
        for name in sorted(self.optimizer_classes):
            self._write({"kind": "optimizer", "class": name})

    def _install_optimizer_made_hook(self, torch) -> None:
        optimizer_class = torch.optim.Optimizer
        original = optimizer_class.__init__
        probe = self

        @functools.wraps(original)
        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            name = type(optimizer).__name__
            if probe.writer is not None:
                probe.optimizer_classes = probe.optimizer_classes | {name}  # the instance's own set, not the class's
                # Each one, with the steps before it: a range test's steps end where the trainer makes its own anew.
                probe._write({"kind": "optimizer", "class": name, "after_step": probe.step_index})

        optimizer_class.__init__ = __init__
        self.undo.append(lambda: setattr(optimizer_class, "__init__", original))

    def _install_scaler_wrapper(self, torch) -> None:
        scaler_class = torch.amp.GradScaler
        original = scaler_class.step
        probe = self

        @functools.wraps(original)
        def step(scaler, optimizer, *args, **kwargs):
            before = probe.optimizer_calls
            result = original(scaler, optimizer, *args, **kwargs)
            # No optimizer hook ran: the scaler skipped this step (inf/nan gradients). It still counts.
            if probe.writer is not None and probe.optimizer_calls == before:
                try:
                    probe._optimizer_begins(optimizer)
                    probe._optimizer_ends(optimizer, skipped=True)
                except Exception as exc:  # noqa: BLE001
                    probe.problem("GradScaler wrapper", exc)
            return result

        scaler_class.step = step
        self.undo.append(lambda: setattr(scaler_class, "step", original))
