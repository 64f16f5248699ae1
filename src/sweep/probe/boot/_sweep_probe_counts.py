"""The probe's count of what updates the parameters: backward passes, and the torch.optim optimizers made.

A mixin of sweep/probe/boot/_sweep_probe.py's Probe (stdlib at import, as every boot module). Every PyTorch
training step runs backward passes, whoever's optimizer then updates the parameters (fastai's own, Keras 3's,
a hand-written update): they time the trainers that make no torch.optim optimizer, `accum` of them a step, and
count the micro-batches of those that do (core/validity.py checks the accumulation). A torch.optim optimizer
made in the process means its steps, not the backward passes, time the training: a trainer's warm-up or a
gradient check backpropagates before the first step.
"""

from __future__ import annotations

import functools
import time


class UpdateCounting:
    """Backward-pass records, optimizer-made records, and the optimizer steps AMP's GradScaler skips (the Probe provides
    _write, _sync, writer, compiling and the optimizer step hooks)."""

    backwards = 0  # backward passes in the open step (Probe._reset_steps and _close_step reset it)
    backward_index = 0  # backward passes since arming
    optimizer_calls = 0  # optimizer steps seen (Probe's pre-hook counts them)
    optimizer_classes: set = set()  # torch.optim classes made in this process (one record each per arming)

    def backward_done(self) -> None:
        """An outermost backward pass returned (the backward wrapper calls this): count it and record when."""
        if self.writer is None or self.compiling():
            return
        if self.optimizer_calls == 0:
            self._sync()  # no optimizer step syncs for it: the backward passes are the clock (CUDA runs ahead)
        self.backwards += 1
        self._write({"kind": "backward", "index": self.backward_index, "at": time.perf_counter()})
        self.backward_index += 1

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
            if probe.writer is not None and name not in probe.optimizer_classes:
                probe.optimizer_classes = probe.optimizer_classes | {name}  # the instance's own set, not the class's
                probe._write({"kind": "optimizer", "class": name})

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
