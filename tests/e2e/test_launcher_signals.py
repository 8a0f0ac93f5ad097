"""Signals to npurun: SIGINT / SIGTERM / SIGHUP are forwarded and npurun exits 128 + signal;
a SIGKILLed npurun still takes its ranks, their children and its shared memory with it."""
from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from tests.leakcheck import LeakCheck, pid_gone, start_npurun, wait_for

# Each rank starts a child (`sleep`) in its process group, creates a segment, writes its pid and
# its child's pid, then sleeps; a SIGINT shows up as KeyboardInterrupt, which it reports.
SLEEPER = """
import os, subprocess, sys, time
out = {out!r}
r = os.environ["RANK"]
child = subprocess.Popen(["sleep", "120"])
open(f"/dev/shm/npusim-{{os.environ['NPUSIM_JOB_ID']}}-s{{r}}", "w").write("x")
open(os.path.join(out, f"errfile.{{r}}"), "w").write(os.environ["TORCHELASTIC_ERROR_FILE"])
with open(os.path.join(out, f"pids.{{r}}.tmp"), "w") as f:
    f.write(f"{{os.getpid()}} {{child.pid}}")
os.replace(os.path.join(out, f"pids.{{r}}.tmp"), os.path.join(out, f"pids.{{r}}"))
try:
    time.sleep(120)
except KeyboardInterrupt:
    print(f"rank {{r}} got KeyboardInterrupt", flush=True)
    raise
"""


def start(tmp_path, lc, nproc=2):
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(SLEEPER.format(out=str(tmp_path))))
    p = start_npurun("--nproc-per-node", str(nproc), str(script), env=lc.env)
    files = [tmp_path / f"pids.{r}" for r in range(nproc)]
    wait_for(lambda: all(f.exists() for f in files) or p.poll() is not None, 30,
             what="ranks to start")
    assert p.poll() is None, p.communicate()
    return p, [int(x) for f in files for x in f.read_text().split()]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_is_forwarded_and_npurun_exits_128_plus_signal(tmp_path, sig):
    with LeakCheck() as lc:
        lc.env["NPUSIM_STOP_GRACE"] = "60"
        p, procs = start(tmp_path, lc)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=90)
        elapsed = time.monotonic() - t0
        assert all(pid_gone(pid) for pid in procs), "a rank or its child survived"
    assert p.returncode == 128 + sig, err
    assert f"{signal.Signals(sig).name} received" in err
    assert elapsed < 55  # the ranks obey the forwarded signal: no SIGKILL after the 60 s grace
    if sig == signal.SIGINT:
        assert "[rank 0]: rank 0 got KeyboardInterrupt" in out
        assert "[rank 1]: rank 1 got KeyboardInterrupt" in out


@pytest.mark.timeout(150)
def test_sigkilled_npurun_takes_ranks_children_and_shm_along(tmp_path):
    with LeakCheck() as lc:
        p, procs = start(tmp_path, lc)
        # no --log-dir: the error and stack files live in a temporary directory
        temp_root = (tmp_path / "errfile.0").read_text().split("/attempt_0/")[0]
        assert os.path.isdir(temp_root)
        p.kill()
        p.communicate(timeout=10)
        wait_for(lambda: all(pid_gone(pid) for pid in procs), 30,
                 what="ranks and their children to die with npurun")
        wait_for(lambda: not os.path.exists(temp_root), 30, what="the janitor to remove "
                 + temp_root)
    # LeakCheck also found no tagged process and no leftover /dev/shm/npusim-* segment
