"""npusim runtime: one simulated Ascend NPU per process (pyACL semantics, Pythonic names).

Devices and contexts, streams and events, the caching memory pool, copies, kernels and
profiling (docs/runtime.md, docs/memory.md). Every error is a ``runtime.errors.NpuError`` with
an ACL ``code``.

Design note. Names are imported lazily (PEP 562), as in ``hccl``: ``import runtime`` costs a
few milliseconds, and numpy and the modules behind a name load when the name is first used
(``runtime.sched`` and ``runtime.config``, what npurun needs, pull in neither; ml_dtypes loads
only with a bfloat16 / float8 dtype: runtime/dtypes.py). Two public names are also submodules:
``runtime.stream()`` and ``runtime.graph()`` (context managers) beside the modules
``runtime.stream`` and ``runtime.graph``. Imported eagerly, the function won by import order;
imported lazily, the import system binds the module over the name whenever the submodule loads.
So those two modules are made callable when they bind (``_Package.__setattr__``): calling one
calls the function, and ``from . import graph`` inside runtime still gets the module.
"""
from __future__ import annotations

import importlib
import types

from . import aliases as _aliases
from . import config as _config
from . import hooks as _hooks
from .log import setup as _setup_log

_EXPORTS = {
    "DeviceArray": "array", "as_dtype": "array", "empty": "array", "to_device": "array",
    "zeros": "array",
    "current_stream": "context", "default_stream": "context", "device_count": "context",
    "get_device": "context", "get_mem_info": "context", "reset_device": "context",
    "set_device": "context", "stream": "context", "synchronize": "context",
    "NpuError": "errors", "Event": "event", "Graph": "graph", "graph": "graph",
    "launch": "kernels", "launch_callback": "kernels", "read_only": "kernels",
    "DevicePtr": "memory", "HostBuffer": "memory", "MemcpyKind": "memory",
    "buffer_nbytes": "memory", "empty_cache": "memory", "free": "memory", "free_host": "memory",
    "host_view": "memory", "malloc": "memory", "malloc_host": "memory",
    "max_memory_allocated": "memory", "max_memory_reserved": "memory", "memcpy": "memory",
    "memcpy_async": "memory", "memory_allocated": "memory", "memory_reserved": "memory",
    "memory_snapshot": "memory", "memory_stats": "memory", "memory_summary": "memory",
    "memset": "memory", "memset_async": "memory", "record_stream": "memory", "reset_peak_memory_stats": "memory",
    "set_per_process_memory_fraction": "memory",
    "MemMallocPolicy": "memory", "profile": "profiler",
    "declare_access": "sanitizer", "enable_stream_check": "sanitizer",
    "stream_check_enabled": "sanitizer",
    "Stream": "stream",
}
_CALLABLE_MODULES = {"stream": "context", "graph": "graph"}   # module name -> its function's
# old module path -> the module's path now: ``import runtime.<old>`` gives the moved module itself
# (runtime/aliases.py, the one finder, which hccl's old paths use too)
_MOVED: dict[str, str] = {
    **{m: f"memory.{m}" for m in ("blocks", "card", "device_memory", "free_lists", "front_cache",
                                  "ipc", "pool", "pool_args", "stats")},  # the memory room
    "acl_codes": "acl.codes", "acl_data": "acl.data", "acl_mdl": "acl.capture",
    "acl_ptr": "acl.pointers",                                        # the acl room
}
_aliases.install(__name__, _MOVED)

__all__ = sorted([*_EXPORTS, "errors"])


class _CallableModule(types.ModuleType):
    """``runtime.stream`` / ``runtime.graph``: the module, and, called, the public function."""

    def __call__(self, *args, **kwargs):
        short = self.__name__.rpartition(".")[2]
        owner = importlib.import_module(f"{__package__ or 'runtime'}.{_CALLABLE_MODULES[short]}")
        return getattr(owner, short)(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _CALLABLE_MODULES and type(value) is types.ModuleType:
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


def __getattr__(name: str):
    if name in _CALLABLE_MODULES:
        return importlib.import_module(f"{__name__}.{name}")   # binds it: see _Package
    mod = _EXPORTS.get(name)
    if mod is None:
        try:                     # a submodule: runtime.memory, runtime.sched, ...
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return _aliases.bind(globals(), name, mod)


def __dir__():
    return __all__


import sys as _sys  # noqa: E402 - after the class it installs

_sys.modules[__name__].__class__ = _Package
_setup_log("runtime")


def _profile_env(device_id: int) -> None:
    """NPUSIM_PROFILE_DIR's trace of this process starts with its first device context
    (``hooks.context_created``; runtime/profiler.py's ``env_profile`` says why not at import)."""
    _hooks.context_created.remove(_profile_env)     # once, as env_profile: the first context
    if _config.profile_dir():
        from .profiler import env_profile
        env_profile()


_hooks.context_created.append(_profile_env)
if _config.stream_check() != "off":
    from .sanitizer import enable_stream_check as _enable
    _enable(_config.stream_check())
