"""``torch.UntypedStorage(n, device="npu")`` and what calls it: ``UntypedStorage.clone`` and
``copy.deepcopy`` of a plain npu tensor, which crashed the process (torch asked the PrivateUse1
key's C++ allocator, which a Python backend cannot register). Run in a subprocess: the failure
being tested is a segmentation fault."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

SCRIPT = textwrap.dedent("""
    import copy, torch, torch_npu
    t = torch.arange(6.0, device="npu")
    c = copy.deepcopy(t)
    assert c.device.type == "npu" and torch.equal(c.cpu(), t.cpu())
    assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    v = copy.deepcopy(t[2:4])
    assert torch.equal(v.cpu(), torch.tensor([2.0, 3.0])) and v.storage_offset() == 2
    s = torch.UntypedStorage(8, device="npu")
    assert s.device.type == "npu" and s.nbytes() == 8
    assert torch.UntypedStorage(device="npu").nbytes() == 0
    assert torch.UntypedStorage([1, 2, 3], device="npu").cpu().tolist() == [1, 2, 3]
    assert torch.UntypedStorage(4).device.type == "cpu"
    k = t.untyped_storage().clone()
    assert k.device.type == "npu" and k.cpu().tolist() == t.untyped_storage().cpu().tolist()
    try:
        torch.UntypedStorage(-1, device="npu")
    except RuntimeError as e:
        assert "size=-1" in str(e)
    else:
        raise AssertionError("a negative size was accepted")
    print("OK")
""")


@pytest.mark.timeout(120)
def test_npu_storage_construction_clone_and_deepcopy():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=100)
    assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stderr[-2000:])
