"""``acl.mdl``'s capture calls (CANN's aclmdlRICaptureBegin / aclmdlRICaptureEnd /
aclmdlRIExecuteAsync / aclmdlRIDestroy) over ``runtime.graph``, in pyACL's spelling.

A model run instance (``model_ri``) is an integer handle of a captured ``runtime.Graph``. The
capture mode is accepted and not used: npusim refuses the unsafe calls of the capturing thread
whatever the mode (docs/runtime.md, "Task graphs").
"""
from __future__ import annotations

import itertools

from . import codes as _c
from ..graph import Graph, graph
from .codes import AclError, returns_ret, returns_values
from .handles import stream_of as _stream

_captures: dict = {}         # Stream -> running graph() context
_models: dict = {}           # model_ri handle -> Graph
_next = itertools.count(0x7000)

ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0
ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL = 1
ACL_MODEL_RI_CAPTURE_MODE_RELAXED = 2


class _Mdl:
    """``acl.mdl``: capture a stream's tasks into a model run instance and execute it."""

    @returns_ret("aclmdlRICaptureBegin")
    def ri_capture_begin(stream, mode=ACL_MODEL_RI_CAPTURE_MODE_GLOBAL):
        """Start capturing the tasks issued on ``stream``."""
        s = _stream(stream)
        if s in _captures:
            raise AclError(_c.ACL_ERROR_INVALID_PARAM, f"{s.name} is capturing already")
        ctx = graph(Graph(), stream=s)
        ctx.__enter__()
        _captures[s] = ctx

    @returns_values("aclmdlRICaptureEnd", 0)
    def ri_capture_end(stream):
        """(model_ri, ret): end the capture begun on ``stream``."""
        s = _stream(stream)
        ctx = _captures.pop(s, None)
        if ctx is None:
            raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                           f"{s.name} is not capturing: call acl.mdl.ri_capture_begin first")
        ctx.__exit__(None, None, None)
        h = next(_next)
        _models[h] = ctx.g
        return h

    @returns_ret("aclmdlRIExecuteAsync")
    def ri_execute_async(model_ri, stream):
        """Enqueue the captured tasks on ``stream`` as one task."""
        _model(model_ri).replay(_stream(stream))

    @returns_ret("aclmdlRIDestroy")
    def ri_destroy(model_ri):
        """Forget a model run instance."""
        _model(model_ri)
        del _models[model_ri]


def _model(handle) -> Graph:
    g = _models.get(handle) if isinstance(handle, int) else None
    if g is None:
        raise AclError(_c.ACL_ERROR_RT_INVALID_HANDLE,
                       f"model_ri={handle!r} is not a live model run instance from "
                       "acl.mdl.ri_capture_end")
    return g


def clear() -> None:
    """Drop every capture and model (acl.finalize)."""
    for ctx in list(_captures.values()):
        try:
            ctx.__exit__(RuntimeError, None, None)
        except Exception:
            pass
    _captures.clear()
    _models.clear()


mdl = _Mdl
