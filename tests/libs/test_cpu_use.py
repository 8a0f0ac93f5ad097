"""transformers and accelerate imported and run on CPU in a venv with npusim installed, the
script never importing torch_npu (tests/libs/cpu_use_job.py): the same numbers as with
torch_npu unimportable, as on a CPU machine with the real torch_npu installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install torch "
                            "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("transformers", reason="transformers is not installed: pip install -e "
                    "'.[libs]'")
pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -e '.[libs]'")

from tests.libs import harness  # noqa: E402


def _run(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=harness.ROOT, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, harness.job_path("cpu_use_job.py"), *args], env=env,
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_transformers_and_accelerate_on_cpu_with_npusim_installed(tmp_path):
    with_npusim = _run(tmp_path, str(tmp_path / "a"))
    without = _run(tmp_path, str(tmp_path / "b"), "--hide-torch-npu")
    assert not without.pop("torch_npu_imported")
    # the libraries found npusim's torch_npu and imported it, and still computed on CPU
    assert with_npusim.pop("torch_npu_imported")
    assert with_npusim["accelerator_device"] == "cpu"
    assert with_npusim == without


@pytest.mark.timeout(120)
def test_npu_empty_cache_before_any_device_is_a_no_op():
    """accelerate's free_memory() calls torch.npu.empty_cache() on CPU runs too (the Trainer's
    first lines); before any NPU is in use there is nothing cached, as torch.cuda's."""
    pytest.importorskip("torch_npu")
    code = ("import torch, torch_npu, runtime\n"
            "torch.npu.empty_cache()\n"
            "torch.npu.set_device(0)\n"
            "x = torch.ones(1 << 20, device='npu'); del x\n"
            "torch.npu.synchronize()\n"           # the free has passed its stream
            "before = torch.npu.memory_reserved()\n"
            "torch.npu.empty_cache()\n"
            "print(before, torch.npu.memory_reserved())\n")
    env = dict(os.environ, PYTHONPATH=harness.ROOT)
    for k in ("RANK", "LOCAL_RANK", "NPUSIM_JOB_ID"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    before, after = map(int, res.stdout.split())
    assert before >= 4 << 20 and after < before
