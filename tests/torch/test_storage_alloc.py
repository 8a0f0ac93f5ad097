"""The npu tensor's allocation (runtime/torch/storage.py): the _Owner is the allocation (a
DeviceBuffer that frees its memory when it dies), and a result's numpy view and CPU tensor are
left with its parked memory for the next result of the same dtype and shape ("Reuse" in the
note): the same bits, the pool's exact statistics, and never for a result they do not fit."""
import ctypes
import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime.torch import storage as S  # noqa: E402


@pytest.fixture(autouse=True)
def _device():
    torch.npu.set_device(0)
    torch.npu.synchronize()         # an idle stream: a freed block is parked ready
    torch.npu.empty_cache()         # and room in the front cache (a full one merges a free)
    yield
    torch.npu.synchronize()


def _cpu(t):
    return S.owner_of(t).cpu


def test_the_owner_is_the_allocation_and_frees_its_memory_when_the_tensor_dies():
    before = torch.npu.memory_allocated()
    t = torch.empty(100, 7, device="npu")
    o = S.owner_of(t)
    assert o.dev is o and isinstance(o, runtime.memory.DeviceBuffer)
    assert runtime.buffer_nbytes(o.dev) == 2800 and o.ptr.device_id == 0
    assert "npu storage memory (2800 bytes on device 0)" == repr(o)
    assert torch.npu.memory_allocated() == before + 3072           # rounded to 512
    ref = weakref.ref(o)
    del t, o
    assert ref() is None and torch.npu.memory_allocated() == before   # at once, no gc
    assert o_view_frees_nothing()


def o_view_frees_nothing() -> bool:
    """A numpy view of an owner is an _Owner without the attributes: its death frees nothing."""
    t = torch.ones(64, device="npu")
    before = torch.npu.memory_allocated()
    v = S.owner_of(t)[2:]
    assert type(v) is S._Owner and "a numpy view" in repr(v)
    del v
    assert torch.npu.memory_allocated() == before and torch.equal(t.cpu(), torch.ones(64))
    return True


def test_a_result_at_a_parked_address_gets_the_view_of_its_dtype_and_shape_again():
    x = torch.full((64, 64), 1.0, device="npu")
    addr, cpu = x.untyped_storage().data_ptr(), _cpu(x)
    del x
    y = torch.full((64, 64), 2.0, device="npu")        # the parked block: the same address
    assert y.untyped_storage().data_ptr() == addr and _cpu(y) is cpu
    assert torch.equal(y.cpu(), torch.full((64, 64), 2.0))
    assert torch.equal((y + y).cpu(), torch.full((64, 64), 4.0))
    del y
    z = torch.full((32, 128), 3.0, device="npu")       # same bytes, another shape: a new view
    assert z.untyped_storage().data_ptr() == addr and _cpu(z) is not cpu
    assert _cpu(z).shape == (32, 128) and torch.equal(z.cpu(), torch.full((32, 128), 3.0))
    del z
    w = torch.full((64, 64), 5, dtype=torch.int32, device="npu")    # another dtype: new too
    assert _cpu(w).dtype == torch.int32 and torch.equal(w.cpu(), torch.full((64, 64), 5,
                                                                             dtype=torch.int32))


def test_what_was_left_goes_when_the_memory_merges():
    x = torch.empty(64, 64, device="npu")
    cpu = weakref.ref(_cpu(x))
    del x
    assert cpu() is not None                            # left with the parked block
    torch.npu.empty_cache()                             # flushes the front cache
    gc.collect()
    assert cpu() is None


def test_a_view_a_kernel_changed_is_not_left_for_another_result():
    x = torch.empty(64, 64, device="npu")
    cpu = _cpu(x)
    S.forget_cpu_view(x)
    del x
    y = torch.empty(64, 64, device="npu")
    assert _cpu(y) is not cpu


def test_an_inference_tensor_is_never_left_for_a_result_outside_the_mode():
    with torch.inference_mode():
        x = torch.empty(64, 64, device="npu")
        assert _cpu(x).is_inference()
        del x
    y = torch.zeros(64, 64, device="npu")
    assert not _cpu(y).is_inference()
    y.add_(1)                                           # written through its CPU view
    assert torch.equal(y.cpu(), torch.ones(64, 64))


def test_statistics_are_exact_through_reuse():
    torch.npu.empty_cache()
    base = torch.npu.memory_stats()
    for _ in range(50):
        a = torch.ones(64, 64, device="npu")
        b = a * 2
        del a, b
    s = torch.npu.memory_stats()
    assert s["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert s["allocation.all.current"] == base["allocation.all.current"]
    assert s["allocation.all.allocated"] - base["allocation.all.allocated"] == 100
    assert s["allocated_bytes.all.allocated"] - base["allocated_bytes.all.allocated"] == \
        100 * 16384
    assert s["allocated_bytes.all.peak"] >= base["allocated_bytes.all.current"] + 2 * 16384


def test_the_capsule_device_leaves_ctypes_pythonapi_alone():
    """storage.py writes the DLPack device through a prototype of its own: the process's shared
    ``ctypes.pythonapi.PyCapsule_GetPointer`` keeps ctypes' defaults."""
    f = ctypes.pythonapi.PyCapsule_GetPointer
    assert f.restype is ctypes.c_int and f.argtypes is None
    t = torch.arange(6.0, device="npu:1")
    assert t.device == torch.device("npu", 1) and torch.equal(t.cpu(), torch.arange(6.0))


def test_the_pointer_is_made_when_asked_and_names_the_allocation():
    t = torch.empty(100, 7, device="npu")
    o = S.owner_of(t)
    p = o.ptr
    assert p == o.ptr and p is not o.ptr                # made per ask, equal by value
    assert p.allocation()[1] == 2800 and p.addr == o.dev.device_ptr("buf").addr
    with pytest.raises(AttributeError, match="no pointer"):
        o[1:].ptr


def test_a_free_while_the_pool_is_busy_waits_for_the_next_memory_call():
    """The garbage collector may free inside a pool call on the same thread: the device lock is
    held, so the free is queued (never blocks) and done by the next memory call."""
    from runtime.memory.alloc import current_context
    before = torch.npu.memory_allocated()
    t = torch.empty(64, 64, device="npu")
    ctx = current_context()
    with ctx.lock:
        del t                                           # the owner dies with the lock held
        assert len(ctx.deferred) == 1
    assert torch.npu.memory_allocated() == before and not ctx.deferred


def test_a_failure_before_the_owner_holds_the_memory_frees_it(monkeypatch):
    before = torch.npu.memory_allocated()

    def broken(*args):
        raise RuntimeError("injected: no view")
    monkeypatch.setattr(S, "host_array", broken)
    with pytest.raises(RuntimeError, match="injected"):
        torch.empty(3, 333, device="npu")
    assert torch.npu.memory_allocated() == before


def test_a_result_of_another_shape_takes_what_was_left_and_leaves_its_own():
    x = torch.empty(64, 64, device="npu")
    block = S.owner_of(x).block
    del x
    y = torch.empty(32, 128, device="npu")              # the same parked block, another shape
    assert S.owner_of(y).block.addr == block.addr and S.owner_of(y).block.reuse is None
    cpu = _cpu(y)
    del y
    z = torch.empty(32, 128, device="npu")
    assert _cpu(z) is cpu
