"""A slow link named as such: two network namespaces joined by a veth pair whose end in B is
rate-limited (``tc ... tbf rate 40mbit``, what this kernel has; netem is not in it), one npurun
per namespace, one rank each. The rank in B sends every message over the slow link: npurun must
name it "slow inside the collective", not "late to arrive". Skipped where namespaces cannot be
made (not root, no iproute2 / tc / unshare), with the reason."""
from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import textwrap

import pytest

from tests.leakcheck import LeakCheck, npurun_cmd
from tests.faults.test_link_cut import sh, two_nodes  # noqa: F401 - the fixture

RANK = """
import os, numpy as np, runtime, hccl
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
x = runtime.to_device(np.zeros({count}, dtype=np.float32))
for i in range({steps}):
    comm.all_reduce(x)
    runtime.synchronize()
comm.destroy()
"""


@pytest.mark.timeout(300)
@pytest.mark.slow
@pytest.mark.parametrize("limited", [True, False], ids=["tbf-40mbit", "unlimited"])
def test_rank_behind_a_rate_limited_link_is_slow_inside_the_collective(tmp_path, two_nodes,
                                                                       limited):
    a, b, ipa, _, _, vb = two_nodes
    if not shutil.which("tc"):
        pytest.skip("needs tc (iproute2) to rate-limit the link")
    if limited:
        r = sh("ip", "netns", "exec", b, "tc", "qdisc", "add", "dev", vb, "root", "tbf", "rate",
               "40mbit", "burst", "64kb", "latency", "400ms")
        if r.returncode:
            pytest.skip(f"cannot rate-limit the veth with tbf: {r.stderr.strip()}")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK.format(count=65536, steps=240)))
    port = random.randint(30000, 39999)
    procs = []
    with LeakCheck(grace=20) as lc:
        lc.env.update({"NPUSIM_JOB_SECRET": secrets.token_hex(32), "HCCL_EXEC_TIMEOUT": "60"})
        try:
            for ns, node in ((a, 0), (b, 1)):
                cmd = ["ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--mount-proc",
                       "--kill-child", *npurun_cmd("--nnodes", "2", "--nproc-per-node", "1",
                                                   "--node-rank", str(node), "--master-addr", ipa,
                                                   "--master-port", str(port),
                                                   "--log-dir", str(tmp_path / f"logs{node}"),
                                                   str(script))]
                procs.append(subprocess.Popen(cmd, env=lc.env, cwd=tmp_path,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            outs = [p.communicate(timeout=240)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    assert [p.returncode for p in procs] == [0, 0], outs
    if not limited:                      # the same job over a healthy link: nobody is named
        assert "slow rank(s)" not in outs[0] + outs[1], [ln for o in outs for ln in o.splitlines()
                                                         if "slow rank" in ln]
        assert not (tmp_path / "logs0" / "failslow_report.json").exists()
        return
    report = json.loads((tmp_path / "logs0" / "failslow_report.json").read_text())
    (f,) = report["findings"]
    print(f"observed: {f}")
    assert f["ranks"] == [1] and f["kind"] == "slow inside the collective", f
    # 256 KiB (a ring of 2: two 128 KiB messages) at 40 Mbit/s: 26 ms each on the wire; the
    # bounds leave room for a loaded machine
    assert 0.010 <= f["lateness"] <= 0.3, f
    assert "slow rank(s): [1] in comm world: slow inside the collective" in outs[0]
