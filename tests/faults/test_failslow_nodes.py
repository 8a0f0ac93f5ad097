"""Three nodes in plain network namespaces (no PID namespace), one rate-limited link.

A node is what npurun calls one; ranks of different nodes exchange data over the
network path even when the nodes share one machine. Three npurun processes, each in its own
network namespace (``tests.faults.netns.Mesh``: a veth pair between every two), one rank each,
``--nnodes 3``; node 1's sends to node 0 go through ``tc ... tbf rate 40mbit``. The ranks share
the machine's boot id and PID namespace, so before nodes were npurun's, ranks 0 and 1 traded
their data through shared memory and the slow link carried nothing (4 s by default, 13 s with
NPUSIM_SHM=0). Now:

- no rank reaches another through shared memory, and the slow link carries the data: the
  job's loop takes as long with default settings as with NPUSIM_SHM=0, and as long as the
  link's byte count (the qdisc's own counter) at 40 Mbit/s plus the unlimited run's loop;
- every node's npurun names rank 1 "slow inside the collective" with the link 1->0 and its
  lateness (one 256 KiB message at 40 Mbit/s per AllReduce: ~52 ms), in a notice, in its
  summary and in its ``failslow_report.json``; over the unlimited link nobody is named.

The AllReduce is the star (3 ranks, 256 KiB: docs/algorithms.md): every leaf sends its buffer to
rank 0, which answers each; so rank 1's one message per collective crosses the slow link.
Root only (namespaces, tc); skipped with the reason elsewhere. Run it with
``PYTHONPATH=$PWD python -m pytest -m slow -s tests/faults/test_failslow_nodes.py``: the
``observed:`` lines are the figures.
"""
from __future__ import annotations

import json
import random
import re
import secrets
import subprocess
import textwrap
import time

import pytest

from tests.faults.netns import Mesh, Unavailable, sh
from tests.leakcheck import LeakCheck, npurun_cmd

NODES = 3
COUNT = 65536                  # float32: 256 KiB, the star AllReduce at 3 ranks
STEPS = 150
RATE = 40e6 / 8                # bytes/s of "tbf rate 40mbit"
SLOW = (1, 0)                  # node 1's sends to node 0

RANK = """
import json, os, time, numpy as np, runtime, hccl
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
t = comm.world.transport
x = runtime.to_device(np.zeros({count}, dtype=np.float32))
comm.all_reduce(x)
runtime.synchronize()
t0 = time.monotonic()
for i in range({steps}):
    comm.all_reduce(x)
    runtime.synchronize()
loop = time.monotonic() - t0
res = {{"rank": comm.rank, "loop": loop, "local": t.local_peers, "shm": t.channel is not None,
        "procs": sorted(t._procs)}}
comm.destroy()
with open(os.path.join({out!r}, f"result.{{res['rank']}}"), "w") as f:
    json.dump(res, f)
"""


@pytest.fixture
def mesh():
    try:
        m = Mesh(NODES)
    except Unavailable as e:
        pytest.skip(f"three network namespaces joined by veth pairs: {e}")
    try:
        yield m
    finally:
        m.close()


def link_bytes(m: Mesh, src: int, dst: int) -> int:
    """What the qdisc on ``src``'s end of the pair to ``dst`` has sent (headers included)."""
    out = sh("ip", "netns", "exec", m.ns[src], "tc", "-s", "qdisc", "show", "dev",
             m.dev(src, dst)).stdout
    found = re.search(r"Sent (\d+) bytes", out)
    assert found, out
    return int(found.group(1))


def run_job(m: Mesh, tmp, name: str, extra: dict) -> dict:
    """One job of NODES npurun processes, one per namespace; the ranks' results and outputs."""
    out = tmp / name
    out.mkdir()
    script = out / "rank.py"
    script.write_text(textwrap.dedent(RANK.format(count=COUNT, steps=STEPS, out=str(out))))
    port = random.randint(30000, 39999)
    procs, outs = [], []
    with LeakCheck(grace=20) as lc:
        lc.env.update({"NPUSIM_JOB_SECRET": secrets.token_hex(32), "HCCL_EXEC_TIMEOUT": "120",
                       **extra})
        t0 = time.monotonic()
        try:
            for i in range(NODES):
                procs.append(subprocess.Popen(
                    m.cmd(i, npurun_cmd("--nnodes", NODES, "--nproc-per-node", 1, "--node-rank",
                                        i, "--master-addr", m.addr[0], "--master-port", port,
                                        "--log-dir", out / f"logs{i}", script)),
                    env=lc.env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True))
            outs = [p.communicate(timeout=400)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
        wall = time.monotonic() - t0
    assert [p.returncode for p in procs] == [0] * NODES, outs
    results = {r: json.loads((out / f"result.{r}").read_text()) for r in range(NODES)}
    reports = {}
    for i in range(NODES):
        path = out / f"logs{i}" / "failslow_report.json"
        reports[i] = json.loads(path.read_text()) if path.exists() else None
    loop = max(res["loop"] for res in results.values())
    return {"results": results, "outs": outs, "reports": reports, "loop": loop, "wall": wall}


def slow_lines(outs):
    return [ln for o in outs for ln in o.splitlines() if "slow rank(s)" in ln]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nodes_in_network_namespaces_cross_the_slow_link_and_it_is_named(tmp_path, mesh):
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    free = run_job(mesh, tmp_path, "unlimited", {})
    mesh.limit(*SLOW)
    base = link_bytes(mesh, *SLOW)
    default = run_job(mesh, tmp_path, "default", {})
    carried = link_bytes(mesh, *SLOW) - base
    socket_only = run_job(mesh, tmp_path, "shm0", {"NPUSIM_SHM": "0"})

    wire = carried / RATE                  # the link's own time for what it carried
    print(f"observed: load {load}; loop of {STEPS} x 256 KiB AllReduce: unlimited "
          f"{free['loop']:.2f} s, link {SLOW[0]}->{SLOW[1]} at 40 Mbit/s: default "
          f"{default['loop']:.2f} s, NPUSIM_SHM=0 {socket_only['loop']:.2f} s (x"
          f"{default['loop'] / free['loop']:.1f} and x{socket_only['loop'] / free['loop']:.1f}; "
          f"the link carried {carried / 2**20:.1f} MiB: {wire:.2f} s on the wire, expected "
          f"at most x{(wire + free['loop']) / free['loop']:.1f}); wall of the jobs "
          f"{free['wall']:.1f} / {default['wall']:.1f} / {socket_only['wall']:.1f} s")
    for name, job in (("default", default), ("NPUSIM_SHM=0", socket_only)):
        for node, out in enumerate(job["outs"]):
            for line in slow_lines([out]):
                print(f"observed: {name}, node {node}'s npurun: {line.strip()}")

    for job in (free, default, socket_only):     # nodes are nodes: no shared memory, no pids
        for r, res in job["results"].items():
            assert res["local"] == [] and res["procs"] == [], (r, res)
    # the slow link carries rank 1's buffer once per collective (the star's leaf -> hub)
    assert carried >= (STEPS + 1) * COUNT * 4, carried
    # default settings take as long as NPUSIM_SHM=0: both go through the slow link
    assert 0.8 <= default["loop"] / socket_only["loop"] <= 1.25, (default["loop"],
                                                                 socket_only["loop"])
    # ... and as long as the unlimited run plus the link's time for what it carried
    # (tbf cannot send faster than its rate; 20 % + 1 s for a loaded machine)
    for job in (default, socket_only):
        assert 0.95 * wire <= job["loop"] <= 1.2 * (wire + free["loop"]) + 1.0, (job["loop"],
                                                                                 wire)

    # over the unlimited link nobody is named
    assert slow_lines(free["outs"]) == [] and set(free["reports"].values()) == {None}
    expect = COUNT * 4 / RATE              # one 256 KiB message at 40 Mbit/s: 52 ms
    for job in (default, socket_only):
        for node in range(NODES):           # every node's npurun names it
            text = job["outs"][node]
            assert "slow rank(s): [1] in comm world: slow inside the collective" in text, text
            assert "slow link(s): 1->0 (median" in text, text
            (f,) = job["reports"][node]["findings"]
            assert f["ranks"] == [1] and f["kind"] == "slow inside the collective", f
            assert [(x["src"], x["dst"]) for x in f["links"]] == [SLOW], f
            assert 0.85 * expect <= f["lateness"] <= 1.5 * expect, (f["lateness"], expect)
