"""Ranks named as torchrun's are (issue 53): ``ps -o args`` of a running rank reads
``python -u SCRIPT ARGS`` whether the rank was forked by the fork server or started fresh,
``pgrep -f SCRIPT`` finds every rank, ``/proc/PID/comm`` is ``rank<R>:<script>`` and
``npurun --status`` lists each rank's pid (launcher.procs.proctitle.show_command)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.leakcheck import LeakCheck, npurun_cmd, start_npurun, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="command lines are rewritten on Linux only")

# each rank writes its pid, then waits for the test's event file (at most 60 s)
WAITER = """
import os, sys, time
out = {out!r}
r = os.environ["RANK"]
with open(os.path.join(out, f"pid.{{r}}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, f"pid.{{r}}.tmp"), os.path.join(out, f"pid.{{r}}"))
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
print("args", sys.argv[1:] == {args!r})
"""


def _ps_args(pid: int) -> str:
    return subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True, text=True,
                          timeout=10).stdout.strip()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forked", [True, False], ids=["forkserver", "fresh"])
def test_ranks_show_their_script_and_arguments(tmp_path, forked):
    if not shutil.which("ps") or not shutil.which("pgrep"):
        pytest.skip("needs ps and pgrep (procps)")
    long_arg = "x" * 5000           # longer than the fork server's own line: the padding holds it
    args = ["--lr", "0.1", "--name", "two words", long_arg]
    script = tmp_path / "named_job.py"
    script.write_text(textwrap.dedent(WAITER.format(out=str(tmp_path), args=args)))
    with LeakCheck() as lc:
        lc.env["NPUSIM_FORKSERVER"] = "1" if forked else "0"
        p = start_npurun("--nproc-per-node", "2", str(script), *args, env=lc.env,
                         cwd=str(tmp_path))
        try:
            wait_for(lambda: all((tmp_path / f"pid.{r}").exists() for r in range(2))
                     or p.poll() is not None, 60, 0.05, "both ranks to start")
            assert p.poll() is None, p.communicate()
            pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
            for r, pid in enumerate(pids):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().rstrip(b"\0").decode().split("\0")
                assert argv[1:] == ["-u", str(script), *args], argv[:6]
                assert os.path.basename(argv[0]).startswith("python")
                shown = _ps_args(pid)
                assert shown.endswith(f" -u {script} {' '.join(args)}"), shown[:200]
                assert "launcher.worker" not in shown
                with open(f"/proc/{pid}/comm") as f:
                    assert f.read().strip() == f"rank{r}:named_job.py"[:15]
            # `pgrep -f` finds exactly the ranks (npurun's own line has no ` -u `)
            found = subprocess.run(["pgrep", "-f", f" -u {re.escape(str(script))} "],
                                   capture_output=True, text=True, timeout=10).stdout.split()
            assert sorted(map(int, found)) == sorted(pids)
            status = subprocess.run(npurun_cmd("--status", str(p.pid)), env=lc.env,
                                    capture_output=True, text=True, timeout=30)
            assert status.returncode == 0, status.stderr
            assert f"0={pids[0]} 1={pids[1]}" in status.stdout, status.stdout
            if forked:      # the fork server's own line is restored, its padding not shown
                line = _ps_args(_parent(pids[0]))
                assert re.fullmatch(r"\S+ -u -m launcher.worker --fork-server \d+", line), line
            (tmp_path / "go").touch()
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert p.returncode == 0, err[-2000:]
    assert out.count("args True") == 2, out[-2000:]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
