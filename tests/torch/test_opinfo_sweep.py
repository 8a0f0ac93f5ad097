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


def test_copy_of_a_conjugate_or_negative_view():
    """A tensor with a conjugate or negative bit copied to or from the npu (``x.conj().cpu()``,
    polar's gradient): torch's fallback for the bits made each copy recurse into itself until
    the process crashed (SIGSEGV); the copy now resolves the bits and is bitwise the CPU's."""
    torch.npu.set_device(0)
    x = torch.tensor([1 + 2j, 3 - 4j, -0.0 + 0.5j])
    n = x.to("npu")
    assert torch.equal(n.conj().cpu(), x.conj().resolve_conj())
    assert torch.equal(torch._neg_view(n).cpu(), torch._neg_view(x).resolve_neg())
    assert torch.equal(torch._neg_view(n.conj()).cpu(),
                       torch._neg_view(x.conj()).resolve_conj().resolve_neg())
    y = torch.zeros(3, dtype=torch.complex64, device="npu")
    y.conj().copy_(x)                   # stores the conjugate
    assert torch.equal(y.cpu(), x.conj().resolve_conj())
    a = torch.tensor(0.7, requires_grad=True)
    b = a.detach().to("npu").requires_grad_()
    g_cpu, = torch.autograd.grad(torch.polar(a, a).sum().abs(), [a])
    g_npu, = torch.autograd.grad(torch.polar(b, b).sum().abs(), [b])
    assert torch.equal(g_npu.cpu().view(torch.int32), g_cpu.view(torch.int32))
