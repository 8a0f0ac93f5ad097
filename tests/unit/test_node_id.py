"""What "the same node" means (runtime.ipc.node_id): npurun's node when npurun started the
process (NPUSIM_NODE, in the worker environment), else the boot id and PID namespace."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launcher.procs.env import JobInfo, worker_env
from launcher.procs.proc import LogFiles
from runtime import ipc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def node_id_with(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != ipc.NODE_ENV}
    if value is not None:
        env[ipc.NODE_ENV] = value
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-c", "from runtime import ipc; print(ipc.node_id())"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
def test_npurun_nodes_on_one_machine_are_different_nodes():
    plain = node_id_with(None).stdout.strip()
    a, b = (node_id_with(f"job1/{n}").stdout.strip() for n in (0, 1))
    assert plain.endswith(os.readlink("/proc/self/ns/pid"))          # the rule without npurun
    assert a.startswith(plain + "/") and b.startswith(plain + "/")   # machine and PID namespace
    assert a != b and a == node_id_with("job1/0").stdout.strip()     # ... and npurun's node
    assert node_id_with("").stdout.strip() == plain                   # empty: no launcher


@pytest.mark.parametrize("bad", ["job 1/0", "a\nb", "x" * 201])
def test_a_node_name_that_cannot_travel_is_refused(monkeypatch, bad):
    monkeypatch.setenv(ipc.NODE_ENV, bad)
    with pytest.raises(ValueError, match=f"{ipc.NODE_ENV}=.*characters.*npurun sets it"):
        ipc.launcher_node()


def test_worker_env_names_the_node(tmp_path):
    job = JobInfo(job_id="j42", run_id="r", secret="00", master_addr="127.0.0.1",
                  master_port=1, nnodes=3, node_rank=2, nproc_per_node=2)
    files = LogFiles(str(tmp_path / "5"))
    assert worker_env({}, job, 1, 0, files)[ipc.NODE_ENV] == "j42/2"
