"""A rank's stack dump on demand (launcher.worker, launcher.procs.stacks): it never kills the rank.

faulthandler's dump from the C signal handler reads the other threads' frames while they run; a
program whose threads start and end as it dumps died by SIGSEGV in 4 of 29 signals here. The
worker dumps from a Python handler instead (the main thread, holding the GIL), and falls back to
faulthandler's C dump (SIGUSR2) only for a main thread stuck in C.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from launcher.procs import stacks
from tests.leakcheck import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# threads that start and end all the time, and threads running Python, beside a main thread that
# waits in short sleeps: what crashed faulthandler's C dump
CHURN = """
import threading, time
def churn(n):
    return churn(n - 1) + 1 if n else 0
def busy():
    while True:
        churn(30)
        sum(i for i in range(10))
        time.sleep(0)
def spawner():
    while True:
        t = threading.Thread(target=churn, args=(20,))
        t.start()
        t.join()
for f in (busy, busy, spawner):
    threading.Thread(target=f, daemon=True).start()
def main_waits_in_user_code():
    open({ready!r}, "w").close()
    while True:
        time.sleep(0.001)
main_waits_in_user_code()
"""

# the main thread stuck in a C call that holds the GIL (a mutex locked twice through PyDLL): no
# Python handler can run, so only the SIGUSR2 fallback answers
STUCK_IN_C = """
import ctypes
def stuck_in_c():
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)       # PTHREAD_MUTEX_INITIALIZER: all zeros
    libc.pthread_mutex_lock(mutex)
    open({ready!r}, "w").close()
    libc.pthread_mutex_lock(mutex)                # a default mutex: deadlocks, GIL held
stuck_in_c()
"""


class _Proc:
    """What stacks.collect needs of a worker."""

    def __init__(self, p: subprocess.Popen):
        self.p, self.rank = p, 0

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal_process(self, sig: int) -> bool:
        try:
            self.p.send_signal(sig)
            return True
        except ProcessLookupError:
            return False


def _start(tmp_path, program: str, *, end: bool = False):
    ready = str(tmp_path / "ready")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(program.format(ready=ready)))
    stack_file = str(tmp_path / "stacks.txt")
    env = dict(os.environ, NPUSIM_STACK_FILE=stack_file, PYTHONPATH=ROOT)
    env.pop("NPUSIM_LAUNCHER_PID", None)
    p = subprocess.Popen([sys.executable, "-u", "-m", "launcher.worker", str(script)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if not end:
        wait_for(lambda: os.path.exists(ready) or p.poll() is not None, 30, what="the rank starts")
        assert p.poll() is None, p.stderr.read().decode()
    return p, stack_file


@pytest.mark.timeout(120)
def test_dumps_of_a_rank_whose_threads_start_and_end_never_kill_it(tmp_path):
    p, stack_file = _start(tmp_path, CHURN)
    try:
        w = _Proc(p)
        for i in range(150):
            got = stacks.collect([(w, stack_file)], timeout=5)[0]
            assert p.poll() is None, f"the rank died by signal {-p.returncode} at dump {i}"
            assert "Current thread" in got and "main_waits_in_user_code" in got, got
            # the other threads are in it too: the busy ones at least
            assert got.count("Thread 0x") >= 2 and " in busy" in got, got
    finally:
        p.kill()
        p.wait(10)
        p.stderr.close()


@pytest.mark.timeout(60)
def test_a_main_thread_stuck_in_c_answers_through_the_fallback(tmp_path):
    p, stack_file = _start(tmp_path, STUCK_IN_C)
    try:
        got = stacks.collect([(_Proc(p), stack_file)], timeout=3)[0]
        assert p.poll() is None
        assert "stuck_in_c" in got, got
    finally:
        p.kill()
        p.wait(10)
        p.stderr.close()


@pytest.mark.timeout(60)
def test_a_request_while_the_rank_exits_does_not_pass_for_a_signal_death(tmp_path):
    """SIGUSR1 right up to the rank's exit: the interpreter's finalization would put a Python
    handler back to SIGUSR1's default action (death); the worker ignores it from its exit on.
    The requests are paced (one per 0.5 ms): a flood keeps a rank on a loaded machine in its
    handler, dumping, and it never reaches its exit."""
    for _ in range(5):
        p, _ = _start(tmp_path, "import time\ntime.sleep(0.2)\n", end=True)
        wait_for(lambda: os.path.exists(tmp_path / "stacks.txt") or p.poll() is not None, 30,
                 what="the handlers are in place")
        while p.poll() is None:
            try:
                p.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        assert p.wait(10) == 0, p.stderr.read().decode()
        p.stderr.close()
        os.unlink(tmp_path / "stacks.txt")


@pytest.mark.timeout(60)
def test_a_program_the_worker_execs_is_never_sent_a_stack_signal(tmp_path):
    """``npurun --no-python``: after exec the program has neither handler (exec resets them to
    the default action, which kills), so its stack file is withdrawn and npurun does not ask."""
    stack_file = str(tmp_path / "stacks.txt")
    env = dict(os.environ, NPUSIM_STACK_FILE=stack_file, PYTHONPATH=ROOT)
    env.pop("NPUSIM_LAUNCHER_PID", None)
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-m", "launcher.worker", "--exec", "sh", "-c",
                          f"touch {ready}; exec sleep 60"], env=env)
    try:
        wait_for(lambda: ready.exists() or p.poll() is not None, 30, what="the program starts")
        got = stacks.collect([(_Proc(p), stack_file)], timeout=2)[0]
        assert got.startswith("<no stack dump"), got
        assert p.poll() is None
    finally:
        p.kill()
        p.wait(10)
