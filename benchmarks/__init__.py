"""npusim's benchmarks and test harnesses, kept out of the installed packages.

Run them from the repository root: ``python -m benchmarks.compare`` (npusim next to gloo and
Open MPI; ``bash benchmarks/compare.sh`` sets the peers up first and writes docs/figures.md),
``python -m benchmarks.stress``, ``npurun ... -m benchmarks.soak``, ``python -m benchmarks.ceiling``,
``npurun ... -m benchmarks.percall`` (a small call taken apart), ``bash benchmarks/ab.sh OLD NEW``
(two checkouts alternated: did a change move the speed?).
The peers' own programs are in benchmarks/peers/.
"""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_env(base: dict | None = None, **extra: str) -> dict:
    """``base`` (os.environ) plus ``extra``, with the repository root first on PYTHONPATH: the
    ranks npurun starts import ``benchmarks`` and this checkout's packages whatever their cwd."""
    env = dict(os.environ if base is None else base, **extra)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + parts)
    return env
