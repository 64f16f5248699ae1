"""Module hooks and OOM records of the probe (a part of _sweep_probe.Probe, split off for size).

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
roots keep an always_call forward hook, which sees an OOM passing through a forward even when the
trainer catches it. sys.excepthook sees an OOM nobody catches; the autograd.backward wrapper one in
backward. Stdlib and torch only, like _sweep_probe.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
import weakref

WATCH_DEPTH = 3  # backward is followed into modules this deep in the running stack (_watch_backward)
# Substrings of allocators' out-of-memory messages; sweep.workloads.rnnt.memory reads this same tuple.
OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "HIP out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
)


def is_oom(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return any(m in text for m in OOM_MESSAGES)


def _one_line(exc: BaseException) -> str:
    """The allocator's own words: from its marker on (no "[enforce fail at ...]"), first line, no error code."""
    text = str(exc).strip()
    for marker in OOM_MESSAGES:
        if marker in text:
            text = text[text.index(marker):]
            break
    first = text.splitlines()[0] if text else type(exc).__name__
    return first.split(". Error code")[0][:300]


class ModuleAndOomHooks:
    """The module, backward, OOM-observer and excepthook parts of the probe (mixed into Probe)."""

    def _install_module_hooks(self, torch) -> None:
        self.call_impl_code = torch.nn.Module._call_impl.__code__
        self.node_type = torch.autograd.function.BackwardCFunction
        self.roots = weakref.WeakSet()  # modules called while no other module was running
        self.tracking_handles, self.root_hooks = [], []
        self.start_tracking()
        self.undo.append(self._remove_module_hooks)

    def start_tracking(self) -> None:
        """Track modules live until the next step closes (a new record starts with this)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        if self.tracking_handles:
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
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                if is_oom(exc):
                    probe.record_oom(exc, "exception")
                raise
            finally:
                probe.backward_depth -= 1

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

    def name_modules(self, root, prefix: str = "") -> None:
        """Name root's modules by their attribute paths from root (`encoder.lstm`), ahead of any OOM.

        Without it a path is looked up when an OOM needs it, over the live objects; a caller that holds
        its model (the built-in workload) names it here, so that needs no memory when memory is short."""
        for name, module in root.named_modules(prefix=prefix):
            self.names[module] = name or type(module).__name__

    def module_path(self, module) -> str:
        try:
            return self.names[module]
        except (KeyError, TypeError):
            return _module_path(module)

    # ---------------------------------------------------------------- modules and OOMs

    def _forward_pre_hook(self, module, args) -> None:
        if self.writer is None or self.compiling():
            return None
        if self.step_start is None:
            self.step_start = time.perf_counter()
        if not self.module_stack:
            self.roots.add(module)
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
        self.last_module = module
        return None

    def _root_forward_hook(self, module, args, output) -> None:
        """After tracking: a root's forward ended; with no output, an exception is passing through it."""
        if output is None and self.writer is not None:
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
            self._record_oom_at_context(message, "allocator", frames=_callers_frames(), node=node)
            self.allocator_oom_pending = True
        except Exception as exc:  # noqa: BLE001
            self.problem("CUDA OOM observer", exc)

    def record_oom(self, exc: BaseException, source: str) -> None:
        """Record an OOM exception once (it passes through several hooks on its way out)."""
        if id(exc) in self.seen_exceptions:
            return
        self.seen_exceptions = (self.seen_exceptions + [id(exc)])[-16:]
        if self.allocator_oom_pending:  # the allocator's observer told us already, at the same place
            self.allocator_oom_pending = False
            return
        frames = _frames_of_traceback(exc.__traceback__)
        self._record_oom_at_context(_one_line(exc), source, frames=frames, node=self._node_in(frames))

    def note_oom(self, message: str) -> None:
        """An OOM a caller caught where no hook saw it (an op between modules on CPU): record it at
        the probe's current place, unless one is recorded in this step already."""
        if any(o["step"] == self.step_index for o in self.ooms):
            return
        self._record_oom_at_context(message[:300], "caller")

    def _record_oom_at_context(self, message: str, source: str, frames=(), node=None) -> None:
        # Innermost first: a module running (an optimizer's closure runs the model inside its step),
        # a backward, an optimizer step, else the module that ran last (an op between modules).
        module, path, inside, via = None, None, False, "hooks"
        if self.module_stack:
            module, inside = self.module_stack[-1], True
        if module is None:
            module = self._innermost_module(frames)
            inside, via = module is not None, "frames"
        if module is None and self.backward_depth > 0:
            if self.backward_module is not None:
                module, inside, via = self.backward_module(), True, "hooks"
            if module is None and node is not None:
                path = self._nearest_parameter_owner(node)
                inside, via = path is not None, "autograd node"
        if module is None and path is None and self.depth > 0 and self.current_optimizer is not None:
            where, path, inside = "optimizer", f"optimizer:{type(self.current_optimizer).__name__}", True
        else:
            module = module if module is not None or path is not None else self.last_module
            where = "backward" if self.backward_depth > 0 else ("optimizer" if self.depth > 0 else "forward")
            if path is None:
                path = self.module_path(module) if module is not None else ""
        record = {
            "kind": "oom",
            "step": self.step_index,
            "module": path,
            "where": where,
            "inside": inside,
            "via": via if path else "",
            "message": message,
            "source": source,
        }
        self.ooms.append(record)
        self._write(record)

    def _innermost_module(self, frames):
        """The module of the innermost `Module._call_impl` frame (frames run outermost first), or None."""
        code = getattr(self, "call_impl_code", None)
        for frame in reversed(frames):
            if frame.f_code is code:
                module = frame.f_locals.get("self")
                if module is not None:
                    return module
        return None

    def _node_in(self, frames):
        """The autograd node of the innermost Python autograd Function whose backward is in frames."""
        node_type = getattr(self, "node_type", None)
        for frame in reversed(frames):
            ctx = frame.f_locals.get("ctx") if frame.f_code.co_name == "backward" else None
            if node_type is not None and isinstance(ctx, node_type):
                return ctx
        return None

    def _nearest_parameter_owner(self, node) -> str | None:
        """The path of the module owning the parameter nearest below `node` in the autograd graph.

        A backward node is reached from the loss after the modules that ran after it in forward, and
        leads on to the parameters of the module it belongs to first (a Linear's AddmmBackward: its
        bias one edge away). Parameters found at the same distance name their common parent."""
        owners = self._parameter_owners()
        frontier, seen = [node], {id(node)}
        while frontier and len(seen) < 20000:
            found, following = [], []
            for current in frontier:
                for function, _ in getattr(current, "next_functions", ()):
                    if function is None or id(function) in seen:
                        continue
                    seen.add(id(function))
                    variable = getattr(function, "variable", None)
                    entry = owners.get(id(variable)) if variable is not None else None
                    if entry is not None and entry[0]() is variable:
                        found.append(entry[1])
                    following.append(function)
            if found:
                common = os.path.commonprefix([f.split(".") for f in found])
                return ".".join(common) if common else found[0]
            frontier = following
        return None

    def _parameter_owners(self) -> dict[int, tuple]:
        """id(parameter) -> (weak reference to it, its module's path), over the named and root modules."""
        owners: dict[int, tuple] = {}
        for module, path in list(self.names.items()):
            for parameter in module._parameters.values():
                if parameter is not None:
                    owners.setdefault(id(parameter), (weakref.ref(parameter), path))
        for root in list(getattr(self, "roots", ())):
            prefix = self.module_path(root)
            held = prefix != type(root).__name__  # a root no other module holds: its children's paths start at it
            for name, module in root.named_modules():
                path = (f"{prefix}.{name}" if held else name) if name else prefix
                for parameter in module._parameters.values():
                    if parameter is not None:
                        owners.setdefault(id(parameter), (weakref.ref(parameter), path))
        return owners


def _frames_of_traceback(tb) -> list:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _callers_frames() -> list:
    """The live stack, outermost first, above the caller of this function's caller (the OOM observer's,
    which CUDA's allocator calls): none on an autograd engine thread running a C++ node."""
    try:
        frame = sys._getframe(2)
    except ValueError:
        return []
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _backward_reached(probe, ref, grad):
    probe.backward_module = ref
    return None


def _module_path(module) -> str:
    """`encoder.lstm`: the module's attribute path from the outermost module holding it.

    Looked up only when an OOM needs it (a walk over the live modules), so steps pay nothing
    for names. A module no other module holds is named by its class."""
    try:
        import torch.nn as nn

        parent: dict[int, tuple[object, str]] = {}
        module_type = nn.Module
        for obj in gc.get_objects():
            # type(), not isinstance: a lazy or deprecated object's __class__ may warn or run code.
            if issubclass(type(obj), module_type):
                for name, child in obj._modules.items():
                    if child is not None and id(child) not in parent:
                        parent[id(child)] = (obj, name)
        names, current, seen = [], module, set()
        while id(current) in parent and id(current) not in seen:
            seen.add(id(current))
            current, name = parent[id(current)]
            names.append(name)
        return ".".join(reversed(names)) if names else type(module).__name__
    except Exception:  # noqa: BLE001 - memory may be short right now: the class is a name too
        return type(module).__name__
