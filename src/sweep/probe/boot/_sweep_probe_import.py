"""One sys.meta_path finder that runs a callback once a named module has finished importing: sitecustomize.py arms
the probe on `torch` with it, and the probe (_sweep_probe_modules.py) watches `torch._dynamo` with it. It imports
nothing itself, runs nothing until that module is imported, and then leaves sys.meta_path. Stdlib only."""

import sys


class AfterImport:
    """Calls `then(module)` once `name` has finished importing, after leaving sys.meta_path; `then` must not raise
    (its owner records its own failure: the user's import must stand)."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        for finder in [f for f in sys.meta_path if f is not self]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        after = self

        class _Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                module.__spec__.loader = module.__loader__ = loader  # the module sees its own loader
                loader.exec_module(module)
                after.remove()
                after.then(module)

            def __getattr__(self, attr):
                return getattr(loader, attr)

        spec.loader = _Loader()
        return spec
