"""npurun's side of the fork server (``procs.forkserver``): start it, ask it for ranks, learn
how they ended.

The ranks are the server's children, not npurun's: npurun signals their process groups itself,
wakes on their pidfds, and takes their exit status from the server's ``exit`` reports (the
server sweeps a rank's group and reaps it). ``ForkServer.usable()`` is False once the server
died: the agent then starts a new one for the next attempt, or falls back to fresh interpreters.
"""
from __future__ import annotations

import math
import os
import select
import socket
import subprocess
import time

from launcher.procs.forkserver import ROOM_VAR, recv_message, room, send_message

PRELOAD_VAR = "NPUSIM_FORKSERVER_PRELOAD"
WINDOW = 32         # spawn requests in flight at most (``request``)
PAD_MAX = 128 * 1024 - 1    # the kernel's limit on one argument (MAX_ARG_STRLEN)


class ForkServerError(RuntimeError):
    """The fork server could not start or answer (npurun then starts fresh interpreters)."""


class ForkServer:
    """One node's fork server, started with ``env`` (a rank's environment) by ``python``."""

    def __init__(self, python: str, env: dict, janitor=None, *, timeout: float = 120.0,
                 should_stop=lambda: False, preload=(), title_room: int = 0):
        """``preload``: more modules to import (before NPUSIM_FORKSERVER_PRELOAD's);
        ``title_room``: the length of the ranks' command lines (``launcher.worker``'s
        ``show_command`` writes them over the server's own, padded to at least this, 4 KiB at
        least; a longer line is cut)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(env)
        if preload:
            env[PRELOAD_VAR] = ",".join([*preload, env.get(PRELOAD_VAR, "")]).strip(",")
        env[ROOM_VAR] = room(env)           # room for each rank's /proc/PID/environ
        self.sock = ours
        self.status: dict[int, int] = {}       # pid -> returncode (Popen's convention)
        self._replies: list[dict] = []
        self._next = 0                          # spawn requests sent
        self._answered = 0                      # and answered
        try:
            self.proc = subprocess.Popen(
                [python, "-u", "-m", "launcher.worker", "--fork-server", str(theirs.fileno()),
                 "." * min(max(4096, title_room), PAD_MAX)],
                env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                start_new_session=True, close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if janitor is not None:
            janitor.watch_group(self.proc.pid)
        try:
            ready = self._wait_for(lambda m: m.get("op") == "ready", timeout, should_stop)
        except BaseException:
            self.close()
            raise
        self.preloaded = ready.get("preloaded", [])
        self.import_seconds = float(ready.get("seconds", 0.0))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def usable(self) -> bool:
        return self.proc.poll() is None

    def _read(self, timeout: float) -> bool:
        """Read one message within ``timeout`` s; exits go to ``status``, the rest are kept."""
        if not readable(self.sock.fileno(), timeout):
            return False
        try:
            msg, fds = recv_message(self.sock)
        except OSError as e:    # ECONNRESET: the server died with our message unread
            raise ForkServerError(f"the fork server (pid {self.proc.pid}) is gone: {e} "
                                  f"(exit code {self.proc.poll()})") from e
        for fd in fds:
            os.close(fd)
        if msg is None:
            raise ForkServerError(f"the fork server (pid {self.proc.pid}) closed its channel "
                                  f"(exit code {self.proc.poll()})")
        if msg.get("op") == "exit":
            self.status[int(msg["pid"])] = int(msg["status"])
        else:
            if msg.get("op") in ("spawned", "error"):
                self._answered += 1
            self._replies.append(msg)
        return True

    def _wait_for(self, match, timeout: float, should_stop=lambda: False) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self._replies):
                if match(m):
                    return self._replies.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server (pid {self.proc.pid}) did not answer "
                                      f"within {timeout:g} s")
            if should_stop():
                raise ForkServerError("stopped while waiting for the fork server")
            if self.proc.poll() is not None and not self._read(0):
                raise ForkServerError(f"the fork server (pid {self.proc.pid}) exited with "
                                      f"{self.proc.returncode}")
            self._read(min(left, 0.2))

    def pump(self) -> None:
        """Take every report the server has sent (non-blocking)."""
        try:
            while self._read(0):
                pass
        except ForkServerError:
            pass

    def spawn(self, argv: list[str], env: dict, out_fd: int, err_fd: int, *,
              core: int | None = None, batch: bool = False, timeout: float = 60.0) -> int:
        """Fork a rank running ``python -m launcher.worker ARGV`` with ``env`` (bound to
        ``core``, in SCHED_BATCH if ``batch``: npurun's launch policy); its pid."""
        return self.result(self.request(argv, env, out_fd, err_fd, core=core, batch=batch,
                                        timeout=timeout), timeout)

    def request(self, argv: list[str], env: dict, out_fd: int, err_fd: int, *,
                core: int | None = None, batch: bool = False, timeout: float = 60.0) -> int:
        """``spawn``'s first half: ask for the rank and return the request's id at once, for
        ``result``. The fds may be closed on return (the message carried copies). Asking for
        every rank before waiting for any makes a world's start one pipeline instead of N round
        trips, each waiting for two processes to be scheduled (at world 256 on a loaded
        machine: 36 s to fork them one after the other). At most ``WINDOW`` requests are
        unanswered at a time, so neither side's socket buffer fills while it writes."""
        deadline = time.monotonic() + timeout
        while self._next - self._answered >= WINDOW:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server (pid {self.proc.pid}) did not answer "
                                      f"within {timeout:g} s")
            self._read(min(left, 0.2))
            if self.proc.poll() is not None and not readable(self.sock.fileno(), 0):
                raise ForkServerError(f"the fork server (pid {self.proc.pid}) exited with "
                                      f"{self.proc.returncode}")
        self._next += 1
        rid = self._next
        try:
            send_message(self.sock, {"op": "spawn", "id": rid, "argv": list(argv),
                                     "env": dict(env), "cwd": os.getcwd(), "core": core,
                                     "batch": batch}, (out_fd, err_fd))
        except OSError as e:
            raise ForkServerError(f"the fork server (pid {self.proc.pid}) is gone: {e}") from e
        return rid

    def result(self, rid: int, timeout: float = 60.0) -> int:
        """The pid of the rank asked for by ``request`` ``rid`` (waits up to ``timeout`` s)."""
        reply = self._wait_for(lambda m: m.get("id") == rid, timeout)
        if reply.get("op") != "spawned":
            raise ForkServerError(f"the fork server refused: {reply.get('message')}")
        return int(reply["pid"])

    def exit_status(self, pid: int, timeout: float) -> int | None:
        """The exit status of rank ``pid`` once the server reported it (waits up to
        ``timeout`` s), else None."""
        deadline = time.monotonic() + timeout
        while pid not in self.status:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self._read(min(left, 0.5))
            except ForkServerError:
                return self.status.get(pid)
        return self.status[pid]

    def close(self, timeout: float = 5.0) -> None:
        """Tell the server to end (it kills any child left) and reap it."""
        try:
            send_message(self.sock, {"op": "bye"})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` s (poll, not select: at world 256
    npurun holds more than 1024 descriptors, beyond select's reach)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0, math.ceil(timeout * 1000))))


def worker_argv(cmd: list[str]) -> list[str] | None:
    """The arguments of ``launcher.worker`` in ``cmd`` if ``cmd`` is ``PYTHON -u -m
    launcher.worker ARGS`` (what npurun runs); None otherwise (then no fork server)."""
    if len(cmd) >= 4 and cmd[1:4] == ["-u", "-m", "launcher.worker"]:
        return cmd[4:]
    return None


__all__ = ["ForkServer", "ForkServerError", "readable", "worker_argv"]
