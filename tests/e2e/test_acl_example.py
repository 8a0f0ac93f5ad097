"""examples/acl_streams.py, a pyACL sample with only its import line changed, end to end."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(120)
def test_acl_streams_example_runs_and_round_trips(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, NPUSIM_HBM_BYTES=str(1 << 30))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "acl_streams.py")],
                         capture_output=True, text=True, timeout=100, cwd=str(tmp_path), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    m = re.search(r"H2D on stream 1, event, D2D on stream 2: 4 MiB in (\d+\.\d+) ms", out)
    assert m and float(m.group(1)) >= 0.0, out
    assert "stop event status 0 (0 = ACL_EVENT_STATUS_COMPLETE)" in out
    m = re.search(r"device 0: (\d+) MiB free of (\d+) MiB", out)
    assert m and int(m.group(2)) == 1024 and int(m.group(1)) < 1024, out
    assert "data round trip OK" in out
    assert "ERROR" not in res.stderr, res.stderr     # no acl call failed
