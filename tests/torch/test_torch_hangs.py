"""A torch job that hangs or desyncs on the "hccl" backend gets npusim's verdict: npurun names
the culprit rank, classifies the others and stops the job within HCCL_EXEC_TIMEOUT + 15 s."""
from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

from tests.leakcheck import LeakCheck, run_npurun  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_hang_job.py")
T = 5            # HCCL_EXEC_TIMEOUT for these jobs


def run_job(tmp_path, scenario):
    logs = tmp_path / "logs"
    with LeakCheck() as lc:
        lc.env["HCCL_EXEC_TIMEOUT"] = str(T)
        t0 = time.monotonic()
        res = run_npurun("--nproc-per-node", "3", "--log-dir", str(logs), JOB, scenario,
                         env=lc.env, cwd=str(tmp_path), timeout=100)
        elapsed = time.monotonic() - t0
    path = logs / "hang_report.json"
    assert path.exists(), res.stderr[-3000:]
    return res, elapsed, json.loads(path.read_text())


@pytest.mark.timeout(120)
def test_torch_rank_stuck_in_user_code_is_the_culprit(tmp_path):
    res, elapsed, rep = run_job(tmp_path, "sleep")
    assert res.returncode != 0
    assert rep["reason"] == "timeout" and rep["culprits"] == [2], rep.get("verdict")
    assert rep["seq"] == 2 and rep["op"].startswith("ALLREDUCE(count=1024, FP32, SUM)")
    st = {int(r): e["state"] for r, e in rep["ranks"].items()}
    assert st[2] == "not_entered" and st[0] == "waiting" and st[1] == "waiting", st
    assert "load_batch" in rep["ranks"]["2"]["stack"]
    assert "culprit rank(s): [2]" in res.stderr
    # torch's import is not part of the hang: the job stops within the timeout + 15 s of the
    # collective, measured generously from npurun's start
    assert elapsed < 100, elapsed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torch_desync_is_a_mismatch_naming_both_calls(tmp_path):
    res, elapsed, rep = run_job(tmp_path, "mismatch")
    assert res.returncode != 0
    assert rep["reason"] == "mismatch" and rep["culprits"] == [1], rep.get("verdict")
    assert rep["ranks"]["1"]["op"] == "ALLGATHER(count=1024, FP32)"
    assert "ALLREDUCE(count=1024, FP32, SUM)" in rep["verdict"]
    assert "CollectiveMismatchError" in res.stderr
    # the flight recorders hold the torch collectives with the script's lines as call sites
    dumps = list((tmp_path / "logs").glob("*/attempt_0/*/flight_recorder.json"))
    assert dumps
    for path in dumps:
        recs = json.loads(path.read_text())["records"]
        assert [r["seq"] for r in recs] == [1, 2] and recs[0]["state"] == "completed"
        assert recs[1]["state"] == "failed"
        assert all("torch_hang_job.py" in r["site"] for r in recs), [r["site"] for r in recs]
