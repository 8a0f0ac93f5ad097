"""The link between two nodes cut mid-job: two network namespaces joined by a veth pair, one
npurun in each (each in its own pid namespace too, so the ranks are on different nodes for
npusim: no shared memory and no pid watch across them), then the veth brought down.

Bound (tests/bounds.py): a link to another node carries ZeroMQ heartbeats; with no answer for
NPUSIM_HEARTBEAT_TIMEOUT (3 s here) it breaks, and a rank waiting on that peer names it after the
next liveness check and the grace (0.5 + 2 s): 5.5 s. Under npurun a failing rank first
publishes its state to the job's store (hccl.diag); a rank of node 1 cannot reach it any more, so
its error reaches the user only after that write gives up (hccl.diag.FLUSH_TIMEOUT, 10 s):
15.5 s. Each is asserted with the slack of tests/bounds.py. The link is cut once every rank has
completed a collective across it (``running.<rank>``). Every
rank names a rank of the other node. Skipped where namespaces cannot be made (not root, no
iproute2, no unshare).
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests import bounds
from tests.leakcheck import LeakCheck, npurun_cmd, wait_for

HEARTBEAT = bounds.HEARTBEAT
STORE_TIMEOUT = 15.0        # HCCL_CONNECT_TIMEOUT: the store's own timeout, above FLUSH_TIMEOUT

RANK = """
import json, os, signal, sys, time
import numpy as np
# node 1's npurun stops its ranks when it loses the store on node 0: outlive that to report
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import runtime, hccl
from runtime.errors import TaskError
out = {out!r}
r = int(os.environ["RANK"])
if {diag_off!r}:
    os.environ["NPUSIM_DIAG"] = "0"   # no state publication to the job's store
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
x = runtime.to_device(np.ones({count}, np.float32))
y = runtime.empty({count}, np.float32)
with open(os.path.join(out, f"ready.{{r}}.tmp"), "w") as f:   # whole or absent: the test reads
    f.write(str(os.getpid()))                                 # it as soon as it exists
os.replace(os.path.join(out, f"ready.{{r}}.tmp"), os.path.join(out, f"ready.{{r}}"))
res = {{}}
try:
    for i in range(10 ** 6):
        comm.all_reduce(x, y)
        runtime.current_stream().synchronize()
        if i == 0:   # a collective across the link done: the test may cut it
            open(os.path.join(out, f"running.{{r}}"), "w").close()
except Exception as e:
    err = e.__cause__ if isinstance(e, TaskError) and e.__cause__ is not None else e
    res = {{"t": time.time(), "iters": i, "type": type(err).__name__,
           "rank": getattr(err, "rank", None), "text": str(err)}}
with open(os.path.join(out, f"result.{{r}}.tmp"), "w") as f:
    json.dump(res, f)
os.replace(os.path.join(out, f"result.{{r}}.tmp"), os.path.join(out, f"result.{{r}}"))
sys.exit(1)
"""


def sh(*args):
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_nodes():
    """Namespaces (A, B) joined by veth (vA in A, vB in B); yields (A, B, ipA, ipB, vA, vB)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs root, iproute2 and unshare to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    a, b, va, vb = f"npf{tag}a", f"npf{tag}b", f"vf{tag}a", f"vf{tag}b"
    net = f"10.{random.randint(64, 250)}.{random.randint(0, 250)}"
    ipa, ipb = f"{net}.1", f"{net}.2"
    made = []
    try:
        for cmd in (["ip", "netns", "add", a], ["ip", "netns", "add", b]):
            r = sh(*cmd)
            if r.returncode:
                pytest.skip(f"cannot make a network namespace: {r.stderr.strip()}")
            made.append(cmd[-1])
        for cmd in (["ip", "link", "add", va, "type", "veth", "peer", "name", vb],
                    ["ip", "link", "set", va, "netns", a], ["ip", "link", "set", vb, "netns", b],
                    ["ip", "-n", a, "addr", "add", f"{ipa}/24", "dev", va],
                    ["ip", "-n", b, "addr", "add", f"{ipb}/24", "dev", vb],
                    ["ip", "-n", a, "link", "set", va, "up"], ["ip", "-n", b, "link", "set", vb, "up"],
                    ["ip", "-n", a, "link", "set", "lo", "up"],
                    ["ip", "-n", b, "link", "set", "lo", "up"]):
            r = sh(*cmd)
            if r.returncode:
                pytest.skip(f"cannot join namespaces with a veth pair ({' '.join(cmd)}): "
                            f"{r.stderr.strip()}")
        yield a, b, ipa, ipb, va, vb
    finally:
        for ns in made:   # deleting a namespace deletes its end of the veth, and the pair
            sh("ip", "netns", "del", ns)
        sh("ip", "link", "del", va)


def queued_to(ns: str, ip: str) -> int:
    """Bytes sent from namespace ``ns`` to ``ip`` and not yet acknowledged (``ss``'s Send-Q)."""
    out = sh("ip", "netns", "exec", ns, "ss", "-tnH", "state", "established", "dst", ip).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("diag_off,in_flight", [
    (False, False), pytest.param(True, False, marks=pytest.mark.slow), (False, True)],
    ids=["npurun", "diag-off", "in-flight"])
def test_cut_link_between_nodes_every_rank_names_the_other_node(tmp_path, two_nodes, diag_off,
                                                                in_flight):
    """With diag off (the rank sets NPUSIM_DIAG=0) no rank writes to the store before raising,
    so every rank's bound is the transport's: heartbeat timeout + 2.5 s (tests/bounds.py).

    ``in-flight``: 4 MiB collectives over a link slowed to 40 Mbit/s (``tc tbf`` on both ends),
    cut while node 0 has bytes queued to node 1. libzmq sends no heartbeat behind unsent bytes,
    so that link breaks only through the kernel's limit on unacknowledged data (TCP_MAXRT);
    without it node 0's ranks waited for npurun's node timeout (30 s)."""
    a, b, ipa, ipb, va, vb = two_nodes
    bound = bounds.LINK_CUT_DIAG_OFF_ASSERTED if diag_off else bounds.LINK_CUT_ASSERTED
    if in_flight:
        if not (shutil.which("tc") and shutil.which("ss")):
            pytest.skip("needs tc and ss (iproute2) to slow the link and see its queue")
        for ns, dev in ((a, va), (b, vb)):
            r = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                   "rate", "40mbit", "burst", "64kb", "latency", "2s")
            if r.returncode:
                pytest.skip(f"cannot slow the link with tc tbf: {r.stderr.strip()}")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK.format(out=str(tmp_path), diag_off=diag_off,
                                                  count=1 << 20 if in_flight else 1 << 16)))
    port = random.randint(30000, 39999)
    procs = []
    with LeakCheck(grace=20) as lc:
        lc.env.update({"NPUSIM_JOB_SECRET": secrets.token_hex(32), "HCCL_EXEC_TIMEOUT": "120",
                       "NPUSIM_HEARTBEAT_TIMEOUT": str(HEARTBEAT),
                       "HCCL_CONNECT_TIMEOUT": str(STORE_TIMEOUT), "NPUSIM_STOP_GRACE": "90"})
        try:
            for ns, node in ((a, 0), (b, 1)):
                # --kill-child: the namespace's processes die with this process (cleanup)
                cmd = ["ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--mount-proc",
                       "--kill-child", *npurun_cmd("--nnodes", "2", "--nproc-per-node", "2",
                                                   "--node-rank", str(node), "--master-addr", ipa,
                                                   "--master-port", str(port), str(script))]
                procs.append(subprocess.Popen(cmd, env=lc.env, cwd=tmp_path, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(4))
                     or any(p.poll() is not None for p in procs), 90, what="4 ranks ready")
            assert all((tmp_path / f"ready.{r}").exists() for r in range(4)), \
                [p.poll() for p in procs]
            wait_for(lambda: all((tmp_path / f"running.{r}").exists() for r in range(4))
                     or any(p.poll() is not None for p in procs), 60, what="collectives running")
            assert all((tmp_path / f"running.{r}").exists() for r in range(4)), \
                [p.poll() for p in procs]
            if in_flight:   # a 4 MiB step takes ~1 s on this link: bytes queued at most looks
                wait_for(lambda: queued_to(a, ipb) > 0, 30, what="bytes queued to node 1")
            t_cut = time.time()
            assert sh("ip", "-n", a, "link", "set", va, "down").returncode == 0
            try:
                wait_for(lambda: all((tmp_path / f"result.{r}").exists() for r in range(4)),
                         bound + 30, what="every rank's error")
            except AssertionError:
                for p in procs:
                    p.send_signal(signal.SIGKILL)
                raise AssertionError(f"results: {sorted(os.listdir(tmp_path))}; output: "
                                     f"{[p.communicate(timeout=10)[0][-3000:] for p in procs]}")
            results = {r: json.loads((tmp_path / f"result.{r}").read_text()) for r in range(4)}
            for p in procs:
                p.wait(60)
        finally:
            outs = []
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                p.wait(10)
                if not p.stdout.closed:   # communicate() above read and closed it
                    outs.append(p.stdout.read())
                    p.stdout.close()
    lat = {r: round(res["t"] - t_cut, 2) for r, res in results.items() if "t" in res}
    print(f"observed: link cut (diag off: {diag_off}, in flight: {in_flight}) -> errors after "
          f"{lat} s")
    for r, res in results.items():
        other = {2, 3} if r < 2 else {0, 1}
        assert res.get("type") == "RemoteRankError", (r, res, outs)
        assert res["rank"] in other, (r, res)
        assert res["t"] - t_cut < bound, (r, res["t"] - t_cut)
