"""torch_npu's run-time options: ``set_option``, ``set_compile_mode``, ``torch.npu.config``.

On an Ascend NPU these steer CANN (torch_npu/npu/npu_config.py): whether operators are compiled
just in time (``jitCompile``), whether tensors may take NPU-private layouts
(``ALLOW_INTERNAL_FORMAT``), and the like. npusim runs torch's CPU kernels on plain (ND) storage,
so no option changes a number or a layout here: they are recorded, as torch_npu records them, and
``get_option`` / ``is_jit_compile_false`` read them back. Training scripts set them at start-up
(ModelZoo's ``torch_npu.npu.set_compile_mode(jit_compile=False)`` and
``torch.npu.config.allow_internal_format = False``); they run unchanged.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_options: dict[str, str] = {}


def set_option(option: dict) -> None:
    """``torch.npu.set_option({"NAME": "value", ...})``: record each option (no effect here)."""
    if not isinstance(option, dict):
        raise TypeError(f"torch.npu.set_option takes a dict of option names to values, "
                        f"got {type(option).__name__}")
    with _lock:
        for k, v in option.items():
            _options[str(k)] = str(v)


def get_option(name: str):
    """The value last set for option ``name`` (a str), or None (torch_npu's ``_npu_getOption``)."""
    with _lock:
        return _options.get(name)


def set_compile_mode(jit_compile: bool = False) -> None:
    """Record the operator compile mode. torch_npu first synchronizes the device if it is
    initialized; here: if the thread has chosen one (a script calling this first picks none)."""
    import runtime
    from runtime.errors import ContextError
    try:
        runtime.get_device()
    except ContextError:
        pass
    else:
        runtime.synchronize()
    set_option({"jitCompile": "enable" if jit_compile else "disable"})


def is_jit_compile_false() -> bool:
    """True when ``set_compile_mode(jit_compile=False)`` (or the option) was set."""
    return get_option("jitCompile") == "disable"


class _NpuConfig:
    """``torch.npu.config``: ``config.allow_internal_format = False`` sets ALLOW_INTERNAL_FORMAT.

    torch_npu's object only takes assignments; this one also reads the value back (None before
    any assignment). Other names raise AttributeError rather than being dropped silently.
    """

    _NAMES = {"allow_internal_format": "ALLOW_INTERNAL_FORMAT"}

    def __setattr__(self, name, value):
        if name not in self._NAMES:
            raise AttributeError(f"torch.npu.config has no option '{name}' "
                                 f"(known: {', '.join(sorted(self._NAMES))})")
        set_option({self._NAMES[name]: "enable" if value else "disable"})

    def __getattr__(self, name):
        if name not in self._NAMES:
            raise AttributeError(f"torch.npu.config has no option '{name}'")
        v = get_option(self._NAMES[name])
        return None if v is None else v == "enable"


config = _NpuConfig()
