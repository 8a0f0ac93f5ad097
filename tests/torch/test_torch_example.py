"""examples/train_torch_ddp.py end to end under npurun: DDP on "hccl" passes --check (replicas
bitwise identical and equal to one process), and the same script runs on torch's gloo."""
from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

from tests.leakcheck import LeakCheck, run_npurun  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_torch_ddp.py")


def run(tmp_path, *args, nproc):
    with LeakCheck() as lc:
        return run_npurun("--nproc-per-node", str(nproc), EXAMPLE, *args, env=lc.env,
                          cwd=str(tmp_path), timeout=150)


@pytest.mark.timeout(180)
def test_example_on_hccl_passes_check(tmp_path):
    res = run(tmp_path, "--check", "--steps", "8", "--batch", "256", nproc=4)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "backend hccl, 4 ranks x 64 samples" in res.stdout
    m = re.search(r"CHECK PASS: 4 replicas bitwise identical; max\|ddp - single\| / "
                  r"max\|single\| = (\S+)", res.stdout)
    assert m and float(m.group(1)) <= 1e-6, res.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_example_runs_the_same_on_gloo(tmp_path):
    res = run(tmp_path, "--check", "--backend", "gloo", "--steps", "3", "--batch", "64", nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "backend gloo" in res.stdout and "CHECK PASS: 2 replicas bitwise identical" in res.stdout

