"""npusim's launcher: ``npurun`` (torchrun's flags) and ``launcher.spawn`` (torch's mp.spawn).

Kept import-light: every rank imports this package before its own code runs
(``python -m launcher.worker``), so the public names load on first use. ``spawn`` lives in
``launcher.spawning``: a submodule named ``spawn`` would shadow the function on first import.
"""
from __future__ import annotations

__all__ = ["spawn", "errors"]


def __getattr__(name: str):
    if name == "spawn":
        from launcher.spawning import spawn
        return spawn
    if name == "errors":
        import launcher.errors as errors
        return errors
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
