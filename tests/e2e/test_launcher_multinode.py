"""Several npurun on loopback forming one job: ranks, the shared secret, the store, a node that
never arrives, SLURM-derived defaults, and a failure on one node stopping the other."""
from __future__ import annotations

import json
import random
import secrets
import socket
import textwrap
import time

import numpy as np
import pytest

from tests import bounds
from tests.leakcheck import LeakCheck, start_npurun

# Every rank dumps its environment, then all ranks exchange values through the job's store,
# authenticated with the job secret from the environment.
EXCHANGE = """
import json, os, sys
from hccl.store import StoreClient
out = {out!r}
r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(out, f"env.{{r}}.json"), "w") as f:
    json.dump(dict(os.environ), f)
store = StoreClient(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                    bytes.fromhex(os.environ["NPUSIM_JOB_SECRET"]), timeout=30)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if sys.argv[1:] == ["fail-rank-3-once"] and r == 3 and attempt == "0":
    raise RuntimeError("rank 3 gives up")
store.set(f"test/{{attempt}}/{{r}}", str(100 + r))
values = [int(store.get(f"test/{{attempt}}/{{i}}")) for i in range(n)]
with open(os.path.join(out, f"seen.{{r}}.json"), "w") as f:
    json.dump(values, f)
if sys.argv[1:] == ["allreduce"]:
    import numpy as np, runtime, hccl
    runtime.set_device(int(os.environ["LOCAL_RANK"]))
    comm = hccl.init_comm()
    x = runtime.to_device(np.arange(1000, dtype=np.float32) * (r + 1))
    comm.all_reduce(x)
    with open(os.path.join(out, f"allreduce.{{r}}.json"), "w") as f:
        json.dump([comm.rank, comm.size] + x.to_host().tolist(), f)
    comm.destroy()
"""


def free_port(lo: int = 30000, hi: int = 39999) -> int:
    for _ in range(100):
        port = random.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def script(tmp_path) -> str:
    path = tmp_path / "exchange.py"
    path.write_text(textwrap.dedent(EXCHANGE.format(out=str(tmp_path))))
    return str(path)


def envs(tmp_path, n):
    return [json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(n)]


@pytest.mark.timeout(90)
def test_two_launchers_on_loopback_form_one_four_rank_job(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # where node 0 publishes the secret
    port = free_port()
    path = script(tmp_path)
    with LeakCheck() as lc:
        lc.env.pop("NPUSIM_JOB_SECRET", None)
        lc.env["XDG_RUNTIME_DIR"] = str(tmp_path)
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                  "--master-port", str(port)]
        # node 1 first: it must wait for node 0 rather than fail
        n1 = start_npurun(*common, "--node_rank", "1", path, "allreduce", env=lc.env)
        n0 = start_npurun(*common, "--node-rank", "0", path, "allreduce", env=lc.env)
        out0, err0 = n0.communicate(timeout=60)
        out1, err1 = n1.communicate(timeout=60)
    assert n0.returncode == 0, err0
    assert n1.returncode == 0, err1
    es = envs(tmp_path, 4)
    assert sorted(int(e["RANK"]) for e in es) == [0, 1, 2, 3]
    for r, e in enumerate(es):
        assert e["WORLD_SIZE"] == e["RANK_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["GROUP_RANK"] == str(r // 2) and e["LOCAL_RANK"] == str(r % 2)
        assert e["NPUSIM_NODE_COUNT"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(port)
    assert len({e["NPUSIM_JOB_ID"] for e in es}) == 1
    assert len({e["NPUSIM_JOB_SECRET"] for e in es}) == 1
    assert len({e["TORCHELASTIC_RUN_ID"] for e in es}) == 1
    for r in range(4):
        assert json.loads((tmp_path / f"seen.{r}.json").read_text()) == [100, 101, 102, 103]
    assert "[rank 0]" not in out1 and "[rank 2]" not in out0
    for r in range(4):   # one 4-rank communicator across the two launchers: 1+2+3+4 = 10
        got = json.loads((tmp_path / f"allreduce.{r}.json").read_text())
        assert got[:2] == [r, 4] and got[2:] == (10 * np.arange(1000, dtype=np.float32)).tolist()
    assert not (tmp_path / f"npurun-secret-{port}").exists()  # node 0 removed it


@pytest.mark.timeout(120)
def test_nodes_that_never_arrive_are_named(tmp_path):
    port, other_port = free_port(), free_port()
    path = script(tmp_path)
    with LeakCheck() as lc:
        lc.env["NPUSIM_JOB_SECRET"] = secrets.token_hex(32)
        lc.env["HCCL_CONNECT_TIMEOUT"] = str(bounds.CONNECT_TIMEOUT)
        start_s = bounds.launcher_start_s()     # npurun's start-up at this moment's load
        t0 = time.monotonic()
        alone = start_npurun("--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1",
                             "--master-port", str(port), path, env=lc.env)
        # and a node 1 whose node 0 never comes: it names node 0 and the store it tried
        orphan = start_npurun("--nnodes", "2", "--node-rank", "1", "--master-addr",
                              "127.0.0.1", "--master-port", str(other_port), path, env=lc.env)
        _, err = alone.communicate(timeout=40)
        _, err_orphan = orphan.communicate(timeout=40)
        elapsed = time.monotonic() - t0
    assert alone.returncode == 1, err
    assert "nodes 1, 2 of 3 never arrived within 2 s" in err
    assert "HCCL_CONNECT_TIMEOUT" in err
    assert orphan.returncode == 1, err_orphan
    assert "node 0 of 2 never arrived within 2 s" in err_orphan
    assert f"no answer from node 0's store at 127.0.0.1:{other_port}" in err_orphan
    # the 2 s timeouts, and not before them: npurun waited for the nodes, then named them
    assert bounds.CONNECT_TIMEOUT <= elapsed < bounds.never_arrive_asserted(start_s), \
        (elapsed, start_s)
    assert not list(tmp_path.glob("env.*"))  # no rank was started


@pytest.mark.timeout(90)
def test_slurm_defaults_a_failure_stops_every_node_and_the_job_restarts(tmp_path):
    port = free_port(20000, 39999)
    path = script(tmp_path)
    token = secrets.token_hex(32)
    with LeakCheck() as lc:
        lc.env.update({"NPUSIM_JOB_SECRET": token, "NPUSIM_STOP_GRACE": "2",
                       "SLURM_JOB_ID": str(port - 20000), "SLURM_NNODES": "2",
                       "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_LOCALID": "0"})
        nodes = []
        for node in (0, 1):  # srun would set SLURM_NODEID per node; no node flag is given
            env = dict(lc.env, SLURM_NODEID=str(node))
            nodes.append(start_npurun("--nproc-per-node", "2", "--max-restarts", "1", path,
                                      "fail-rank-3-once", env=env))
        (out0, err0), (out1, err1) = [p.communicate(timeout=60) for p in nodes]
    # attempt 0: rank 3 (node 1) fails; node 1 reports it, node 0 stops its ranks too
    assert "RuntimeError: rank 3 gives up" in err1 and "Root Cause" in err1
    assert "npurun restarts the job" in err1
    assert "node 1 failed: rank 3 failed (exited with code 1)" in err0
    # attempt 1: both nodes restart together and finish
    assert nodes[0].returncode == 0, err0
    assert nodes[1].returncode == 0, err1
    assert "restarting the job: attempt 1" in err0 and "restarting the job: attempt 1" in err1
    for r, e in enumerate(envs(tmp_path, 4)):
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "4"
        assert e["GROUP_RANK"] == str(r // 2) and e["NPUSIM_NODE_COUNT"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(port)
        assert e["NPUSIM_JOB_SECRET"] == token
        assert e["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert json.loads((tmp_path / f"seen.{r}.json").read_text()) == [100, 101, 102, 103]
