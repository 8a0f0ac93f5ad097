"""torch.npu.mstx: msTX markers and ranges as spans in npusim's trace.

torch_npu's ``mstx`` sends markers to msprof. Here a range (``range_start`` / ``range_end``,
``range_push`` / ``range_pop``, ``mstx.annotate`` / ``mstx_range``) becomes a span on the host
track of npusim's trace (runtime/profiler.py, as ``runtime.profiler.range``), named by its
message, and ``mark`` a zero-length span in the category ``mark``: what ``npurun --profile`` and
``torch_npu.profiler.profile`` record shows them next to the device work. Without a recording
they cost nothing. As torch_npu's, a bad argument warns and the call does nothing (it returns
-1 or 0 where torch_npu does); ``stream=`` is accepted (the span is the host's either way) and
``domain`` is kept in the span's args.
"""
from __future__ import annotations

import functools
import itertools
import threading
import warnings

from runtime import profiler as _prof

__all__ = ["mstx", "annotate"]

_lock = threading.Lock()
_open: dict[int, tuple] = {}            # range id -> (message, domain, start us)
_ids = itertools.count(1)
_tls = threading.local()                # .stack: {domain: [(message, start us)]}


def _ok(message, domain, what: str) -> bool:
    if not message or not isinstance(message, str):
        warnings.warn(f"Invalid message for mstx.{what}: provide a non-empty message string")
        return False
    if not domain or not isinstance(domain, str):
        warnings.warn(f"Invalid domain for mstx.{what}: provide a domain string")
        return False
    return True


def _span(message: str, domain: str, t0: float, t1: float, cat: str = "range") -> None:
    if _prof.on:
        _prof.record(_prof.HOST_TRACK, message, cat, t0, t1,
                     None if domain == "default" else {"domain": domain})


class mstx:
    """``torch_npu.npu.mstx`` (``torch.npu.mstx``): static methods, as torch_npu's class."""

    @staticmethod
    def mark(message: str, stream=None, domain: str = "default") -> None:
        """A zero-length span named ``message`` at this instant."""
        if _ok(message, domain, "mark"):
            t = _prof.now_us()
            _span(message, domain, t, t, cat="mark")

    @staticmethod
    def range_start(message: str, stream=None, domain: str = "default") -> int:
        """Open a range; returns its id for ``range_end`` (0 on a bad argument, as torch_npu)."""
        if not _ok(message, domain, "range_start"):
            return 0
        with _lock:
            rid = next(_ids)
            _open[rid] = (message, domain, _prof.now_us())
        return rid

    @staticmethod
    def range_end(range_id: int, domain: str = "default") -> None:
        """Close the range ``range_start`` returned ``range_id`` for."""
        if not isinstance(range_id, int) or isinstance(range_id, bool):
            warnings.warn("Invalid range id for mstx.range_end: pass what range_start returned")
            return
        with _lock:
            rec = _open.pop(range_id, None)
        if rec is None:
            warnings.warn(f"mstx.range_end: no open range with id {range_id}")
            return
        _span(rec[0], rec[1], rec[2], _prof.now_us())

    @staticmethod
    def range_push(message: str, stream=None, domain: str = "default") -> int:
        """Open a range on this thread's stack for ``domain``; returns the depth (-1 if bad)."""
        if not _ok(message, domain, "range_push"):
            return -1
        stacks = getattr(_tls, "stack", None)
        if stacks is None:
            stacks = _tls.stack = {}
        st = stacks.setdefault(domain, [])
        st.append((message, _prof.now_us()))
        return len(st) - 1

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        """Close this thread's innermost range of ``domain``; returns the depth (-1 if none)."""
        st = (getattr(_tls, "stack", None) or {}).get(domain)
        if not st:
            warnings.warn(f"mstx.range_pop: no range pushed on domain {domain!r}")
            return -1
        message, t0 = st.pop()
        _span(message, domain, t0, _prof.now_us())
        return len(st)

    @staticmethod
    def mstx_range(message: str, stream=None, domain: str = "default"):
        """A decorator: each call of the function is a range named ``message``."""
        def wrapper(func):
            @functools.wraps(func)
            def inner(*args, **kwargs):
                rid = mstx.range_start(message, stream, domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    mstx.range_end(rid, domain)
            return inner
        return wrapper


class annotate:
    """``with mstx.annotate("name"):`` / ``@mstx.annotate("name")``: a range over the block."""

    def __init__(self, message: str = "", stream=None, domain: str = "default"):
        self.message, self.stream, self.domain = message, stream, domain
        self.range_id = None

    def __enter__(self):
        self.range_id = mstx.range_start(self.message, self.stream, self.domain)
        return self

    def __exit__(self, *exc):
        if self.range_id:
            mstx.range_end(self.range_id, self.domain)
        self.range_id = None
        return False

    def __call__(self, func):
        message = self.message or func.__name__

        @functools.wraps(func)
        def inner(*args, **kwargs):
            rid = mstx.range_start(message, self.stream, self.domain)
            try:
                return func(*args, **kwargs)
            finally:
                mstx.range_end(rid, self.domain)
        return inner


mstx.annotate = annotate
