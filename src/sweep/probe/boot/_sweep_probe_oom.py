"""An OOM's record in the probe: which module was running, known after the fact (a part of
_sweep_probe.Probe, split off for size; the hooks that call it are in _sweep_probe_modules.py).

In order: the module the live tracking of a first step has running; else the module of the failing
call's innermost `Module._call_impl` frame (every module call runs one, with the module as `self`);
in backward, the module the gradient watch saw reached, else the module owning the parameter nearest
below the autograd node that was running (the engine's current node, or a Python Function's `ctx`);
in an optimizer step, the optimizer; else the module that finished last. Stdlib and torch only.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any

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




class OomRecords:
    """Naming modules and writing OOM records (mixed into Probe)."""

    if TYPE_CHECKING:  # Probe's (_sweep_probe.py: __init__ and _reset_steps set them): what these methods read
        names: weakref.WeakKeyDictionary[Any, str]
        ooms: list[dict]
        step_index: int
        depth: int
        group: dict[int, int]
        expected: frozenset[int] | None
        module_stack: list[Any]
        backward_depth: int
        backward_module: weakref.ref[Any] | None
        current_optimizer: weakref.ref[Any] | None
        last_module: weakref.ref[Any] | None
        seen_exceptions: list[int]
        allocator_oom_pending: bool

        def _write(self, record: dict) -> None: ...

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
        if any(o["step"] == self._oom_step() for o in self.ooms):
            return
        self._record_oom_at_context(message[:300], "caller")

    def _oom_step(self) -> int:
        """The step an OOM belongs to. Until the first step closes the probe does not know which optimizers
        make a step, so it closes step 0 only when one of them steps again. An OOM after step 0's optimizers
        have stepped, outside any optimizer, is in the trainer's next step (a trainer whose one step runs two
        optimizers with a forward between them would see it one step late, and only in its first step)."""
        if self.expected is None and self.group and self.depth == 0:
            return self.step_index + 1
        return self.step_index

    def _record_oom_at_context(self, message: str, source: str, frames=(), node=None) -> None:
        # Innermost first: the module tracked live as running (an optimizer's closure runs the model inside
        # its step); the innermost module in the failing call's frames; in backward, the module the gradient
        # watch saw reached, else the owner of the parameter nearest the failing node; an optimizer step;
        # else the module that finished last (an op between modules, while tracking live).
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
        optimizer = self.current_optimizer() if self.current_optimizer is not None else None
        if module is None and path is None and self.depth > 0 and optimizer is not None:
            where, path, inside = "optimizer", f"optimizer:{type(optimizer).__name__}", True
        else:
            if module is None and path is None and self.last_module is not None:
                module = self.last_module()
            where = "backward" if self.backward_depth > 0 else ("optimizer" if self.depth > 0 else "forward")
            if path is None:
                path = self.module_path(module) if module is not None else ""
        record = {
            "kind": "oom",
            "step": self._oom_step(),
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
        paths = list(self.names.items())  # named first: their paths win
        for root in list(getattr(self, "roots", ())):
            prefix = self.module_path(root)
            held = prefix != type(root).__name__  # a root no other module holds: its children's paths start at it
            paths += [(module, (f"{prefix}.{name}" if held else name) if name else prefix) for name, module in root.named_modules()]
        owners: dict[int, tuple] = {}
        for module, path in paths:
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


def callers_frames() -> list[FrameType]:
    """The live stack, outermost first, above the caller of this function's caller (the OOM observer's,
    which CUDA's allocator calls): none on an autograd engine thread running a C++ node."""
    try:
        frame: FrameType | None = sys._getframe(2)
    except ValueError:
        return []
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


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
            # torch.compile's wrapper holds the model as `_orig_mod`: the user's path has no such part.
            if not (name == "_orig_mod" and type(current).__name__ == "OptimizedModule"):
                names.append(name)
        return ".".join(reversed(names)) if names else type(module).__name__
    except Exception:  # noqa: BLE001 - memory may be short right now: the class is a name too
        return type(module).__name__
