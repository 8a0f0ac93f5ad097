"""Connections made at first use (#39): at world 16 a ring AllReduce connects each rank to its
two neighbours only (pairs, TCP sockets, mapped shared-memory inboxes), with shared memory on and
off, and the bytes are right; a star's root connects to the ranks it serves."""
import json
import os
import textwrap

import pytest

from hccl.transport import shm
from tests.leakcheck import LeakCheck, run_npurun

WORLD = 16

RANK = """
import json, os, socket
import numpy as np
import hccl, runtime
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
t = comm.world.transport
at_init = t.paired
r, n = comm.rank, comm.size
small = runtime.to_device(np.full(256, r + 1, np.float32))            # 1 KiB: ring slots
big = runtime.to_device(np.full(1 << 18, r + 1, np.float32))          # 1 MiB: notices / sockets
comm.all_reduce(small)
comm.all_reduce(big)
runtime.synchronize()
want = n * (n + 1) / 2


def tcp_peers():
    # connected TCP sockets of this process (not the listening ROUTER), by remote port
    out = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET:
                s.getpeername()
                out += 1
        except OSError:
            pass
        finally:
            s.close()
    return out


maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        if "-hccl-r" in line:
            maps.add(line.split()[-1] if "(deleted)" not in line else line.split()[-2])
res = {{"rank": r, "at_init": at_init, "paired": t.paired, "local": t.local_peers,
        "tcp": tcp_peers(), "maps": len(maps), "ok": bool((small.to_host() == want).all()
                                                        and (big.to_host() == want).all())}}
comm.destroy()
with open(os.path.join({out!r}, f"rank{{r}}.json"), "w") as f:
    json.dump(res, f)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("use_shm", ["1", "0"])
def test_a_ring_connects_each_rank_to_its_two_neighbours(tmp_path, use_shm):
    if use_shm == "1" and not shm.available():
        pytest.skip("the shared-memory channel needs x86-64 Linux with /dev/shm")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(RANK.format(out=str(tmp_path))))
    with LeakCheck() as lc:
        env = dict(lc.env, HCCL_ALGO="ring", NPUSIM_SHM=use_shm, NPUSIM_SHM_MIN_BYTES="65536")
        res = run_npurun("--nproc-per-node", str(WORLD), str(script), env=env,
                         cwd=str(tmp_path), timeout=220)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in range(WORLD):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        ring = sorted({(r - 1) % WORLD, (r + 1) % WORLD})
        assert got["ok"], got
        assert got["at_init"] == [], got                  # init connects to no peer
        assert got["paired"] == ring, got                 # a ring: two pairs, not 15
        # the store (1-2 connections: the init thread's, the diag reporter's), 2 outbound
        # pairs and the 2 neighbours' inbound ones; eagerly it was 2 x 15 + the store's
        assert got["tcp"] <= 2 + 2 * len(ring), got
        if use_shm == "1":
            assert got["local"] == [p for p in range(WORLD) if p != r], got   # all known
            assert got["maps"] <= 1 + len(ring), got       # own inbox + the neighbours'
        else:
            assert got["local"] == [] and got["maps"] == 0, got
