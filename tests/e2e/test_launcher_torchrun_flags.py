"""torchrun's rendezvous and console flags, end to end: the most common torchrun command line
(``--rdzv-backend=c10d --rdzv-endpoint=localhost:PORT``) runs as is under npurun."""
from __future__ import annotations

import os
import socket
import textwrap

import pytest

from tests.leakcheck import LeakCheck, run_npurun

SCRIPT = """
import os, sys
e = os.environ
print(f"rank {e['RANK']} store {e['MASTER_ADDR']}:{e['MASTER_PORT']} run {e['TORCHELASTIC_RUN_ID']}"
      f" world {e['WORLD_SIZE']}")
print(f"err of {e['RANK']}", file=sys.stderr)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_c10d_endpoint_rdzv_id_conf_and_local_ranks_filter(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(textwrap.dedent(SCRIPT))
    port = free_port()
    logs = tmp_path / "logs"
    with LeakCheck() as lc:
        res = run_npurun("--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{port}",
                         "--rdzv-id=myrun", "--rdzv-conf=join_timeout=30,read_timeout=60",
                         "--local-ranks-filter=1", "--nproc-per-node=3", "--log-dir", str(logs),
                         "--tee", "3", str(script), env=lc.env, cwd=str(tmp_path), timeout=50)
    assert res.returncode == 0, res.stderr
    # only rank 1's lines reach the console, and its store is the endpoint's port
    assert res.stdout.splitlines() == [f"[rank 1]: rank 1 store 127.0.0.1:{port} run myrun world 3"]
    assert "[rank 1]: err of 1" in res.stderr
    assert "err of 0" not in res.stderr and "err of 2" not in res.stderr
    # the filter is for the console only: the tee'd log files keep every rank (run id = rdzv id)
    for r in range(3):
        out = (logs / "myrun" / "attempt_0" / str(r) / "stdout.log").read_text()
        assert out.startswith(f"rank {r} store 127.0.0.1:{port} run myrun"), out


@pytest.mark.timeout(60)
def test_status_flag_without_a_running_job(tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    res = run_npurun("--status", env=env, cwd=str(tmp_path), timeout=30)
    assert res.returncode == 1 and "no running npurun job of yours was found" in res.stderr
