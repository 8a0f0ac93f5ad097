"""Is a peer's process still alive? Its identity (pid and start time) and a check that needs no help
from the peer.

A rank publishes ``identity()`` (``"<pid>:<start time>"``) at init; a rank of the same node (same
``runtime.ipc.node_id``: the same npurun node, on the same boot and pid namespace) keeps a
``PeerProcess`` for it and asks ``gone()`` while it waits for that peer. A rank of another npurun
node is watched through its link only (heartbeats), even when its pid is visible here, as it
would be on a cluster. The start time (clock ticks since boot, field 22 of
``/proc/<pid>/stat``) tells a reused pid from the original process. A stopped process (SIGSTOP)
is alive: only exit (or a zombie waiting to be reaped) counts as gone.
"""
from __future__ import annotations

import os


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of ``pid`` from /proc, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def identity() -> str:
    """This process as ``"<pid>:<start time>"`` (start time 0 without procfs)."""
    st = _stat(os.getpid())
    return f"{os.getpid()}:{st[1] if st else 0}"


class PeerProcess:
    """A peer process on this node, named by its ``identity()`` text."""

    __slots__ = ("pid", "start")

    def __init__(self, ident: str):
        pid, _, start = ident.partition(":")
        if not (pid.isdigit() and start.isdigit()) or int(pid) <= 0:
            raise ValueError(f"a process identity is '<pid>:<start time>', got {ident!r}")
        self.pid, self.start = int(pid), int(start)

    def gone(self) -> str | None:
        """Why the process is gone ("pid N has exited"), or None while it runs (or is stopped)."""
        st = _stat(self.pid)
        if st is None:
            return f"its process (pid {self.pid}) has exited"
        state, start = st
        if self.start and start != self.start:
            return f"its process (pid {self.pid}) has exited (the pid now names another process)"
        if state in ("Z", "X"):
            return f"its process (pid {self.pid}) has exited"
        return None
