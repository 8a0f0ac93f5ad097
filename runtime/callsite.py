"""The user's call site (file:line in function) of a runtime call, skipping library frames."""
from __future__ import annotations

import os
import sys

_internal: list[str] = [os.path.dirname(os.path.abspath(__file__)) + os.sep]


def add_internal(path: str) -> None:
    """Treat frames from files under ``path`` as library frames (hccl registers itself)."""
    p = os.path.abspath(path).rstrip(os.sep) + os.sep
    if p not in _internal:
        _internal.append(p)


def callsite(skip: int = 2) -> str:
    """``file:line in function`` of the first frame outside the registered library folders."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return "?"
    internal = tuple(_internal)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(internal):
            return f"{fn}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "?"
