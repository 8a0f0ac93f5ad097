"""Old import paths of moved modules, and the packages' lazy names: one finder for runtime and hccl.

``install("runtime", {"acl_mdl": "acl.mdl"})`` makes ``import runtime.acl_mdl`` give the module
``runtime.acl.mdl`` itself: the same object (so a patch or an isinstance check sees one module),
with ``__name__`` and ``__spec__.name`` its new path, imported when the old path is first asked
for. An old path no package declared still raises ``ModuleNotFoundError``. One finder serves every
package (``ALIASES``, old full path -> new full path); ``hccl`` declares its own moves through it
(hccl may import runtime, never the reverse).

``bind(namespace, name, module)`` is a package's PEP 562 ``__getattr__`` step: it imports the
submodule that defines ``name``, caches the value in the package's namespace and returns it.

Imports only the standard library: ``import hccl.store`` loads this module and the ``runtime``
package's own light ``config`` and ``log``, never numpy (tests/unit/test_call_path_imports.py).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

ALIASES: dict[str, str] = {}          # old full module path -> the full path it moved to


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of ``ALIASES`` as the module at its new path (the same object)."""

    def __init__(self, aliases: dict[str, str]):
        self.aliases = aliases

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.aliases:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(self.aliases[spec.name])
        spec.loader_state = module.__spec__     # the import system sets __spec__ to ``spec``
        return module

    def exec_module(self, module):              # the module at the new path ran already:
        module.__spec__ = module.__spec__.loader_state  # only its own spec is put back

    def get_code(self, fullname):
        """The code of the module at the new path: ``python -m OLD`` (runpy asks the loader
        for it) runs the moved module as ``__main__``, as ``python -m NEW`` does."""
        spec = importlib.util.find_spec(self.aliases[fullname])
        return spec.loader.get_code(spec.name)


def _finder() -> _Finder:
    """The one finder on ``sys.meta_path`` (kept, with its table, if this module is reloaded)."""
    for f in sys.meta_path:
        if type(f).__name__ == "_Finder" and type(f).__module__ == __name__:
            return f
    f = _Finder(ALIASES)
    sys.meta_path.append(f)
    return f


def install(package: str, moves: dict[str, str]) -> None:
    """Declare ``package``'s moved modules: ``{old: new}``, both relative to ``package``."""
    if not isinstance(package, str) or not package:
        raise TypeError(f"package must be a non-empty module name, got {package!r}")
    if not isinstance(moves, dict):
        raise TypeError(f"moves must be a dict {{old: new}}, got {type(moves).__name__}")
    table = _finder().aliases
    for old, new in moves.items():
        if not (isinstance(old, str) and isinstance(new, str) and old and new) or old == new:
            raise ValueError(f"moves: {old!r} -> {new!r} is not a move between two module names")
        table[f"{package}.{old}"] = f"{package}.{new}"


def bind(namespace: dict, name: str, module: str):
    """``namespace[name]`` from the submodule ``module`` of the package owning ``namespace``."""
    value = getattr(importlib.import_module(f"{namespace['__name__']}.{module}"), name)
    namespace[name] = value
    return value


ALIASES = _finder().aliases           # the table in use (the same dict unless reloaded)
