"""npusim's launcher: ``npurun`` (torchrun's flags) and ``launcher.spawn`` (torch's mp.spawn).

Kept import-light: every rank imports this package before its own code runs
(``python -m launcher.worker``), so the public names load on first use. ``spawn`` lives in
``launcher.spawning``: a submodule named ``spawn`` would shadow the function on first import.

Rooms (torch.distributed.elastic's): ``procs`` (the ranks' processes), ``agent`` (a node's
supervisor), ``diagnosis`` (verdict, reports, live status), ``profile`` (a profiled job's
summary); the entry points, the job's rendezvous, config and errors stay here. Old module paths
are aliases, not files: ``import launcher.forkserver`` gives ``launcher.procs.forkserver``
itself, the same object, imported when first asked for (``_MOVED``, served by runtime's one
alias finder, ``runtime/aliases.py``).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys


def _alias_finder():
    """``runtime.aliases`` (standard library only), without running ``runtime``'s package: a
    rank imports this package before its own code, and ``import runtime`` would set up the
    runtime's logging there (tests/unit/test_env_table.py keeps ``runtime`` out of a rank's
    bootstrap). ``runtime/__init__`` later finds the same module in ``sys.modules``."""
    name = "runtime.aliases"
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "runtime", "aliases.py")
    if name not in sys.modules and not os.path.exists(path):    # installed apart: the usual way
        importlib.import_module(name)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_aliases = _alias_finder()

__all__ = ["spawn", "errors"]

# old path -> the module's path now, both relative to this package
_MOVED = {
    "env": "procs.env", "forkclient": "procs.forkclient", "forkserver": "procs.forkserver",
    "janitor": "procs.janitor", "output": "procs.output", "proc": "procs.proc",
    "proctitle": "procs.proctitle", "shm": "procs.shm", "stacks": "procs.stacks",
    "diagnose": "agent.diagnose", "failslow": "diagnosis.failslow",
    "report": "diagnosis.report", "status": "diagnosis.status", "summary": "diagnosis.summary",
    "verdict": "diagnosis.verdict",
    "attempts": "agent.attempts", "entrycheck": "agent.entrycheck",
    "schedwatch": "agent.schedwatch",
    "fluctuation": "profile.fluctuation", "profparts": "profile.parts",
    "profsummary": "profile.summary", "tracemerge": "profile.tracemerge",
}
_aliases.install(__name__, _MOVED)


def __getattr__(name: str):
    if name == "spawn":
        from launcher.spawning import spawn
        return spawn
    if name == "errors":
        import launcher.errors as errors
        return errors
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
