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

import enum
import os
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


# --- the rest of torch_npu's npu_config: recorded, read back, no effect on numbers here ---

CUBE_CORES, VECTOR_CORES = 24, 48        # a 910B1's AI cores: what the limits default to


class CubeMathType(enum.IntEnum):
    """``torch.npu.matmul.cube_math_type`` values (torch_npu's _CubeMathType)."""
    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3
    USE_FP32_ADD = 4
    FORCE_GRP_ACC_FOR_FP32 = 4


def set_aoe(dump_path) -> None:
    """Record AOE auto-tuning (``autotune``) with its dump directory, made if missing."""
    if not isinstance(dump_path, (str, os.PathLike)):
        raise TypeError(f"set_aoe: dump_path must be a path, got {type(dump_path).__name__}")
    os.makedirs(dump_path, exist_ok=True)
    set_option({"autotune": "enable", "autotunegraphdumppath": os.fspath(dump_path)})


_mm_bmm_nd = [True]


def set_mm_bmm_format_nd(is_nd: bool = True) -> None:
    """Record whether mm / bmm keep the ND layout (always, here)."""
    _mm_bmm_nd[0] = bool(is_nd)


def get_mm_bmm_format_nd() -> bool:
    return _mm_bmm_nd[0]


class _AllowHF32:
    """``torch.npu.matmul`` / ``torch.npu.conv``: ``allow_hf32`` (and matmul's
    ``cube_math_type``) set and read back as torch_npu's options. npusim computes fp32 in fp32
    whatever they say (HF32 is a CANN cube-unit mode)."""

    def __init__(self, option: str, default: bool, cube: bool):
        object.__setattr__(self, "_option", option)
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_cube", cube)

    def __setattr__(self, name, value):
        if name == "allow_hf32":
            if not isinstance(value, bool):
                raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}")
            set_option({self._option: "enable" if value else "disable"})
        elif name == "cube_math_type" and self._cube:
            if not isinstance(value, CubeMathType):
                raise TypeError("value should be one of Enum CubeMathType when setting "
                                f"cube_math_type, but got {type(value).__name__}")
            set_option({"CUBE_MATH_TYPE": str(int(value))})
        else:
            raise AttributeError(f"no option '{name}' here (allow_hf32"
                                 f"{', cube_math_type' if self._cube else ''})")

    def __getattr__(self, name):
        if name == "allow_hf32":
            v = get_option(self._option)
            return self._default if v in (None, "") else v == "enable"
        if name == "cube_math_type" and self._cube:
            v = get_option("CUBE_MATH_TYPE")
            return CubeMathType(int(v)) if v else None
        raise AttributeError(name)


matmul = _AllowHF32("ALLOW_MATMUL_HF32", False, cube=True)
conv = _AllowHF32("ALLOW_CONV_HF32", True, cube=False)

_device_limits: dict = {}
_stream_limits: dict = {}


def _limit_dict(rec: dict | None) -> dict:
    rec = rec or {}
    return {"cube_core_num": rec.get("cube", CUBE_CORES),
            "vector_core_num": rec.get("vector", VECTOR_CORES)}


def _check_cores(cube_num, vector_num) -> None:
    for name, v, most in (("cube_num", cube_num, CUBE_CORES), ("vector_num", vector_num,
                                                               VECTOR_CORES)):
        if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or 1 <= v <= most):
            raise ValueError(f"{name} must be -1 (unchanged) or 1..{most} (a 910B1's cores), "
                             f"got {v!r}")


def _set_limit(table: dict, key, cube_num: int, vector_num: int) -> None:
    """Record the limits other than -1 for ``key`` (a device or a stream); under ``_lock``."""
    rec = table.setdefault(key, {})
    if cube_num != -1:
        rec["cube"] = cube_num
    if vector_num != -1:
        rec["vector"] = vector_num


def set_device_limit(device, cube_num: int = -1, vector_num: int = -1) -> None:
    """Record a core limit for ``device`` (read back by get_device_limit; npusim's kernels do not
    use cores). torch_npu allows one call per process; so does this."""
    from runtime.torch import device as _device
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int, but got {type(device).__name__}")
    d = _device.check_index(device)
    _check_cores(cube_num, vector_num)
    with _lock:
        if _device_limits.get("called"):
            raise RuntimeError("Function 'set_device_limit' has already been called, You can "
                               "only set this interface once.")
        _device_limits["called"] = True
        _set_limit(_device_limits, d, cube_num, vector_num)


def get_device_limit(device) -> dict:
    """``{"cube_core_num": n, "vector_core_num": m}`` for ``device`` (a 910B1's 24 / 48 unless
    set_device_limit lowered them)."""
    from runtime.torch import device as _device
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int, but got {type(device).__name__}")
    return _limit_dict(_device_limits.get(_device.check_index(device)))


def _stream_key(stream):
    from .streams import Stream
    if stream is None:
        raise ValueError("stream cannot be None")
    if not isinstance(stream, Stream):
        raise TypeError(f"stream should be torch_npu.npu.Stream, could not be {type(stream)}")
    return stream.npu_stream.id


def set_stream_limit(stream, cube_num: int = -1, vector_num: int = -1) -> None:
    """Record a core limit for ``stream`` (read back by get_stream_limit)."""
    k = _stream_key(stream)
    _check_cores(cube_num, vector_num)
    with _lock:
        _set_limit(_stream_limits, k, cube_num, vector_num)


def reset_stream_limit(stream) -> None:
    with _lock:
        _stream_limits.pop(_stream_key(stream), None)


def get_stream_limit(stream) -> dict:
    return _limit_dict(_stream_limits.get(_stream_key(stream)))
