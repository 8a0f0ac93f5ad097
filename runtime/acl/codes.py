"""pyACL's integer constants and return codes, and the mapping from npusim's exceptions to them.

The values are ACL's (acl_base.h, acl_rt.h and rt_error_codes.h). ``runtime.acl`` re-exports
every name here, so a pyACL script finds ``acl.ACL_MEMCPY_HOST_TO_DEVICE`` where it expects it.
"""
from __future__ import annotations

import logging
import threading

import numpy as np

from ..errors import NpuError

log = logging.getLogger("runtime.acl")
_errmsg = threading.local()

ACL_SUCCESS = 0

# acl_base.h
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_INTERNAL_ERROR = 500000

# rt_error_codes.h
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011
ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
ACL_ERROR_RT_STREAM_NO_CB_REG = 107015
ACL_ERROR_RT_INVALID_HANDLE = 107017
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_INTERNAL_ERROR = 507000
ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047

# aclrtMemcpyKind
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEFAULT = 4

# aclrtMemMallocPolicy
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_HUGE_ONLY = 1
ACL_MEM_MALLOC_NORMAL_ONLY = 2

# aclrtCallbackBlockType
ACL_CALLBACK_NO_BLOCK = 0
ACL_CALLBACK_BLOCK = 1

# aclrtEventStatus (query_event) and aclrtEventRecordedStatus (query_event_status): ACL numbers
# the two the opposite way round
ACL_EVENT_STATUS_COMPLETE = 0
ACL_EVENT_STATUS_NOT_READY = 1
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1

# aclrtCreateEventWithFlag flags
ACL_EVENT_SYNC = 0x1
ACL_EVENT_CAPTURE_STREAM_PROGRESS = 0x2
ACL_EVENT_TIME_LINE = 0x8

# aclrtRunMode
ACL_DEVICE = 0
ACL_HOST = 1

# aclrtMemAttr (get_mem_info): npusim reports its one memory, the device's HBM, for each
ACL_DEBUG = 0           # acl.app_log levels (aclLogLevel)
ACL_INFO = 1
ACL_WARNING = 2
ACL_ERROR = 3

ACL_DDR_MEM = 0
ACL_HBM_MEM = 1
ACL_DDR_MEM_HUGE = 2
ACL_DDR_MEM_NORMAL = 3
ACL_HBM_MEM_HUGE = 4
ACL_HBM_MEM_NORMAL = 5

__all__ = [k for k in list(globals()) if k.startswith("ACL_")]  # what ``acl`` re-exports
NAMES = {v: k for k, v in list(globals().items())
         if k.startswith("ACL_ERROR_") and isinstance(v, int)}
NAMES[ACL_SUCCESS] = "ACL_SUCCESS"


class AclError(Exception):
    """A failure the acl layer itself detects (bad handle, count > dest_max, ...), with its code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def code_of(exc: BaseException) -> int:
    """The ACL return code for an exception raised under an acl call.

    npusim's errors carry their ACL code; a Python ``TypeError`` / ``ValueError`` from a bad
    argument is a parameter error; anything else is an internal error (its traceback is logged).
    """
    if isinstance(exc, (AclError, NpuError)):
        return int(exc.code)
    if isinstance(exc, (TypeError, ValueError, OverflowError)):
        return ACL_ERROR_INVALID_PARAM
    if isinstance(exc, MemoryError):
        return ACL_ERROR_BAD_ALLOC
    return ACL_ERROR_INTERNAL_ERROR


# ---------------------------------------------------------------------- calling convention
def fail(api: str, exc: BaseException) -> int:
    """Log why ``api`` failed (the text also kept for get_recent_err_msg); return its code."""
    code = code_of(exc)
    msg = f"{api} failed, ret={code} ({NAMES.get(code, 'error')}): {exc}"
    _errmsg.text = msg
    if code == ACL_ERROR_INTERNAL_ERROR:
        log.error(msg, exc_info=exc)
    else:
        log.error(msg)
    return code


def returns_ret(api: str):
    """Decorate a call that returns nothing: it returns ACL_SUCCESS or the error code."""
    def deco(fn):
        def call(*args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                return fail(api, exc)
            return ACL_SUCCESS
        call.__name__, call.__doc__ = fn.__name__, fn.__doc__
        return call
    return deco


def returns_values(api: str, *on_fail):
    """Decorate a call that returns values: ``(*values, ret)``; ``(*fail, code)`` on failure."""
    def deco(fn):
        def call(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:
                return (*on_fail, fail(api, exc))
            return (*out, ACL_SUCCESS) if isinstance(out, tuple) else (out, ACL_SUCCESS)
        call.__name__, call.__doc__ = fn.__name__, fn.__doc__
        return call
    return deco


def int_arg(name: str, value) -> int:
    """``value`` as an int, or a parameter error naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise AclError(ACL_ERROR_INVALID_PARAM, f"{name}={value!r} must be an int")
    return int(value)


def get_recent_err_msg() -> str:
    """The text of this thread's most recent failed acl call ('' if none)."""
    return getattr(_errmsg, "text", "")


