"""Lets PyPI's torchvision import beside a CPU-only torch (the tests' setup; see docs/trainers.md).

PyPI's torchvision wheel for Linux x86_64 is built against the CUDA torch: its `_C.so` links libtorch_cuda.so
and libc10_cuda.so, which a CPU torch does not have, and there is no CPU torchvision wheel on PyPI. torchvision
catches that load failure (`extension._has_ops()` is then False) and guards its other meta registrations with
it, but `_meta_registrations.py` registers fake kernels for `torchvision::nms` and `torchvision::qnms` without
the guard, so `import torchvision` raises "operator torchvision::nms does not exist", and with it every
import of timm, transformers and lightning that pulls torchvision in.

When (and only when) torchvision imports its `_meta_registrations` with `_C` unloaded, this defines the
schemas of those two operators, as `_C` would have, so the registrations succeed. The operators still have
no kernel: calling them raises, as torchvision's other compiled ops do without `_C` (`_assert_has_ops`).
Nothing else is touched; a process that never imports torchvision never imports torch here.

Installed by `python tests/frameworks/install_cpu_hooks.py` (a .pth file in site-packages).
"""

from __future__ import annotations

import importlib.abc
import sys

_TRIGGER = "torchvision._meta_registrations"
_SCHEMAS = (  # as torchvision/csrc/ops/nms.cpp and quantized/cpu/qnms_kernel.cpp declare them
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list = []  # a torch.library.Library's definitions live as long as the object


class _DefineMissingOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == _TRIGGER and not _libraries:
            import torch
            import torchvision.extension  # imported by torchvision/__init__ just before the trigger

            if not torchvision.extension._has_ops():
                library = torch.library.Library("torchvision", "FRAGMENT")
                for schema in _SCHEMAS:
                    library.define(schema)
                _libraries.append(library)
        return None  # the normal finders load the module


def install() -> None:
    if not any(isinstance(finder, _DefineMissingOps) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DefineMissingOps())


install()
