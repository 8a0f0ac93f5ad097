"""examples/parallel_groups.py: TP x PP x DP sub-communicators run their collectives and exit
cleanly; with --hang-rank, npurun names the stopped rank as the culprit."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.leakcheck import LeakCheck, npurun_cmd, run_npurun, wait_for

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples", "parallel_groups.py")


def _run(world: int, *args: str, env_extra=None, timeout: float = 280, cwd=None):
    with LeakCheck(grace=15) as lc:
        lc.env.update(env_extra or {})
        res = run_npurun("--nproc-per-node", str(world), EXAMPLE, *args, env=lc.env,
                         timeout=timeout, cwd=cwd)
    return res


@pytest.mark.timeout(300)
def test_groups_at_world_8():
    res = _run(8, "--tp", "2", "--pp", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world 8 = tp 2 x pp 2 x dp 2: 4 TP, 4 PP, 4 DP groups" in res.stdout
    assert "3 steps of TP/PP/DP collectives OK" in res.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_groups_at_world_64_start_run_and_exit_cleanly():
    res = _run(64, "--tp", "4", "--pp", "4", timeout=880)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "world 64 = tp 4 x pp 4 x dp 4: 16 TP, 16 PP, 16 DP groups" in res.stdout
    assert "3 steps of TP/PP/DP collectives OK" in res.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hung_tensor_parallel_rank_is_named(tmp_path):
    res = _run(8, "--tp", "2", "--pp", "2", "--hang-rank", "5",
               env_extra={"HCCL_EXEC_TIMEOUT": "25"}, cwd=str(tmp_path))   # the report goes there
    assert res.returncode == 1, res.stderr[-3000:]
    assert "rank 5 will stop before step 1: it is in TP group 2 [4, 5]" in res.stdout
    assert "npurun exits with 1 (culprit rank 5: not_entered)" in res.stderr, res.stderr[-3000:]
    assert "parallel_groups.py" in res.stderr           # its stack, in user code


class _Console:
    """npurun's console (stdout and stderr merged), each line with the time it arrived."""

    def __init__(self, p: subprocess.Popen):
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, args=(p.stdout,), daemon=True)
        self._reader.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, needle: str) -> tuple[float, str] | None:
        return next(((t, l) for t, l in list(self.lines) if needle in l), None)

    def join(self) -> None:
        self._reader.join(30)


def _npurun_lines(lines, since: float = 0.0) -> list[str]:
    """npurun's own lines (not the ranks' ``[rank N]:`` output) from ``since`` on."""
    return [l for t, l in lines if t >= since and not l.startswith("[rank ")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_hung_rank_at_world_128_is_named_within_20_s_then_ctrl_c_is_short(tmp_path):
    """Default settings (HCCL_EXEC_TIMEOUT 1800 s): the notice names rank 37 and its TP group
    (world.sub[36, 37, 38, 39]) at most 20 s after its peers began to wait for it; a Ctrl-C then
    prints one line per place the ranks stopped, not one per rank."""
    with LeakCheck(grace=30) as lc:
        for k in ("HCCL_EXEC_TIMEOUT", "NPUSIM_HANG_NOTICE"):
            lc.env.pop(k, None)
        p = subprocess.Popen(npurun_cmd("--nproc-per-node", "128", EXAMPLE, "--tp", "4", "--pp",
                                        "4", "--hang-rank", "37"),
                             env=lc.env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        con = _Console(p)
        try:
            wait_for(lambda: con.first("npurun: notice:") or p.poll() is not None, 600, 0.1,
                     "the hang notice")
            notice = con.first("npurun: notice:")
            assert notice is not None, "\n".join(l for _, l in con.lines[-40:])
            stopped = con.first("rank 37 stops now")
            time.sleep(1.0)           # the notice's stack lines follow it
            p.send_signal(signal.SIGINT)
            p.wait(240)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        con.join()
    head = notice[1]
    block = "\n".join(_npurun_lines(con.lines, notice[0])[:12])     # its culprits' lines too
    assert "rank 37 has not called seq 2 of world.sub[36, 37, 38, 39]" in head, block
    assert "ranks 36, 38, 39 wait for it" in head
    waited = int(re.search(r"for (\d+) s;", head).group(1))
    assert waited <= 20, block          # from the first peer's wait to the notice
    print(f"world 128: notice {notice[0] - stopped[0]:.1f} s after rank 37 stopped, "
          f"{waited} s after its peers began to wait")
    assert p.returncode == 130
    after = _npurun_lines(con.lines, notice[0])
    assert len(after) <= 60, "\n".join(after)
    assert any("parallel_groups.py" in l for l in after)          # the culprit's stack, once
    assert sum("Python stacks of rank 37" in l for l in after) == 1
    assert any(l.startswith("npurun: KeyboardInterrupt: ranks ") for l in after), after
    assert any("SIGINT received: stopped ranks 0-127" in l for l in after), after


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_hung_rank_at_world_128_gets_a_verdict_of_at_most_60_lines(tmp_path):
    """HCCL_EXEC_TIMEOUT=30: the job fails with a verdict naming rank 37 and its group; the
    report and the failure summary group the other ranks as ranges."""
    res = _run(128, "--tp", "4", "--pp", "4", "--hang-rank", "37",
               env_extra={"HCCL_EXEC_TIMEOUT": "30"}, cwd=str(tmp_path), timeout=880)
    assert res.returncode == 1, res.stderr[-3000:]
    mine = [l for l in (res.stdout + res.stderr).splitlines() if not l.startswith("[rank ")]
    start = next(i for i, l in enumerate(mine) if l.startswith("npusim job verdict"))
    report = mine[start - 1:]
    text = "\n".join(report)
    with open(tmp_path / "hang_report.json") as f:
        v = json.load(f)
    waits = [e["since"] for e in v["ranks"].values() if e.get("since")]
    print(f"world 128 verdict: {len(report)} lines, on {v['comm']} seq {v['seq']}, "
          f"{v['time'] - min(waits):.1f} s after the first wait in it" if waits else "")
    print(text)                         # shown with -s
    assert len(report) <= 60, text
    assert "communicator world.sub[36, 37, 38, 39]" in text and "culprit rank(s): [37]" in text
    assert "npurun exits with 1 (culprit rank 37: not_entered)" in text
    others = [l for l in report if "(not a member of world.sub[36, 37, 38, 39]" in l]
    assert 1 <= len(others) <= 3 and others[0].startswith("0-"), text   # ranges, by state
    assert "Released by the culprit (not causes; one line per way they ended" in text
    assert sum("Python stacks of culprit rank 37" in l for l in report) == 1
