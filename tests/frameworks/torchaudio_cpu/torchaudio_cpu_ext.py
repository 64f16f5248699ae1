"""Lets PyPI's torchaudio import beside a CPU-only torch (the tests' setup, for SpeechBrain; see docs/trainers.md).

SpeechBrain 1.1 requires torchaudio, and pip brings PyPI's torchaudio 2.11, the one wheel PyPI has for Linux
x86_64: it is built against the CUDA torch, its `lib/_torchaudio.abi3.so` links libc10_cuda.so, which a CPU torch
does not ship, so `import torchaudio` (and with it `import speechbrain`) raises `OSError: Could not load this
library: .../_torchaudio.abi3.so`. torchaudio's own loader (`torchaudio._extension.utils._load_lib`) already
runs without its compiled extension: where the library file is absent it returns False, and torchaudio then
leaves out the compiled ops (`_IS_TORCHAUDIO_EXT_AVAILABLE` False) and keeps everything written in Python
(transforms, functional, compliance.kaldi: what SpeechBrain's training uses).

When (and only when) torchaudio's loader fails because the library needs CUDA libraries this torch lacks
(torch.version.cuda is None and the load error names a CUDA library), this makes it answer as it does for an
absent file: False. Any other load failure is raised as before, and a torchaudio that loads is untouched; a
process that never imports torchaudio never imports torch here. The compiled ops (forced alignment, lfilter's
C++ loop, the CTC decoders) then raise as they do in any torchaudio built without them.

Installed by `python tests/frameworks/install_cpu_hooks.py` (a .pth file in site-packages).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TRIGGER = "torchaudio._extension.utils"  # defines _load_lib; torchaudio._extension's __init__ calls it at once


def _needs_missing_cuda(exc: BaseException) -> bool:
    import torch

    if torch.version.cuda is not None:
        return False
    messages = []
    while exc is not None and len(messages) < 5:
        messages.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return any("cuda" in m.lower() and ".so" in m for m in messages)


def _patch(utils) -> None:
    load = utils._load_lib

    def _load_lib(lib: str) -> bool:
        try:
            return load(lib)
        except OSError as exc:
            if _needs_missing_cuda(exc):
                return False  # as for a library file that is not there: torchaudio runs without its extension
            raise

    _load_lib.__doc__ = load.__doc__
    utils._load_lib = _load_lib


class _TolerateCudaBuild(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    if not any(isinstance(finder, _TolerateCudaBuild) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TolerateCudaBuild())


install()
