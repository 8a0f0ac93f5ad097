"""A script run with plain ``python``: hccl.init_comm() is a world of one, set_device() device 0."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hccl
import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NPUSIM_JOB_SECRET",
                 "LOCAL_RANK")


@pytest.fixture
def no_launcher(monkeypatch):
    for k in LAUNCHER_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NPUSIM_HBM_BYTES", str(1 << 30))
    yield
    runtime.reset_device(0)


@pytest.mark.timeout(60)
def test_world_of_one_runs_every_collective(no_launcher, capsys):
    runtime.set_device()
    assert runtime.get_device() == 0
    comm = hccl.init_comm()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "world of one (rank 0 of 1)" in err[0]
    assert (comm.rank, comm.size) == (0, 1)
    x = runtime.to_device(np.arange(6, dtype=np.float32))
    y = runtime.empty((6,), np.float32)
    comm.all_reduce(x, y, op=hccl.ReduceOp.MAX)
    z = runtime.empty((6,), np.float32)
    comm.all_gather(x, z)
    comm.broadcast(x, root=0)
    comm.barrier()
    runtime.synchronize()
    assert np.array_equal(y.to_host(), np.arange(6)) and np.array_equal(z.to_host(), np.arange(6))
    comm.destroy()


def test_partial_launcher_environment_is_an_error(no_launcher, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(hccl.InvalidArgumentError, match="WORLD_SIZE"):
        hccl.init_comm()


def test_set_device_without_argument_takes_local_rank(no_launcher, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    runtime.set_device()
    try:
        assert runtime.get_device() == 3
    finally:
        runtime.reset_device(3)
    runtime.set_device(0)


@pytest.mark.timeout(90)
def test_plain_python_script(tmp_path):
    script = tmp_path / "tour.py"
    script.write_text(
        "import numpy as np, runtime, hccl\n"
        "runtime.set_device()\n"
        "comm = hccl.init_comm()\n"
        "x = runtime.to_device(np.ones(4, np.float32) * 2)\n"
        "comm.all_reduce(x)\n"
        "print('rank', comm.rank, 'of', comm.size, x.to_host().tolist())\n"
        "comm.destroy()\n")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_KEYS}
    env["PYTHONPATH"] = ROOT
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=80, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "rank 0 of 1 [2.0, 2.0, 2.0, 2.0]"
    assert res.stderr.count("\n") == 1 and "world of one" in res.stderr
