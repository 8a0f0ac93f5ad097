"""The OpInfo conformance sweep (benchmarks/opinfo_sweep.py): torch's own operator database run on
npu and on CPU, compared bitwise; and the device fixes the sweep found, each by name."""
import json
import os
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------- fixes the sweep found
def test_storage_lock_survives_a_gc_callback_under_it():
    """The garbage collector may run an npu storage's weakref callback (storage._forget) on the
    thread that holds storage._lock, from an allocation inside it: the sweep hung there (cdist's
    gradient) while the lock was not re-entrant."""
    from runtime.torch import storage as S
    done = threading.Event()

    def under_lock():
        with S._lock:
            S._forget(-1, object())      # what the callback runs (no such address)
        done.set()
    threading.Thread(target=under_lock, daemon=True).start()
    assert done.wait(10), "storage._forget deadlocked under storage._lock"


def test_resize_to_the_same_sizes_keeps_strides():
    """torch's resize_ keeps the strides when the sizes do not change; composite out= kernels
    (softmax's) resize a non-contiguous out= to its own sizes and must not make it contiguous."""
    torch.npu.set_device(0)
    base = torch.zeros(5, 10, device="npu")
    out = base[:, ::2]
    assert out.stride() == (10, 2)
    out.resize_(5, 5)
    assert out.stride() == (10, 2) and out.data_ptr() == base.data_ptr()
    x = torch.randn(5, 5)
    cpu_out = torch.zeros(5, 10)[:, ::2]
    torch.softmax(x, 1, out=cpu_out)
    torch.softmax(x.to("npu"), 1, out=out)
    assert out.stride() == cpu_out.stride() == (10, 2)
    assert torch.equal(out.cpu().view(torch.int32), cpu_out.view(torch.int32))
    assert torch.equal(base.cpu()[:, 1::2], torch.zeros(5, 5))     # the gaps are not written
