"""The probe's hooks into modules, backward and the allocator (a part of _sweep_probe.Probe, split off for
size; the OOM records they write are _sweep_probe_oom.py's).

Which module was running when memory ran out costs nothing per step in the steady state: the module
is read after the fact, from the Python frames of the failing call (each module call runs
`Module._call_impl` with the module as `self`), and in backward from the autograd node the engine was
running (torch._C._current_autograd_node(), from CUDA's allocator OOM observer) or the Python
autograd Function whose backward raised, mapped to the module owning the nearest parameter.

Until the first step closes the probe also tracks modules live (global forward hooks keeping the
stack of running modules, always_call so an exception passing through is seen, and one gradient hook
per module output near the top of the stack for backward): that first step is where most OOMs happen,
and the one place a C++ op's OOM in backward on the CPU can be placed. It also learns the root
modules (those called while no other module runs). After it, the global hooks come out (they cost
every module call, some 10 us with the gradient hooks: 2-3% of the CPU demo's step) and only the
roots that hold other modules keep an always_call forward hook, which sees an OOM passing through a forward even when the
trainer catches it. sys.excepthook sees an OOM nobody catches; the autograd.backward wrapper one in
backward. Stdlib and torch only, like _sweep_probe.

torch.compile: dynamo guards on the module hooks it traced (the length of the global hook dicts, each
module's own), and warns into the user's log when global hooks meet a compiled module. Hooks that come
and go under it recompile the next call: the first timed step. So no module hook is ever added or
removed once a process uses torch.compile: the probe takes them all out as torch.compile (or
Module.compile) or dynamo's own torch._dynamo.optimize is called, before dynamo traces anything, and adds
none after. A module compiled some other way (a wrapper made before the probe armed) comes out as its
compiled wrapper is first called (before dynamo traces it, after torch's one warning), and a function
compiled so while the first step's hooks were in keeps them in. OOMs are then named from the frames and
the autograd node, as after any first step (a compiled module by the module it wraps).
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any

from _sweep_probe_import import AfterImport
from _sweep_probe_oom import OOM_MESSAGES, OomRecords, callers_frames, is_oom  # noqa: F401 - OOM_MESSAGES: a public name here too

WATCH_DEPTH = 3  # backward is followed into modules this deep in the running stack (_watch_backward)


class ModuleAndOomHooks(OomRecords):
    """The module, backward, OOM-observer and excepthook hooks of the probe (mixed into Probe)."""

    if TYPE_CHECKING:  # set here or by Probe (_sweep_probe.py)
        roots: weakref.WeakSet[Any]  # modules called while no other module was running
        tracking_handles: list[Any]  # torch's RemovableHandles
        root_hooks: list[Any]
        module_stack: list[Any]
        step_start: float | None
        last_watched: weakref.ref[Any] | None

    def _install_module_hooks(self, torch) -> None:
        self.call_impl_code = torch.nn.Module._call_impl.__code__
        self.node_type = torch.autograd.function.BackwardCFunction
        self.roots = weakref.WeakSet()  # modules called while no other module was running
        self.tracking_handles, self.root_hooks = [], []
        self._install_compile_watch(torch)
        self.dynamo_owns_modules = self._dynamo_compiled()  # armed late, after something was compiled
        self.start_tracking()
        self.undo.append(self._remove_module_hooks)

    def _install_compile_watch(self, torch) -> None:
        """torch.compile (Module.compile calls it too) and dynamo's own torch._dynamo.optimize first take the module
        hooks out (module docstring). torch._dynamo is imported by whoever compiles first, never by the probe."""
        self._take_hooks_out_before(torch, "compile")
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            self._take_hooks_out_before(dynamo, "optimize")
        else:
            finder = AfterImport("torch._dynamo", self._watch_dynamo)
            sys.meta_path.insert(0, finder)
            self.undo.append(finder.remove)

    def _watch_dynamo(self, dynamo) -> None:
        try:
            self._take_hooks_out_before(dynamo, "optimize")
        except Exception as exc:  # noqa: BLE001 - recorded; the user's import of torch._dynamo must stand
            self.problem("compile watch", exc)

    def _take_hooks_out_before(self, owner, name: str) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_sweep_probe_wrapped", False):
            return
        probe = self

        @functools.wraps(original)
        def compiler(*args, **kwargs):
            probe.leave_modules_to_dynamo()
            return original(*args, **kwargs)

        setattr(compiler, "_sweep_probe_wrapped", True)  # noqa: B010 - a mark on a function object
        setattr(owner, name, compiler)
        self.undo.append(lambda: setattr(owner, name, original))

    def leave_modules_to_dynamo(self) -> None:
        """No module hook from now on in this process: dynamo will guard on whatever hooks it traces."""
        if getattr(self, "dynamo_owns_modules", False):
            return
        self.dynamo_owns_modules = True
        try:
            self._remove_module_hooks()
            self.module_stack = []
        except Exception as exc:  # noqa: BLE001
            self.problem("module hooks", exc)

    def _dynamo_compiled(self) -> bool:
        """Whether dynamo has compiled any frame in this process (its own counter; it is not imported for this)."""
        utils = sys.modules.get("torch._dynamo.utils")
        try:
            return bool(utils is not None and utils.counters["frames"]["total"])
        except Exception:  # noqa: BLE001 - another torch's counters: take it that nothing was compiled
            return False

    def start_tracking(self) -> None:
        """Track modules live until the next step closes (a new record starts with this)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        if self.tracking_handles or self.dynamo_owns_modules:
            return
        for handle in self.root_hooks:
            handle.remove()
        self.root_hooks = []
        self.tracking_handles = [
            register_module_forward_pre_hook(self._forward_pre_hook),
            register_module_forward_hook(self._forward_hook, always_call=True),
        ]

    def stop_tracking(self) -> None:
        """From now on no hook runs per module call but the roots' own (see the module docstring)."""
        if not self.tracking_handles:
            return
        if self._dynamo_compiled():  # compiled with these hooks in (not through torch.compile): they stay
            self.dynamo_owns_modules = True
            return
        for handle in self.tracking_handles:
            handle.remove()
        self.tracking_handles, self.module_stack = [], []
        # Containers only: an exception from a leaf called directly (a trainer's own `model.encoder(x)`) goes
        # straight to its caller, and a hook on the leaf would slow every such call for nothing more.
        for root in [r for r in list(self.roots) if r._modules]:
            self.root_hooks.append(root.register_forward_hook(self._root_forward_hook, always_call=True))

    def _remove_module_hooks(self) -> None:
        for handle in [*self.tracking_handles, *self.root_hooks]:
            handle.remove()
        self.tracking_handles, self.root_hooks = [], []

    def _install_backward_wrapper(self, torch) -> None:
        original = torch.autograd.backward
        probe = self

        @functools.wraps(original)
        def backward(*args, **kwargs):
            if probe.writer is None:
                return original(*args, **kwargs)
            probe._activity()
            probe.backward_depth += 1
            if probe.backward_depth == 1:
                probe.backward_module = None
                probe.watch_a_parameter(args[0] if args else kwargs.get("tensors"))
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                if is_oom(exc):
                    probe.record_oom(exc, "exception")
                raise
            finally:
                probe.backward_depth -= 1
            if probe.backward_depth == 0:
                probe.backward_done()
            return result

        backward._sweep_probe_original = original  # type: ignore[attr-defined]
        torch.autograd.backward = backward  # Tensor.backward calls it through torch.autograd
        self.undo.append(lambda: setattr(torch.autograd, "backward", original))

    def _install_cuda_observer(self, torch) -> None:
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None or self.fork_hook_registered or not torch.cuda.is_available():
            return  # none, or attached at the first arming already (it cannot be detached)

        def attach_now() -> None:
            try:
                attach(self._cuda_oom_observer)
            except Exception as exc:  # noqa: BLE001
                self.problem("CUDA OOM observer", exc)

        torch.cuda._lazy_call(attach_now)  # at CUDA's initialisation, or now if it is up already

    def _install_excepthook(self, torch) -> None:
        previous = sys.excepthook

        def excepthook(kind, exc, tb):
            try:
                if is_oom(exc):
                    self.record_oom(exc, "uncaught")
            except Exception:  # noqa: BLE001
                pass
            previous(kind, exc, tb)

        sys.excepthook = excepthook
        self.undo.append(lambda: setattr(sys, "excepthook", previous))

    def _forward_pre_hook(self, module, args) -> None:
        if self.writer is None or self.compiling():
            return None
        if type(module).__name__ == "OptimizedModule":  # compiled not through torch.compile (torch._dynamo.optimize):
            self.leave_modules_to_dynamo()  # out before dynamo traces the module it wraps (torch has warned by now)
            return None
        if self.step_start is None:
            self.step_start = time.perf_counter()
        if not self.module_stack:
            self.roots.add(module)
            if module._modules and self.backward_depth == 0 and self.torch.is_grad_enabled():
                self.forwards += 1  # as _root_forward_hook counts them after this first step
        self.module_stack.append(module)
        return None

    def _forward_hook(self, module, args, output) -> None:
        if self.writer is None or self.compiling():
            return None
        stack = self.module_stack
        try:
            if output is None:
                exc = sys.exc_info()[1]
                if exc is not None and is_oom(exc):
                    self.record_oom(exc, "exception")
            elif self.backward_depth == 0 and self.torch.is_grad_enabled():
                self._watch_backward(module, output)
        except Exception as exc:  # noqa: BLE001
            self.problem("forward hook", exc)
        if stack and stack[-1] is module:
            stack.pop()
        elif module in stack:  # unbalanced (a hook elsewhere raised): unwind to it
            while stack and stack.pop() is not module:
                pass
        self.last_module = weakref.ref(module)  # weak: a warm worker's next trial must not find this model still held
        return None

    def _root_forward_hook(self, module, args, output) -> None:
        """After tracking: a root's forward ended; with no output, an exception is passing through it. A forward with
        gradients on, outside backward, is a micro-batch's (core/validity.py: a loop that averages its micro-batches'
        losses and runs one backward pass still runs `accum` forwards a step)."""
        if output is not None and self.backward_depth == 0 and self.torch.is_grad_enabled():
            self.forwards += 1
        elif output is None and self.writer is not None:
            try:
                exc = sys.exc_info()[1]
                if exc is not None and is_oom(exc):
                    self.record_oom(exc, "exception")
            except Exception as exc:  # noqa: BLE001
                self.problem("root forward hook", exc)
        return None

    def _watch_backward(self, module, output) -> None:
        """Hook one output tensor: its gradient means backward has reached the module.

        Only for modules at most WATCH_DEPTH deep in the running stack (`module.encoder.layers`: a
        phase is named near the top), so a model of thousands of layers pays for a handful per step."""
        if len(self.module_stack) > WATCH_DEPTH:
            return
        tensor = output
        if type(output) in (tuple, list):
            tensor = output[0] if output else None
        elif isinstance(output, dict):
            tensor = next(iter(output.values()), None)
        if not isinstance(tensor, self.torch.Tensor) or not tensor.requires_grad:
            return
        # A module returning its child's output as is: the child (innermost) names that gradient.
        if self.last_watched is not None and self.last_watched() is tensor:
            return
        key = id(module)
        entry = self.backward_hooks.get(key)
        if entry is None or entry[0]() is not module:  # one hook per module, made once
            entry = self.backward_hooks[key] = (weakref.ref(module), functools.partial(_backward_reached, self, weakref.ref(module)))
        tensor.register_hook(entry[1])
        self.last_watched = weakref.ref(tensor)

    def _cuda_oom_observer(self, device, alloc, device_allocated, device_free) -> None:
        try:
            message = (
                f"CUDA out of memory: tried to allocate {alloc} bytes on device {device} "
                f"({device_allocated} allocated, {device_free} free)"
            )
            # Called where the allocation failed: this thread's frames (a forward) or the autograd
            # node the engine runs (a backward, on the engine's device thread).
            node = self.torch._C._current_autograd_node()
            self._record_oom_at_context(message, "allocator", frames=callers_frames(), node=node)
            self.allocator_oom_pending = True
        except Exception as exc:  # noqa: BLE001
            self.problem("CUDA OOM observer", exc)


def _backward_reached(probe, ref, grad):
    probe.backward_module = ref
    return None


