"""npurun end to end, failing ranks: the failure summary, exit codes, stopping the others within
the grace period, no orphans, no shared memory left, and --max-restarts."""
from __future__ import annotations

import json
import textwrap
import time

import pytest

from tests import bounds
from tests.leakcheck import LeakCheck, pid_gone, run_npurun

# Every rank records its pid and creates a shared-memory segment of the job, then waits for all
# ranks to be up (files, no sleeps) before rank FAIL_RANK fails in the way argv[1] names.
FAILING = """
import os, signal, sys, time
out, how = {out!r}, sys.argv[1]
r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if how == "sigkill" and r != 1:  # the survivor refuses SIGTERM, from before rank 1 can fail
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(f"/dev/shm/npusim-{{os.environ['NPUSIM_JOB_ID']}}-test{{r}}", "w").write("x")
with open(os.path.join(out, f"pid.{{r}}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, f"pid.{{r}}.tmp"), os.path.join(out, f"pid.{{r}}"))
while not all(os.path.exists(os.path.join(out, f"pid.{{i}}")) for i in range(n)):
    time.sleep(0.01)

def fail_here():
    with open(os.path.join(out, "failed.tmp"), "w") as f:   # when the failure happened
        f.write(repr(time.time()))
    os.replace(os.path.join(out, "failed.tmp"), os.path.join(out, "failed"))
    if how == "raise":
        raise ValueError(f"boom from rank {{r}}")
    if how == "exit7":
        os._exit(7)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)

if r == 1:
    fail_here()
time.sleep(120)
"""


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def since_failure(tmp_path) -> float:
    """Seconds from rank 1's failure (the time it wrote) to now (npurun has just returned)."""
    return time.time() - float((tmp_path / "failed").read_text())


def pids(tmp_path, n: int) -> list[int]:
    return [int((tmp_path / f"pid.{r}").read_text()) for r in range(n)]


@pytest.mark.timeout(150)
def test_rank_raises_summary_has_traceback_and_others_stop(tmp_path):
    script = write(tmp_path, "failing.py", FAILING.format(out=str(tmp_path)))
    logs = tmp_path / "logs"
    with LeakCheck() as lc:
        lc.env["NPUSIM_STOP_GRACE"] = "3"
        res = run_npurun("--nproc-per-node", "3", "--log-dir", str(logs), "--run-id", "r1",
                         script, "raise", env=lc.env)
        elapsed = since_failure(tmp_path)
        assert all(pid_gone(p) for p in pids(tmp_path, 3))
    assert res.returncode == 1, res.stderr
    err = res.stderr
    assert "Root Cause (first observed failure):" in err
    root = err.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : 1" in root
    assert "ValueError: boom from rank 1" in root
    assert "in fail_here" in root and "failing.py" in root
    assert "launcher/worker.py" not in root  # the bootstrap's frames are trimmed
    assert "Stopped by npurun after the failure: ranks 0, 2" in err
    assert "[rank 1]: ValueError: boom from rank 1" in err  # the rank's own stderr
    error_file = logs / "r1" / "attempt_0" / "1" / "error.json"
    assert str(error_file) in root
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "ValueError: boom from rank 1"
    assert "fail_here" in data["message"]["extraInfo"]["py_callstack"]
    assert data["rank"] == 1 and data["timestamp"] > 0
    # the others take SIGTERM at once: npurun is done within the slack, not the 3 s grace
    assert elapsed < bounds.SCHED_SLACK, elapsed


@pytest.mark.timeout(150)
def test_os_exit_code_is_npurun_exit_code(tmp_path):
    script = write(tmp_path, "failing.py", FAILING.format(out=str(tmp_path)))
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", script, "exit7", env=lc.env)
        assert all(pid_gone(p) for p in pids(tmp_path, 2))
    assert res.returncode == 7, res.stderr
    root = res.stderr.split("Root Cause")[1]
    assert "exitcode  : 7" in root and "rank      : 1" in root
    assert "without a Python exception" in root


@pytest.mark.timeout(150)
def test_sigkilled_rank_exit_137_and_survivor_killed_after_grace(tmp_path):
    script = write(tmp_path, "failing.py", FAILING.format(out=str(tmp_path)))
    with LeakCheck() as lc:
        lc.env["NPUSIM_STOP_GRACE"] = str(bounds.STOP_GRACE)
        res = run_npurun("--nproc-per-node", "2", script, "sigkill", env=lc.env)
        elapsed = since_failure(tmp_path)
        assert all(pid_gone(p) for p in pids(tmp_path, 2))
    assert res.returncode == 137, res.stderr
    root = res.stderr.split("Root Cause")[1]
    assert "SIGKILL" in root and "exit 137" in root and "rank      : 1" in root
    assert "npurun exits with 137" in res.stderr
    assert "Stopped by npurun after the failure: ranks 0" in res.stderr  # ignored SIGTERM
    # the survivor ignores SIGTERM: SIGKILL after the grace, not before, and not much later
    assert bounds.STOP_GRACE <= elapsed < bounds.STOP_AFTER_FAILURE_ASSERTED, elapsed


@pytest.mark.timeout(150)
def test_max_restarts_restarts_the_whole_group(tmp_path):
    script = write(tmp_path, "flaky.py", f"""
        import os
        k, r = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
        open(os.path.join({str(tmp_path)!r}, f"ran.{{k}}.{{r}}"), "w").close()
        if k == "0" and r == "1":
            raise RuntimeError("first attempt fails")
        """)
    logs = tmp_path / "logs"
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
                         "--run-id", "flaky", script, env=lc.env)
    assert res.returncode == 0, res.stderr
    assert "RuntimeError: first attempt fails" in res.stderr
    assert "restarting the job: attempt 1" in res.stderr
    assert (tmp_path / "ran.1.0").exists() and (tmp_path / "ran.1.1").exists()
    assert (logs / "flaky" / "attempt_0" / "1" / "error.json").exists()
    assert (logs / "flaky" / "attempt_1" / "0").is_dir()
    assert not (logs / "flaky" / "attempt_1" / "1" / "error.json").exists()
