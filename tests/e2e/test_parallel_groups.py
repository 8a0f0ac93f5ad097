"""examples/parallel_groups.py: TP x PP x DP sub-communicators run their collectives and exit
cleanly; with --hang-rank, npurun names the stopped rank as the culprit."""
from __future__ import annotations

import os

import pytest

from tests.leakcheck import LeakCheck, run_npurun

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
