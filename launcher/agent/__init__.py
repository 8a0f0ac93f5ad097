"""The agent: one per node, as torch elastic's; it joins the job's rendezvous, starts this
node's ranks (``start``, the launch policy ``schedwatch``), supervises, stops and restarts them
(``supervisor``, ``attempts``), and runs the diagnosis hooks (``api``: the data model and the
hooks' contract; ``diagnose``: the hang, deadlock and fail-slow watch and the job verdict, in
the words of ``launcher.diagnosis``).

``from launcher.agent import Agent, WorkerSpec`` works as it did when this was one module; the
names load on first use (PEP 562), so ``launcher.agent.schedwatch`` alone stays light.
"""
from __future__ import annotations

from runtime.aliases import bind

_EXPORTS = {"Agent": "supervisor", "RunResult": "api", "StopRequest": "api", "Worker": "api",
            "WorkerSpec": "api", "WorkerState": "api", "say": "api"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return bind(globals(), name, mod)
