"""Fail-slow end to end through npurun: a rank that arrives 25 ms late at each of 240
all_reduces is named ("late to arrive", its lateness within 30 % of 25 ms) in a notice and in
the end-of-job summary of a job that succeeds, and in failslow_report.json; healthy jobs (the
same loop without the sleep, short runs of examples/train_ddp.py) name nobody."""
from __future__ import annotations

import json
import os
import re

import pytest

from tests.leakcheck import LeakCheck, run_npurun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP = os.path.join(ROOT, "examples", "train_ddp.py")

LOOP = """
import os, sys, time
import numpy as np
import runtime, hccl
late, steps = int(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["RANK"])
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
x = runtime.to_device(np.zeros(1024, dtype=np.float32))
for i in range(steps):
    if rank == late:
        time.sleep(0.025)          # a slow data loader
    comm.all_reduce(x)
    runtime.synchronize()
comm.destroy()
"""


def run(tmp_path, *args, script=None, timeout=240):
    logs = tmp_path / "logs"
    if script is not None:
        path = tmp_path / "loop.py"
        path.write_text(script)
        args = (str(path), *args)
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", "--log-dir", str(logs), *args, env=lc.env,
                         cwd=str(tmp_path), timeout=timeout)
    report = logs / "failslow_report.json"
    return res, (json.loads(report.read_text()) if report.exists() else None)


@pytest.mark.timeout(300)
def test_rank_late_at_every_all_reduce_is_named(tmp_path):
    res, report = run(tmp_path, "1", "240", script=LOOP)
    assert res.returncode == 0, res.stderr[-3000:]
    err = res.stderr
    notices = re.findall(r"npurun: notice: slow rank\(s\): \[1\] in comm world: late to arrive",
                         err)
    assert len(notices) == 1, err[-3000:]                    # once per episode
    summary = err[err.index("npurun: fail-slow summary:"):]
    assert "slow rank(s): [1] in comm world: late to arrive: arrives late by a median" in summary
    (f,) = report["findings"]
    print(f"observed: {f}")
    assert f["ranks"] == [1] and f["kind"] == "late to arrive"
    assert 0.025 * 0.7 <= f["lateness"] <= 0.025 * 1.3, f
    assert f["last_share"] >= 0.6 and 0.3 <= f["waited_share"] <= 1.0, f
    assert f["collectives"] >= 100 and 1 <= f["first_seq"] < f["last_seq"] <= 240, f


@pytest.mark.timeout(300)
def test_healthy_loop_names_nobody(tmp_path):
    res, report = run(tmp_path, "-1", "240", script=LOOP)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "slow rank" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert report is None


@pytest.mark.timeout(400)
@pytest.mark.parametrize("run_no", [0, 1])
def test_short_ddp_runs_name_nobody(tmp_path, run_no):
    res, report = run(tmp_path, DDP, "--steps", "40", "--batch", "1536", "--seed", str(run_no))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "final loss" in res.stdout + res.stderr
    assert "slow rank" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert report is None


TORCH_LOOP = """
import os, time, torch, torch.distributed as dist
import hccl.torch_backend  # noqa: F401 - registers the "hccl" backend
dist.init_process_group("hccl")
x = torch.zeros(1024)
for i in range(240):
    if dist.get_rank() == 2:
        time.sleep(0.025)
    dist.all_reduce(x)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torch_hccl_backend_rank_late_is_named(tmp_path):
    pytest.importorskip("torch")
    res, report = run(tmp_path, script=TORCH_LOOP)
    assert res.returncode == 0, res.stderr[-3000:]
    (f,) = report["findings"]
    assert f["ranks"] == [2] and f["kind"] == "late to arrive", f
    assert 0.025 * 0.7 <= f["lateness"] <= 0.025 * 1.3, f
    assert "slow rank(s): [2] in comm world: late to arrive" in res.stderr
