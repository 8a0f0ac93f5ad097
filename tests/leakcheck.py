"""Test helpers for tests that run npurun or launcher.spawn: commands, and leak checks.

``LeakCheck`` tags every process a test starts with a marker environment variable (inherited by
npurun, its ranks, their children and the janitor) and, at the end, waits a bounded time for every
tagged process to be gone and for no new ``/dev/shm/npusim-<job>-*`` segment of the test's jobs to
remain. The test's jobs are the NPUSIM_JOB_ID values its tagged processes carry, sampled while the
test runs: other suites or jobs running on the machine at the same time create and remove
segments of their own, which are neither counted nor touched.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid

from launcher.procs.env import PACKAGE_ROOT
from launcher.procs.shm import SHM_DIR

MARKER = "NPUSIM_TEST_MARKER"


def _proc_environ(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def tagged_pids(tag: str, jobs: set[str] | None = None) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``NPUSIM_TEST_MARKER=tag``; the
    NPUSIM_JOB_ID of each tagged process (live or not) is added to ``jobs`` when given."""
    needle = f"{MARKER}={tag}".encode()
    me = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        env = _proc_environ(pid).split(b"\0")
        if needle in env:
            if jobs is not None:
                jobs.update(v[len(_JOB_KEY):].decode(errors="replace") for v in env
                            if v.startswith(_JOB_KEY))
            if not _is_zombie(pid):
                out.append(int(pid))
    return out


_JOB_KEY = b"NPUSIM_JOB_ID="


def shm_segments() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith("npusim-")}
    except FileNotFoundError:
        return set()


def pid_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    return not os.path.exists(f"/proc/{pid}") or _is_zombie(str(pid))


def wait_for(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a true value (returned) or raise AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class LeakCheck:
    """Context manager: ``env`` to pass to the processes of the test; asserts nothing leaks."""

    def __init__(self, grace: float = 5.0):
        self.tag = uuid.uuid4().hex
        self.grace = grace
        self.env = dict(os.environ)
        self.env[MARKER] = self.tag
        parts = [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if PACKAGE_ROOT not in parts:
            parts.insert(0, PACKAGE_ROOT)
        self.env["PYTHONPATH"] = os.pathsep.join(parts)

    def __enter__(self) -> "LeakCheck":
        self._shm_before = shm_segments()
        self.jobs: set[str] = set()         # NPUSIM_JOB_ID of the test's processes
        if self.env.get("NPUSIM_JOB_ID"):
            self.jobs.add(self.env["NPUSIM_JOB_ID"])
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="leakcheck", daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        """Learn the test's job ids while it runs (a rank lives far longer than one period)."""
        while not self._done.wait(0.2):
            tagged_pids(self.tag, self.jobs)

    def leftovers(self) -> tuple[list[int], set[str]]:
        pids = tagged_pids(self.tag, self.jobs)
        prefixes = tuple(f"npusim-{j}-" for j in self.jobs)
        segs = {n for n in shm_segments() - self._shm_before if n.startswith(prefixes)}
        return pids, segs

    def __exit__(self, exc_type, *_):
        self._done.set()
        self._sampler.join()
        deadline = time.monotonic() + self.grace
        while True:
            pids, segs = self.leftovers()
            if not pids and not segs:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for pid in pids:  # do not let one test's leak break the next ones
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for name in segs:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
        if exc_type is None:
            cmds = {p: _cmdline(p) for p in pids}
            raise AssertionError(f"leaked processes {cmds} and shared memory {sorted(segs)}")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def npurun_cmd(*args: str) -> list[str]:
    """``python -m launcher ARGS...`` with this interpreter."""
    return [sys.executable, "-m", "launcher", *map(str, args)]


def run_npurun(*args: str, env: dict, cwd: str | None = None, timeout: float = 60,
               ) -> subprocess.CompletedProcess:
    """Run npurun to completion, capturing its stdout and stderr as text."""
    return subprocess.run(npurun_cmd(*args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def start_npurun(*args: str, env: dict, cwd: str | None = None) -> subprocess.Popen:
    """Start npurun in the background with text pipes (for signal tests and multi-node)."""
    return subprocess.Popen(npurun_cmd(*args), env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def reaped(procs: list[subprocess.Popen] | None = None):
    """A block that owns the processes of ``procs`` (a new empty list to append to by default),
    given as the ``as`` target: on leaving the block, normally or by an error (a ``communicate``
    timeout, a failed start), each one still running is killed and waited for, 10 s at most."""
    procs = [] if procs is None else procs
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
