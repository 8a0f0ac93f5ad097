"""Worker processes: start, wait, signal and stop them as process groups.

Each worker runs in its own session (``start_new_session=True``), so its pid is also its process
group id and a signal to the group reaches whatever it forked. Processes are started from the
calling thread, which must outlive them (the parent-death signal follows the forking thread):
npurun starts them from its main thread, ``launcher.spawn`` from the thread blocked in it.

Waiting polls a pidfd per worker (woken the moment a worker exits, no sleeping loop). When a
worker has exited, its group is swept with SIGKILL *before* it is reaped, while the zombie still
pins the group id, so no leftover child survives and no reused pid can be hit.

A worker may instead be forked by the node's fork server (``launcher.procs.forkserver``, given to
``start``): it is then the server's child, not ours. We still signal its group and wake on its
pidfd; the server sweeps the group and reaps it, and its exit status comes from the server's
report (``launcher.procs.forkclient``).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field

from launcher.procs.forkclient import readable, worker_argv  # noqa: F401 - also for the agent
from launcher.procs.janitor import Janitor
from launcher.procs.output import OutputPump, Std


@dataclass
class LogFiles:
    """Where one worker's files go: ``<attempt dir>/<local_rank>/...`` (torchrun's layout)."""

    dir: str
    stdout: str = field(init=False)
    stderr: str = field(init=False)
    error_file: str = field(init=False)
    stack_file: str = field(init=False)
    traceback_file: str = field(init=False)    # written by the rank (launcher.worker)

    def __post_init__(self) -> None:
        self.stdout = os.path.join(self.dir, "stdout.log")
        self.stderr = os.path.join(self.dir, "stderr.log")
        self.error_file = os.path.join(self.dir, "error.json")
        self.stack_file = os.path.join(self.dir, "stacks.txt")
        self.traceback_file = os.path.join(self.dir, "traceback.log")


class WorkerProcess:
    """One rank's OS process; ``returncode`` follows Popen (negative = killed by that signal)."""

    def __init__(self, cmd: list[str], env: dict[str, str], *, rank: int, local_rank: int,
                 files: LogFiles, redirect: Std = Std.NONE, tee: Std = Std.NONE,
                 console: bool = True):
        self.cmd, self.env = cmd, env
        self.rank, self.local_rank, self.files = rank, local_rank, files
        self.redirect, self.tee, self.console = redirect, tee, console
        self.popen: subprocess.Popen | None = None
        self.server = None                  # the ForkServer that forked it, if one did
        self._pending = None                # a fork asked for, not yet answered (finish_start)
        self._pid = -1
        self.pidfd: int | None = None
        self.returncode: int | None = None
        self.started_at = 0.0
        self.exited_at = 0.0

    @property
    def pid(self) -> int:
        return self._pid

    def start(self, pump: OutputPump, janitor: Janitor | None = None, server=None,
              placement: dict | None = None, *, wait: bool = True) -> None:
        """Start the process (forked by ``server``, a ``ForkServer``, when given and the command
        is the worker bootstrap, with ``placement``: ``core`` and ``batch``, npurun's launch
        policy); its pipes go to ``pump``, its group is registered with ``janitor``.
        ``wait=False``: a fork is only asked for; ``finish_start`` completes it (so a node's
        ranks are asked for before any answer is awaited: ``ForkServer.request``)."""
        os.makedirs(self.files.dir, exist_ok=True)
        # per stream: an open file (to the file only), (console name, tee file or None) for a
        # pipe the pump reads, or None (discarded)
        plans = []
        for bit, name, path in ((Std.OUT, "stdout", self.files.stdout),
                                (Std.ERR, "stderr", self.files.stderr)):
            if (self.redirect & bit and not self.tee & bit) or (self.tee & bit
                                                                 and not self.console):
                plans.append(open(path, "wb"))                       # file only
            elif self.tee & bit:
                plans.append((name, open(path, "wb")))               # pipe -> file + console
            else:
                plans.append((name, None) if self.console else None)  # pipe -> console
        argv = worker_argv(self.cmd) if server is not None else None
        if argv is not None:
            self._start_forked(server, argv, plans, pump, janitor, placement or {})
            if wait:
                self.finish_start()
            return
        kwargs = {}
        for slot, plan in zip(("stdout", "stderr"), plans):
            kwargs[slot] = subprocess.PIPE if isinstance(plan, tuple) else \
                (plan if plan is not None else subprocess.DEVNULL)
        try:
            self.popen = subprocess.Popen(
                self.cmd, env=self.env, stdin=subprocess.DEVNULL, start_new_session=True,
                close_fds=True, **kwargs)
        except BaseException:
            _close_plans(plans, tee_files=True)
            raise
        finally:
            _close_plans(plans)
        self._started(self.popen.pid, janitor)
        prefix = f"[rank {self.rank}]: "
        for pipe, plan in ((self.popen.stdout, plans[0]), (self.popen.stderr, plans[1])):
            if pipe is not None:
                name, logfile = plan
                fd = os.dup(pipe.fileno())
                pipe.close()
                pump.add(fd, prefix, name, logfile)

    def _start_forked(self, server, argv, plans, pump, janitor, placement: dict) -> None:
        ends = []          # per stream: (fd given to the child, our read end or None)
        try:
            for plan in plans:
                if isinstance(plan, tuple):
                    r, w = os.pipe()
                    ends.append((w, r))
                elif plan is not None:
                    ends.append((os.dup(plan.fileno()), None))
                else:
                    ends.append((os.open(os.devnull, os.O_WRONLY), None))
            rid = server.request(argv, self.env, ends[0][0], ends[1][0],
                                 core=placement.get("core"), batch=bool(placement.get("batch")))
        except BaseException:
            for child_end, ours in ends:
                os.close(child_end)
                if ours is not None:
                    os.close(ours)
            _close_plans(plans, tee_files=True)
            raise
        finally:
            _close_plans(plans)
        for child_end, _ in ends:
            os.close(child_end)         # the server holds its own copy
        self._pending = (server, rid, [(ours, plan) for (_, ours), plan in zip(ends, plans)],
                         pump, janitor)

    def finish_start(self) -> None:
        """Complete a start made with ``wait=False`` (nothing to do otherwise): wait for the
        fork server's answer. On ``ForkServerError`` the process was not started (its pipes
        are closed): ``start`` may be called again."""
        if self._pending is None:
            return
        server, rid, outs, pump, janitor = self._pending
        self._pending = None
        try:
            pid = server.result(rid)
        except BaseException:
            for ours, plan in outs:
                if ours is not None:
                    os.close(ours)
            _close_plans([plan for _, plan in outs], tee_files=True)
            raise
        self.server = server
        self._started(pid, janitor)
        prefix = f"[rank {self.rank}]: "
        for ours, plan in outs:
            if ours is not None:
                name, logfile = plan
                pump.add(ours, prefix, name, logfile)

    def _started(self, pid: int, janitor: Janitor | None) -> None:
        self._pid = pid
        self.started_at = time.time()
        if janitor is not None:
            janitor.watch_group(pid)
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def poll(self, janitor: Janitor | None = None) -> int | None:
        """Return the exit status if the process has ended (sweeping its group), else None."""
        if self.returncode is not None or self._pid < 0:
            return self.returncode
        if self.server is not None:
            code = self._forked_status(0.0)     # the server swept the group and reaped it
            return None if code is None else self._ended(code, janitor)
        try:
            info = os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # already reaped elsewhere: let Popen report
        if info is None:
            return None
        self._signal_group(signal.SIGKILL)  # the zombie still pins the group id
        return self._ended(self.popen.wait(), janitor)

    def _ended(self, code: int, janitor: Janitor | None) -> int:
        self.returncode = code
        self.exited_at = time.time()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if janitor is not None:
            janitor.forget_group(self._pid)
        return code

    def _forked_status(self, wait: float) -> int | None:
        """A forked worker's status, from the server's report: None while it runs. When its
        pidfd says it ended, the report follows at once (waited for up to 5 s); a dead server
        reports nothing: its children died by their parent-death signal (SIGKILL)."""
        srv = self.server
        srv.pump()
        if self._pid in srv.status:
            return srv.status.pop(self._pid)
        if self.pidfd is not None:
            ended = readable(self.pidfd, wait)
        else:
            ended = not _exists(self._pid)
        if not ended:
            return None
        code = srv.exit_status(self._pid, 5.0)
        if code is None and not srv.usable():
            code = -signal.SIGKILL
        if code is not None:
            srv.status.pop(self._pid, None)
        return code

    def wait_exit(self, janitor: Janitor | None = None, timeout: float = 30.0) -> None:
        """Wait until the worker has ended (after a SIGKILL), then reap it (``poll``)."""
        if self.server is None:
            try:  # SIGKILL cannot be refused; wait without reaping, so poll() can sweep the group
                os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            self.poll(janitor)
            return
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            code = self._forked_status(min(1.0, max(0.0, deadline - time.monotonic())))
            if code is not None:
                self._ended(code, janitor)

    def alive(self) -> bool:
        return self._pid > 0 and self.returncode is None

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self._pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the worker's process group; False if it is already gone."""
        if not self.alive():
            return False
        return self._signal_group(sig)

    def signal_process(self, sig: int) -> bool:
        """Send ``sig`` to the worker process alone (not its children)."""
        if not self.alive():
            return False
        try:
            os.kill(self._pid, sig)
            return True
        except ProcessLookupError:
            return False


class Waiter:
    """Sleeps until a worker exits, a wake-up fd is readable, or a timeout passes."""

    def __init__(self, wake_fds: tuple[int, ...] = ()):
        self._wake_fds = tuple(wake_fds)

    def wait(self, workers: list[WorkerProcess], timeout: float) -> None:
        """Block up to ``timeout`` s, returning early when any live worker exits."""
        # a fresh poll set each time: pidfds are closed (and their numbers reused) as workers end
        poller = select.poll()
        for fd in self._wake_fds:
            poller.register(fd, select.POLLIN)
        for w in workers:
            if w.alive() and w.pidfd is not None:
                poller.register(w.pidfd, select.POLLIN)
        if any(w.alive() and w.pidfd is None for w in workers):
            timeout = min(timeout, 0.05)  # no pidfd (old kernel): poll exits at 20 Hz
        for fd, _ in poller.poll(max(0, int(timeout * 1000))):
            if fd in self._wake_fds:
                try:
                    os.read(fd, 4096)
                except (BlockingIOError, OSError):
                    pass

    def close(self) -> None:
        pass


def reap(workers: list[WorkerProcess], janitor: Janitor | None = None) -> list[WorkerProcess]:
    """Poll every live worker; return those found exited by this call."""
    return [w for w in workers if w.alive() and w.poll(janitor) is not None]


def stop(workers: list[WorkerProcess], grace: float, sig: int = signal.SIGTERM,
         janitor: Janitor | None = None, waiter: Waiter | None = None,
         force=lambda: False) -> list[WorkerProcess]:
    """Stop every live worker: ``sig`` to each group, SIGKILL after ``grace`` s; wait for all.

    ``force()`` returning True (a second Ctrl-C) cuts the grace period short.
    Returns the workers that had to be SIGKILLed.
    """
    waiter = waiter or Waiter()
    reap(workers, janitor)
    for w in workers:
        w.signal_group(sig)
    deadline = time.monotonic() + grace
    while any(w.alive() for w in workers):
        left = deadline - time.monotonic()
        if left <= 0 or force():
            break
        waiter.wait(workers, left)
        reap(workers, janitor)
    killed = [w for w in workers if w.alive()]
    for w in killed:
        w.signal_group(signal.SIGKILL)
    for w in killed:
        w.wait_exit(janitor)
    return killed


def _close_plans(plans, tee_files: bool = False) -> None:
    """Close our copies of the files opened for a worker's streams (the child has its own);
    with ``tee_files``, the tee files too (the start failed: no pump will own them)."""
    for plan in plans:
        if isinstance(plan, tuple):
            if tee_files and plan[1] is not None:
                plan[1].close()
        elif plan is not None:
            plan.close()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
