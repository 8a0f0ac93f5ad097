"""The "hccl" backend started by torch's own rendezvous, with no npurun: torchrun, and
mp.spawn with ``tcp://``, ``file://`` and ``store=``. The world authenticates with a secret
rank 0 put in torch's Store; none of the ranks had npusim's job secret in its environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install -e '.[torch]'")

from tests.leakcheck import LeakCheck, MARKER  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "torch_rdzv_job.py")


def _run(args, tmp_path, tag):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPUSIM_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({"PYTHONPATH": ROOT, MARKER: tag, "HCCL_CONNECT_TIMEOUT": "60"})
    res = subprocess.run([sys.executable, *args], env=env, cwd=str(tmp_path), timeout=420,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


def _check(tmp_path, world):
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    total = float(sum(range(1, world + 1)))
    for r, res in enumerate(ranks):
        assert res["backend"] == "hccl" and res["world"] == world
        assert res["all_reduce"] == [total] * 4
        assert res["ring"] == [(r - 1) % world]
        assert res["secret_in_env"] is False
    assert ranks[0]["sub"] == ranks[-1]["sub"] == [10 * (world - 1)]


@pytest.mark.timeout(450)
def test_torchrun_without_npurun(tmp_path):
    with LeakCheck() as lc:
        _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", JOB, "env",
              str(tmp_path)], tmp_path, lc.tag)
    _check(tmp_path, 3)


@pytest.mark.timeout(450)
@pytest.mark.parametrize("method", ["tcp", pytest.param("file", marks=pytest.mark.slow),
                                    pytest.param("store", marks=pytest.mark.slow)])
def test_mp_spawn_with_torch_init_methods(tmp_path, method):
    with LeakCheck() as lc:
        _run([JOB, method, str(tmp_path), "2"], tmp_path, lc.tag)
    _check(tmp_path, 2)
