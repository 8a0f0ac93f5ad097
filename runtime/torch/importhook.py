"""``when_imported(name, fn)``: run ``fn(module)`` once module ``name`` is imported.

npusim adapts two of torch's lazily imported parts without importing them (2-5 s each): Dynamo's
skip list and Inductor's compile_fx (both compile.py). When the module is already
imported, ``fn`` runs at once; otherwise a finder at the head of ``sys.meta_path`` waits for
that one name, lets the finders behind it find the module as they would, runs the module, then
``fn``, and removes itself.
"""
from __future__ import annotations

import importlib.abc
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        run = getattr(spec.loader, "exec_module", None)
        if run is None:
            return None
        fn = self.fn

        def exec_module(module):
            run(module)
            fn(module)
        spec.loader.exec_module = exec_module
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        return spec


def when_imported(name: str, fn) -> None:
    """``fn(module)`` now if ``name`` is imported, else right after its import (once)."""
    mod = sys.modules.get(name)
    if mod is not None:
        fn(mod)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, fn))
