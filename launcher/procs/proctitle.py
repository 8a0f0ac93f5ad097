"""A process's command line and name as ``ps``, ``top`` and ``pgrep`` show them.

npurun's ranks are forks of the fork server (``python -u -m launcher.worker --fork-server FD
PAD``) or fresh interpreters of launcher.worker: each writes its own script and arguments over
that line, as torchrun's ranks show ``python train.py ...`` (launcher.worker.rank_command), and
the fork server restores its own line without the padding (procs.forkserver). Its own module
so that both import it and neither imports the other.
"""
from __future__ import annotations

import ctypes
import os

_PR_SET_NAME = 15
# /proc/self/stat's fields after the command name: arg_start, arg_end are fields 48, 49 of
# proc(5); env_start, env_end 50, 51
_AREAS = {"arg": 45, "env": 47}


def memory_area(kind: str) -> tuple[int, int] | None:
    """(start, end) of what the kernel shows as this process's command line (``"arg"``:
    /proc/self/cmdline) or its environment (``"env"``: /proc/self/environ); None where it is
    unknown (not Linux)."""
    first = _AREAS[kind]
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[first]), int(fields[first + 1])
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def show_command(line: list[str], title: str | None = None) -> bool:
    """Make ``ps`` show ``line`` as this process's command line, as a process started with it
    would (``/proc/PID/cmdline``: the strings separated by NULs), and ``title`` (cut to 15
    bytes) as its name (``/proc/PID/comm``: ``top``, ``ps -o comm``, ``pgrep`` without -f).

    The kernel reads the command line from the memory the arguments were passed in (arg_start
    to arg_end): ``line`` is written over it, the rest filled with NULs (which ``ps`` and
    ``pgrep`` drop). A line longer than that area is cut at its end (a forked rank's area is
    the fork server's, padded for its ranks' lines: ``launcher.procs.forkserver``). Python copied
    its arguments at start-up (``sys.argv``, ``sys.orig_argv``) and never reads the area
    again. False where there is no such area (not Linux)."""
    if title is not None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, os.fsencode(title)[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass
    area = memory_area("arg")
    if area is None:
        return False
    size = area[1] - area[0]
    data = b"".join(os.fsencode(a) + b"\0" for a in line)
    if len(data) > size:
        data = data[:size - 1] + b"\0"
    ctypes.memmove(area[0], data.ljust(size, b"\0"), size)
    return True
