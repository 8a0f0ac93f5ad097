"""Ascend's own pyACL memory samples, unmodified but for the import line, run to their end.

The samples are Ascend's code and are not copied into this repository: point
NPUSIM_ASCEND_SAMPLES at a checkout of github.com/Ascend/samples to run them (docs/acl.md).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.environ.get("NPUSIM_ASCEND_SAMPLES", "")
MEMORY = "python/level1_single_api/1_acl/2_memory_management"
CASES = {
    "memcpy_host_device": (f"{MEMORY}/memcpy_host_device_python/src/memcpy_host_device.py",
                           ["--release_cycle", "2", "--number_of_cycles", "2",
                            "--memory_size", "1048576", "--write_back_host"]),
    "memcpy_host_device_async": (
        f"{MEMORY}/memcpy_host_device_async_python/src/memcpy_host_device_async_python.py",
        ["--memory_size", "1048576"]),
}

pytestmark = pytest.mark.skipif(
    not SAMPLES, reason="NPUSIM_ASCEND_SAMPLES is not set: point it at a checkout of "
                        "github.com/Ascend/samples (its code is not vendored here)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_sample_runs_to_its_end(name, tmp_path):
    rel, args = CASES[name]
    src = open(os.path.join(SAMPLES, rel)).read()
    assert re.search(r"^import acl$", src, re.M), "the sample no longer imports acl plainly"
    script = tmp_path / os.path.basename(rel)
    script.write_text(re.sub(r"^import acl$", "from runtime import acl", src, flags=re.M))
    env = dict(os.environ, PYTHONPATH=ROOT, NPUSIM_HBM_BYTES=str(1 << 30))
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                         timeout=100, env=env, cwd=str(tmp_path))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    frees = [int(m) for m in re.findall(r"HBM free memory:(\d+) Byte", out)]
    assert frees and frees[-1] == frees[0] == 1 << 30, out     # every byte given back
    failed = re.findall(r"(acl\.\S+) failed ret = (\d+)", out)
    if name == "memcpy_host_device":
        assert failed == [], out
    else:   # each cycle names DEVICE_TO_HOST for a host-to-host copy; npusim checks kinds
        assert failed == [("acl.rt.memcpy", "107000")] * 2, out
        assert "run success!" in out
