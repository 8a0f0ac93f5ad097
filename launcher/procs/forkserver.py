"""The fork server: the ranks of a node forked from one prepared process.

    python -u -m launcher.worker --fork-server FD PAD   (started by npurun; FD: its end of a
                                                        socketpair; PAD: room for its ranks'
                                                        command lines, see below)

Design note. A rank started as a fresh interpreter imports numpy, pyzmq, runtime and hccl itself:
0.2-0.3 s of CPU per rank (1 s before ml_dtypes became lazy), paid N times on a node with two
cores. The fork server imports them once (``PRELOAD``, more with NPUSIM_FORKSERVER_PRELOAD), then
forks one child per rank on request; the child becomes the rank exactly as
``python -u -m launcher.worker ARGS`` would (``launcher.worker.main``), with its own environment,
session, standard streams and working directory, and shares the imported pages copy-on-write.

What a rank owns is made after the fork, never inherited: the server runs no thread (checked
before every fork), creates no ZeroMQ context, no runtime context, no socket but its channel to
npurun (closed in the child); the imports it does create none of these (they are made on first
use). In the child: the environment becomes the rank's, in ``os.environ`` and the C library and, so
that ``/proc/PID/environ`` (what ``ps e`` and leak checks read) shows it too, in the block the
kernel points at: the server was started with ``ROOM_VAR`` padding that block, and the child
writes its own variables over it (as setproctitle does with the same area; moving the block
itself takes ``prctl(PR_SET_MM)``, which needs CAP_SYS_RESOURCE). The command line is done the
same way: the server is started with PAD, an argument as long as its ranks' lines (``title_room``
in ``procs.forkclient``), rewrites its own to ``... --fork-server FD`` at once, and each rank
writes ``python -u SCRIPT ARGS`` over the inherited area (``proctitle.show_command``: no
dependency, no privilege; setproctitle does the same). The signal dispositions the
server changed go back to Python's defaults,
``random`` is reseeded by CPython's fork hook and numpy's global generator, if imported, from
the OS; the npusim loggers, whose rank tag was made at import, are set up again.

How a forked rank ends (``run_rank``): as Python does (non-daemon threads joined, the atexit
handlers run, the standard streams flushed) but without tearing the interpreter down module by
module: that teardown decrements the reference count of every object the server imported, which
writes to (so copies) every page the rank shares with the server: 2.4 s of a world-64 job's 6 s
on two cores went there. Like multiprocessing's forked children, the rank then ends with
``os._exit`` and the status Python would have given it, after flushing the files the rank
opened and never closed (the teardown would have); other ``__del__`` methods of objects alive
at the end do not run (Python does not promise they would; NPUSIM_FORKSERVER=0 runs them). ``gc.freeze()`` before each fork
keeps the rank's own collections off the inherited objects (the same copying; CPython's advice
for fork servers).

Processes: npurun starts the server in its own session with the parent-death signal
(SIGKILL when npurun dies); each rank sets its own (``launcher.worker``), so it dies with the
server. The server reaps its children: when one exits it SIGKILLs the child's process group
first (the zombie still pins the group id, as ``launcher.procs.proc`` does for its own children),
then reaps it and reports the status to npurun. npurun signals the ranks' groups directly and
watches them with pidfds.

Protocol (a SOCK_SEQPACKET socketpair, one JSON object per message, never pickle):
    npurun -> server: {"op": "spawn", "id", "argv", "env", "cwd", "core", "batch"}
                      + 2 fds (the rank's stdout, stderr)
                      {"op": "bye"}
    server -> npurun: {"op": "ready", "pid", "preloaded", "seconds"}
                      {"op": "spawned", "id", "pid"} | {"op": "error", "id", "message"}
                      {"op": "exit", "pid", "status"}   (status as Popen's returncode)
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from launcher import config
from launcher.procs.proctitle import memory_area, show_command

# What a rank of an npusim job imports (measured with sys.modules at a collective's end).
PRELOAD = ("numpy", "zmq", "runtime.array", "runtime.context", "runtime.memory",
           "runtime.stream", "runtime.event", "runtime.kernels", "hccl.init", "hccl.comm",
           "hccl.collectives", "hccl.store", "hccl.transport", "hccl.diag", "hccl.flight",
           "launcher.worker")
_MAX_MSG = 1 << 20
# the variable whose value pads the server's environment block, room for a rank's own variables
ROOM_VAR = "NPUSIM_FORKSERVER_ROOM"
_PR_SET_PDEATHSIG = 1


def send_message(sock: socket.socket, msg: dict, fds=()) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv_message(sock: socket.socket) -> tuple[dict | None, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


# -- the server --------------------------------------------------------------------------------
class _Server:
    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def preload(self, names) -> list[str]:
        done = []
        for name in names:
            try:
                importlib.import_module(name)
                done.append(name)
            except Exception as e:  # the rank meets the same error itself, with its traceback
                sys.stderr.write(f"npurun: fork server: preloading {name} failed: {e!r}\n")
        return done

    def serve(self):
        """Answer requests until ``bye`` or npurun's end; in a forked child, return its request
        (the child leaves this loop and becomes the rank)."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll(1000):
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self.reap()
                    continue
                msg, fds = recv_message(self.sock)
                if msg is None or msg.get("op") == "bye":
                    self.finish()
                    return None
                if msg.get("op") == "spawn":
                    child = self.spawn(msg, fds)
                    if child is not None:
                        return child
            self.reap()

    def spawn(self, msg: dict, fds: list[int]):
        if threading.active_count() != 1:   # a thread would be lost in the child, its locks held
            for fd in fds:
                os.close(fd)
            send_message(self.sock, {"op": "error", "id": msg.get("id"),
                              "message": f"the fork server runs {threading.active_count()} "
                                         "threads; it forks only with one"})
            return None
        gc.freeze()     # what it imported stays off the ranks' collections (module docstring)
        pid = os.fork()
        if pid == 0:
            gc.enable()
            return msg, fds
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        send_message(self.sock, {"op": "spawned", "id": msg.get("id"), "pid": pid})
        return None

    def reap(self) -> None:
        while self.children:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            try:
                os.killpg(pid, signal.SIGKILL)   # its group, while the zombie still pins the id
            except (ProcessLookupError, PermissionError):
                pass
            _, status = os.waitpid(pid, 0)
            self.children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            try:
                send_message(self.sock, {"op": "exit", "pid": pid, "status": code})
            except OSError:
                pass

    def finish(self) -> None:
        """npurun said bye (or vanished): no child outlives the server."""
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()


def _become_rank(server: _Server, msg: dict, fds: list[int]) -> list[str]:
    """In the forked child: make it the rank ``msg`` describes; return the worker's argv."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out, err = fds
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (null, out, err, server.wake_r, server.wake_w):
        if fd > 2:
            os.close(fd)
    server.sock.close()
    _place(msg.get("core"), bool(msg.get("batch")))
    config.replace_environment(msg["env"])
    _show_environment(msg["env"])
    os.chdir(msg["cwd"])
    if "numpy.random" in sys.modules:       # else every rank would draw the same numbers
        sys.modules["numpy.random"].seed()
    _reset_loggers()
    return list(msg["argv"])


def _place(core, batch: bool) -> None:
    """npurun's launch policy for this rank (runtime/sched.py): a fresh interpreter would have
    inherited it from npurun's forking thread; a forked rank takes it here."""
    try:
        if core is not None:
            os.sched_setaffinity(0, {int(core)})
        if batch and hasattr(os, "SCHED_BATCH"):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:             # a sandbox may forbid it: the rank runs unplaced
        pass


def room(env: dict) -> str:
    """The value of ``ROOM_VAR`` for a server started with ``env``: room enough for a rank's
    environment, which differs from ``env`` by a few of npurun's per-rank values."""
    size = sum(len(k) + len(v) + 2 for k, v in env.items())
    return "." * max(4096, size // 4)


def _show_environment(env: dict) -> bool:
    """Write ``env`` over the inherited environment block (see the module docstring): safe once
    ``os.environ`` was replaced, since the C library's ``environ`` then points at copies, never
    into the block. False (the block left as it was) when the block is too small or unknown."""
    block = memory_area("env")
    data = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
    if block is None or len(data) > block[1] - block[0]:
        return False
    ctypes.memmove(block[0], data.ljust(block[1] - block[0], b"\0"), block[1] - block[0])
    return True


def _reset_loggers() -> None:
    """The npusim loggers tagged their lines with the server's rank at import."""
    import logging  # noqa: PLC0415
    from runtime import log  # noqa: PLC0415
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            ours = [h for h in logger.handlers if log.is_ours(h)]
            for h in ours:
                logger.removeHandler(h)
            if ours:
                log.setup(name)


def _die_with_launcher() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    expected = config.launcher_pid()
    if expected is not None and os.getppid() != expected:
        os._exit(128 + signal.SIGKILL)          # npurun died before the prctl above


_BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)   # text first: it feeds
_ending: list[int] = []     # in a forked rank whose code ended: the status Python would give


def run_rank(run, argv: list[str]) -> None:
    """In a forked rank: ``run(argv)`` (the worker bootstrap), noting how it ended for
    ``_end_rank``, which ends the process after the atexit handlers instead of tearing the
    interpreter down. Exceptions propagate: Python prints them as usual."""
    try:
        run(argv)
    except SystemExit as e:     # Python's rule: None -> 0, an int -> it, else printed -> 1
        code = e.code
        _ending.append(0 if code is None else code if isinstance(code, int) else 1)
        raise
    except KeyboardInterrupt:   # Python then dies by SIGINT itself
        _ending.append(-signal.SIGINT)
        raise
    except BaseException:
        _ending.append(1)
        raise
    _ending.append(0)


def _end_rank() -> None:
    """The last atexit handler of a forked rank (registered before anything else in the server):
    flush, collect the script's garbage, and end without the interpreter's teardown."""
    if not _ending:     # the server itself, or a rank that ended outside run_rank: as usual
        return
    code = _ending[-1]
    # The atexit handlers before this one may have undone what the rank's daemon threads use
    # (weakref.finalize unmaps shared memory): keep the GIL from them until the end.
    sys.setswitchinterval(60.0)
    gc.collect()        # the rank's own objects only (the inherited ones are frozen)
    # the teardown would have flushed the files the script left open (an object an atexit
    # handler refers to is never garbage): flush the rank's own, then the standard streams
    # (concrete types: an isinstance against the io ABCs is slow, and every moment here is
    # one where the rank's daemon threads run on while the atexit handlers undid their state)
    files = [o for gen in range(3) for o in gc.get_objects(gen) if isinstance(o, _BUFFERED)]
    for stream in (*files, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code & 0xFF)


def main(argv: list[str]) -> list[str]:
    """Serve npurun until it asks for a rank; in the forked rank, return the rank's worker
    arguments (launcher.worker, the caller, runs them); exit when npurun closes the server."""
    if len(argv) not in (1, 2) or not argv[0].isdigit():
        sys.exit("usage: python -m launcher.worker --fork-server FD [PAD] (started by npurun)")
    _die_with_launcher()
    if len(argv) == 2:      # PAD was room for the ranks' command lines: not to be shown
        orig = list(sys.orig_argv)
        show_command(orig[:orig.index("--fork-server") + 2])
    atexit.register(_end_rank)      # first registered: runs after every other handler
    gc.disable()                    # no collection leaves holes in the pages the ranks share
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # npurun stops it; a Ctrl-C goes to npurun
    server = _Server(int(argv[0]))
    t0 = time.perf_counter()
    from launcher.config import fork_server_preload  # noqa: PLC0415
    done = server.preload([*PRELOAD, *fork_server_preload()])
    send_message(server.sock, {"op": "ready", "pid": os.getpid(), "preloaded": done,
                        "seconds": round(time.perf_counter() - t0, 3)})
    got = server.serve()
    if got is None:
        sys.exit(0)
    worker_argv = _become_rank(server, *got)
    del server, got
    return worker_argv
