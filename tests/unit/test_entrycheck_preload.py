"""launcher.agent.entrycheck.preload_for: what the fork server imports for a script (torch when the
script imports it at its top level; torch._dynamo when it uses DDP or torch.compile)."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest

from launcher.agent.entrycheck import preload_for

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _args(tmp_path, text):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(text))
    return [str(path), "--flag"]


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_a_ddp_script_gets_torch_and_dynamo(tmp_path):
    got = preload_for(_args(tmp_path, """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from hccl import torch_backend
        """))
    assert got == ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
                   "hccl.torch_backend"]


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_without_ddp_gets_torch_only(tmp_path):
    assert preload_for(_args(tmp_path, "import torch\nx = torch.ones(2)\n")) == \
        ["torch", "torch.distributed"]


def test_nothing_for_imports_below_the_top_level_modules_programs_and_bad_scripts(tmp_path):
    assert preload_for(_args(tmp_path, "def f():\n    import torch\n")) == []
    assert preload_for(_args(tmp_path, "import numpy\n")) == []
    assert preload_for(_args(tmp_path, "import torch\nprint('hi'\n")) == []
    assert preload_for(["-m", "torch"]) == []
    assert preload_for([str(tmp_path / "missing.py")]) == []
    assert preload_for(None) == []
