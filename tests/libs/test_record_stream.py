"""``Tensor.record_stream`` on npu keeps the memory for the recorded stream's work.

DeepSpeed ZeRO-3 gathers a parameter on its all-gather stream, computes with it on the default
stream, then ``param.data.record_stream(current_stream())`` and frees it. Before, the npu
kernel accepted the call and did nothing: the pool gave the memory back in the all-gather
stream's order while the default stream could still read it, and ZeRO-3's losses on npu came
out wrong from the first step (tests/libs/test_deepspeed.py). npusim's stream sanitizer names
that free; with the stream recorded it has nothing to name.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

from tests.libs import harness  # noqa: E402

CODE = """
import torch, torch_npu
torch.npu.set_device(0)
side = torch.npu.Stream()
with torch.npu.stream(side):
    w = torch.ones(64, 64, device="npu")          # allocated on the side stream
torch.npu.current_stream().wait_stream(side)
out = w @ w                                       # read on the default stream
{record}
del w                                             # freed by the garbage collector
torch.npu.synchronize()
print(float(out.sum()))
"""


def _run(record: str):
    env = dict(os.environ, PYTHONPATH=harness.ROOT, NPUSIM_STREAM_CHECK="raise")
    for k in ("RANK", "LOCAL_RANK", "NPUSIM_JOB_ID"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-c", CODE.format(record=record)], env=env,
                          capture_output=True, text=True, timeout=100)


@pytest.mark.timeout(200)
def test_record_stream_keeps_the_memory_for_that_streams_work():
    res = _run("w.record_stream(torch.npu.current_stream())")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["262144.0"]
    assert "stream race" not in res.stderr, res.stderr[-3000:]
    # without record_stream the sanitizer names the free (the test sees the race it guards)
    res = _run("")
    assert "stream race: free by the garbage collector" in res.stderr, res.stderr[-3000:]
