"""The user's line that issued an npu operator: the first frame outside torch, npusim and
torch_npu (what TaskError and the stream sanitizer name)."""
from __future__ import annotations

import os
import sys

import torch

import runtime

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(runtime.__file__)))
_LIBRARY = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.abspath(runtime.__file__)) + os.sep,
            os.path.join(_ROOT, "torch_npu") + os.sep,
            os.path.join(_ROOT, "hccl") + os.sep)
_inside: dict = {}
_cache: dict = {}       # (code, offset) -> site; the code object is the key, so no id reuse


def user_site(skip: int = 2) -> str:
    """``file:line in function`` of the first frame outside the library folders."""
    f = sys._getframe(skip)
    while f is not None:
        code = f.f_code
        key = (code, f.f_lasti)
        site = _cache.get(key)
        if site is not None:
            return site
        name = code.co_filename
        inside = _inside.get(name)
        if inside is None:
            inside = _inside[name] = name.startswith(_LIBRARY) or name.startswith("<frozen")
        if not inside:
            if len(_cache) > 4096:
                _cache.clear()
            site = _cache[key] = f"{name}:{f.f_lineno} in {code.co_name}"
            return site
        f = f.f_back
    return "?"
