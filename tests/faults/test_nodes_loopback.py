"""Two npurun nodes on loopback (one machine, no namespaces), two ranks each: the ranks of one
node reach each other through shared memory and watch each other's process; the ranks of the
other node, though they could open this node's /proc/<pid>, only through sockets (a
node is what npurun calls one). Needs no privilege."""
from __future__ import annotations

import json
import random
import secrets
import textwrap

import pytest

from hccl.transport import shm
from tests.leakcheck import LeakCheck, reaped, start_npurun

RANK = """
import json, os, numpy as np, runtime, hccl
from runtime import ipc
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
t = comm.world.transport
x = runtime.to_device(np.full(1 << 16, comm.rank + 1, dtype=np.float32))   # 256 KiB
for _ in range(3):
    comm.all_reduce(x)
runtime.synchronize()
res = {{"rank": comm.rank, "node": ipc.node_id(), "local": t.local_peers, "procs": sorted(t._procs),
        "shm_sends": t.shm_sends + t.ring_sends, "sum": float(x.to_host()[0])}}
comm.destroy()
with open(os.path.join({out!r}, f"result.{{comm.rank}}"), "w") as f:
    json.dump(res, f)
"""


@pytest.mark.timeout(180)
def test_two_npurun_nodes_on_one_machine_share_memory_only_within_a_node(tmp_path):
    if not shm.available():
        pytest.skip("the shared-memory channel needs x86-64 Linux with /dev/shm")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK.format(out=str(tmp_path))))
    port = random.randint(30000, 39999)
    with LeakCheck(grace=20) as lc, reaped() as procs:
        lc.env["NPUSIM_JOB_SECRET"] = secrets.token_hex(32)
        lc.env.pop("NPUSIM_SHM", None)
        lc.env["HCCL_ALGO"] = "ring"   # 0 -> 1 -> 2 -> 3 -> 0: one link inside each node
        for node in (0, 1):
            procs.append(start_npurun("--nnodes", "2", "--nproc-per-node", "2", "--node-rank",
                                      str(node), "--master-addr", "127.0.0.1",
                                      "--master-port", str(port), str(script),
                                      env=lc.env, cwd=tmp_path))
        outs = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res = {r: json.loads((tmp_path / f"result.{r}").read_text()) for r in range(4)}
    for r, x in res.items():
        mate = r ^ 1                           # the other rank of its node (ranks 0-1, 2-3)
        assert x["local"] == [mate] and x["procs"] == [mate], (r, x)
        # a ring sends to the next rank only: 0 -> 1 and 2 -> 3 stay inside a node and use
        # shared memory, 1 -> 2 and 3 -> 0 cross to the other node through sockets
        assert (x["shm_sends"] > 0) == (r in (0, 2)), (r, x)
        assert x["sum"] == 160.0, (r, x)       # 1+2+3+4, then x 4 twice (in place)
    assert res[0]["node"] == res[1]["node"] != res[2]["node"] == res[3]["node"]
