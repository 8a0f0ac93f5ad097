"""The agent's data model and its hooks' contract, as torch elastic's (agent/server/api.py).

A ``WorkerSpec`` says what the agent runs on its node and its policies; each local rank is a
``Worker`` with a ``WorkerState``; a job ends with a ``RunResult``. A diagnosis hook that wants
the job stopped returns a ``StopRequest``; ``say`` prints one of npurun's own messages.
"""
from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher import config
from launcher.procs.output import Std

if TYPE_CHECKING:
    from launcher.diagnosis.summary import ProcessFailure
    from launcher.procs.proc import WorkerProcess


class WorkerState(str, enum.Enum):
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"        # terminated by the launcher


@dataclass
class WorkerSpec:
    """What the agent runs on this node, and its policies."""

    cmd: list[str]
    nproc_per_node: int
    title: str = "npurun"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    stop_grace: float = 5.0
    log_dir: str | None = None          # None: a temporary directory, removed at exit
    redirects: Std | dict = Std.NONE
    tee: Std | dict = Std.NONE
    console_ranks: set | None = None    # --local-ranks-filter: local ranks shown on the console
    base_env: dict = field(default_factory=config.environment)


@dataclass
class Worker:
    local_rank: int
    rank: int
    proc: WorkerProcess
    state: WorkerState = WorkerState.INIT


@dataclass
class StopRequest:
    """Returned by an ``on_tick`` hook to stop the job: why, and the exit code to report."""

    message: str
    exitcode: int = 1


@dataclass
class RunResult:
    state: WorkerState
    exitcode: int                        # what npurun exits with
    attempt: int = 0
    failures: list[ProcessFailure] = field(default_factory=list)
    signum: int = 0
    message: str = ""


def say(text: str) -> None:
    """Print one of npurun's own messages (stderr, whole lines)."""
    try:
        sys.stderr.write(text.rstrip("\n") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
