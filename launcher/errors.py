"""Exceptions of the launcher (npurun and launcher.spawn).

Every class carries its facts as attributes and pickles cleanly (``__reduce__`` rebuilds it from
those attributes), so an error raised in one process can be shipped to another.
"""
from __future__ import annotations

import signal as _signal


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number with no name."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(exitcode: int | None) -> str:
    """``exited with code 7``, ``killed by SIGKILL`` (a Popen-style return code: negative = signal),
    or ``alive`` for None: the one wording of every launcher message and report."""
    if exitcode is None:
        return "alive"
    if exitcode < 0:
        return f"killed by {signal_name(-exitcode)}"
    return f"exited with code {exitcode}"


def shell_exit_code(exitcode: int) -> int:
    """The code a shell reports for a Popen return code: 128 + signal number for a signal."""
    return 128 - exitcode if exitcode < 0 else exitcode


class LauncherError(Exception):
    """Base class of every launcher error."""


class ConfigError(LauncherError):
    """Invalid flags or environment (bad --redirects map, missing secret, bad SLURM env...)."""


class RendezvousError(LauncherError):
    """The nodes of a job could not agree (store unreachable, node rank taken, nproc differs)."""


class RendezvousTimeoutError(RendezvousError):
    """Some nodes never registered with the job's store before the connect timeout."""

    def __init__(self, missing: list[int], nnodes: int, timeout: float, hint: str = ""):
        self.missing = list(missing)
        self.nnodes = nnodes
        self.timeout = timeout
        self.hint = hint
        ranks = ", ".join(str(r) for r in self.missing)
        noun = "node" if len(self.missing) == 1 else "nodes"
        msg = (f"{noun} {ranks} of {nnodes} never arrived within {timeout:g} s "
               f"(HCCL_CONNECT_TIMEOUT): start `npurun --nnodes {nnodes} --node-rank <i> ...` "
               f"on every node with the same --master-addr/--master-port")
        super().__init__(msg + (f"; {hint}" if hint else ""))

    def __reduce__(self):
        return type(self), (self.missing, self.nnodes, self.timeout, self.hint)


class WorkerFailedError(LauncherError):
    """A rank of ``launcher.spawn`` failed; the other ranks were stopped.

    Attributes: ``rank``, ``exitcode`` (Popen style: negative for a signal), ``traceback`` (the
    rank's Python traceback text, "" if it died without one), ``message`` (one line).
    """

    def __init__(self, rank: int, exitcode: int, traceback: str = "", message: str = ""):
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = traceback
        self.message = message or f"rank {rank} {describe_exit(exitcode)}"
        text = f"rank {rank} failed ({describe_exit(exitcode)}): {self.message}"
        if traceback:
            text += "\n\n" + "\n".join("  " + ln for ln in traceback.rstrip().splitlines())
        super().__init__(text)

    def __reduce__(self):
        return type(self), (self.rank, self.exitcode, self.traceback, self.message)


class ProcessRaisedError(WorkerFailedError):
    """A rank of ``launcher.spawn`` raised an exception; ``traceback`` holds its Python traceback."""


class ProcessExitedError(WorkerFailedError):
    """A rank of ``launcher.spawn`` exited non-zero or was killed by a signal without a Python
    exception (``os._exit(3)``, SIGKILL, segfault)."""


class SpawnTimeoutError(LauncherError):
    """``launcher.spawn(timeout=...)`` ran out; ``stacks`` maps each live rank to its Python stacks
    taken just before the ranks were stopped."""

    def __init__(self, timeout: float, pending: list[int], stacks: dict[int, str] | None = None):
        self.timeout = timeout
        self.pending = list(pending)
        self.stacks = dict(stacks or {})
        text = (f"spawn timed out after {timeout:g} s; ranks {self.pending} were still running "
                f"and have been stopped")
        for rank in sorted(self.stacks):
            text += f"\n\n--- stacks of rank {rank} ---\n{self.stacks[rank].rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return type(self), (self.timeout, self.pending, self.stacks)


class Interrupted(LauncherError):
    """npurun received SIGINT / SIGTERM / SIGHUP while it was waiting (rendezvous, restart)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal_name(signum)}")

    def __reduce__(self):
        return type(self), (self.signum,)
