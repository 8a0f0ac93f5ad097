"""Every example runs clean under the stream sanitizer (NPUSIM_STREAM_CHECK=1: a race would raise
StreamRaceError and fail the run), in short variants; and a race under npurun is the rank's
failure, with both enqueue lines in the report."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.leakcheck import LeakCheck, run_npurun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def _env(lc) -> dict:
    return dict(lc.env, NPUSIM_STREAM_CHECK="1")


def _clean(res) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "stream race" not in out and "StreamRaceError" not in out, out[-3000:]


@pytest.mark.timeout(120)
def test_train_ddp_with_its_communication_stream(tmp_path):
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", os.path.join(EXAMPLES, "train_ddp.py"),
                         "--steps", "4", "--batch", "128", "--hidden", "64", "--bucket-mb", "0.02",
                         "--check", env=_env(lc), cwd=str(tmp_path), timeout=110)
    _clean(res)
    assert "CHECK PASS: 2 replicas bitwise identical" in res.stdout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("script,args,expect", [
    ("multistream_overlap.py", ["--chunks", "4", "--chunk-mb", "1", "--repeat", "1"], "results identical"),
    ("acl_streams.py", [], "data round trip OK"),
])
def test_single_process_examples(tmp_path, script, args, expect):
    with LeakCheck() as lc:
        res = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                             env=_env(lc), cwd=str(tmp_path), capture_output=True, text=True,
                             timeout=80)
    _clean(res)
    assert expect in res.stdout


@pytest.mark.timeout(240)
@pytest.mark.needs_torch       # the torch example (tests/conftest.py skips it without torch)
def test_train_torch_ddp_staging(tmp_path):
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", os.path.join(EXAMPLES, "train_torch_ddp.py"),
                         "--check", "--steps", "3", "--batch", "64", env=_env(lc),
                         cwd=str(tmp_path), timeout=220)
    _clean(res)
    assert "CHECK PASS: 2 replicas bitwise identical" in res.stdout


RACE = """
import os, runtime
runtime.set_device(int(os.environ["LOCAL_RANK"]))
a = runtime.zeros(256)
compute, comm = runtime.Stream(name="compute"), runtime.Stream(name="comm")
runtime.launch(lambda x: x.fill(1.0), a, stream=compute, name="produce")
runtime.launch(lambda x: x.sum(), runtime.read_only(a), stream=comm, name="consume")
"""


@pytest.mark.timeout(90)
def test_a_race_under_npurun_is_the_ranks_failure(tmp_path):
    script = tmp_path / "race.py"
    script.write_text(RACE)
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", str(script), env=_env(lc), cwd=str(tmp_path),
                         timeout=80)
    assert res.returncode == 1
    out = res.stdout + res.stderr
    assert "Root Cause (first observed failure)" in out
    assert "runtime.errors.StreamRaceError: stream race: 'consume' on comm reads 1024 bytes " \
           "that 'produce' on compute writes" in out
    assert f"first:  write by 'produce' on compute, enqueued at {script}:6" in out
    assert f"second: read by 'consume' on comm, enqueued at {script}:7" in out
