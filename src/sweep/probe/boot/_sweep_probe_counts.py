"""The probe's count of what updates the parameters: backward passes, and the torch.optim optimizers made.

A mixin of sweep/probe/boot/_sweep_probe.py's Probe (stdlib at import, as every boot module). Every PyTorch
training step runs backward passes, whoever's optimizer then updates the parameters (fastai's own, Keras 3's,
a hand-written update): they time the trainers that make no torch.optim optimizer, `accum` of them a step, and
count the micro-batches of those that do (core/validity.py checks the accumulation). A torch.optim optimizer
made in the process means its steps, not the backward passes, time the training: a trainer's warm-up or a
gradient check backpropagates before the first step.

Where no torch.optim optimizer exists, the probe cannot see an update happen, only its effect: it watches one
parameter a backward pass reaches, and records `update` at each backward pass that finds the parameter's values
changed since the previous one. The backward passes between those records are the trainer's accumulation, checked
against the one asked for as the optimizer steps' count is (a trainer that ignores --accum updates after each).
"""

from __future__ import annotations

import functools
import time
import weakref


class UpdateCounting:
    """Backward-pass records, optimizer-made records, and the optimizer steps AMP's GradScaler skips (the Probe provides
    _write, _sync, writer, compiling and the optimizer step hooks)."""

    backwards = 0  # backward passes in the open step (Probe._reset_steps and _close_step reset it)
    backward_index = 0  # backward passes since arming
    optimizer_calls = 0  # optimizer steps seen (Probe's pre-hook counts them)
    optimizer_classes: set = set()  # torch.optim classes made in this process (one record each per arming)
    watched = None  # weakref to the parameter watched for updates (no torch.optim optimizer made), once one is found
    watched_before = None  # its sampled values' bytes at the previous backward pass

    def backward_done(self) -> None:
        """An outermost backward pass returned (the backward wrapper calls this): count it and record when."""
        if self.writer is None or self.compiling():
            return
        if self.optimizer_calls == 0:
            self._sync()  # no optimizer step syncs for it: the backward passes are the clock (CUDA runs ahead)
        self.backwards += 1
        if not self.optimizer_classes and "parameter watch" not in self._disabled:
            try:
                self._note_an_update()
            except Exception as exc:  # noqa: BLE001 - a watch that fails is off, never the trainer's problem
                self.problem("parameter watch", exc)
        self._write({"kind": "backward", "index": self.backward_index, "at": time.perf_counter()})
        self.backward_index += 1

    def watch_a_parameter(self, tensors) -> None:
        """Before an outermost backward pass with no torch.optim optimizer made and no parameter watched: watch the
        first parameter its graph reaches (an AccumulateGrad node's variable), found once, not at every pass."""
        if self.optimizer_classes or self.writer is None or (self.watched is not None and self.watched() is not None):
            return
        if "parameter watch" in self._disabled or self.compiling():
            return
        try:
            roots = [tensors] if hasattr(tensors, "grad_fn") else list(tensors or ())
            queue, seen = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None], set()
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

    def _note_an_update(self) -> None:
        """Sample the watched parameter (64 values spread over it) and record `update` if they changed since the
        previous backward pass: an update ran between the two. Compared as bytes, so a NaN equals itself."""
        param = self.watched() if self.watched is not None else None
        if param is None:
            return
        torch = self.torch
        with torch.no_grad():
            flat = param.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)][:64].clone().view(torch.uint8)
        before, self.watched_before = self.watched_before, sample
        if before is not None and not torch.equal(before, sample):
            self._write({"kind": "update", "backward": self.backward_index})

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
