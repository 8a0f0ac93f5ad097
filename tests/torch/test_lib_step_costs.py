"""The per-step queries of the library steps outside the operator kernels (issue 52): torch's
device guard (runtime/torch/guard.py), the thread's device and current stream as the operator
path reads them (runtime/torch/device.py ``current``, runtime/current.py ``current_stream``) and
``torch.npu.current_stream`` / ``default_stream``: the same answers as the general path, also
after ``set_device``, inside ``with stream(...)``, on other threads and after ``reset_device``;
and a tiny Llama training step on npu bitwise equal to CPU eager.

Each test that binds a device runs on a fresh thread (``on_thread``, tests/torch/threads_util.py):
the device a thread is bound to is per thread, so the pytest thread is left as it was.
"""
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime import current as rt_current  # noqa: E402
from runtime.errors import ContextError  # noqa: E402
from runtime.torch import device as npu_device  # noqa: E402
from runtime.torch import guard  # noqa: E402
from tests.torch.threads_util import on_thread  # noqa: E402


def _bits(t):
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8)


# ---------------------------------------------------------------------- the device guard
def test_guard_type_answers_privateuse1_without_a_python_frame():
    g = guard.DeviceGuard()
    assert g.type_() == torch._C._autograd.DeviceType.PrivateUse1
    assert guard.DeviceGuard.type_() == torch._C._autograd.DeviceType.PrivateUse1
    # a C callable (no Python function, hence no frame per call from torch's C++)
    assert not hasattr(guard.DeviceGuard.type_, "__code__")
    # torch's C++ side asks the registered guard: its answers go through type_
    assert torch.accelerator.current_device_index() == 0
    assert torch._C._get_accelerator().type == "npu"


def test_backward_through_the_guard_equals_cpu_bitwise():
    def run(dev):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3)).to(dev)
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)).to(dev)
        loss = m(x).pow(2).mean()
        loss.backward()
        return [loss] + [p.grad for p in m.parameters()]

    def on_npu():
        runtime.set_device(0)
        return run("npu")
    for a, b in zip(run("cpu"), on_thread(on_npu)):
        assert b.device.type == "npu"
        assert torch.equal(_bits(a), _bits(b))


# ---------------------------------------------------------------------- device.current
def test_current_follows_set_device_and_threads():
    def body():
        runtime.set_device(2)
        assert npu_device.current() == 2 == runtime.get_device()
        runtime.set_device(3)
        assert npu_device.current() == 3 == runtime.get_device()
        seen = on_thread(lambda: (npu_device.current(), runtime.get_device()))
        assert seen[0] == seen[1]            # another thread: its own (the process's) device
        runtime.set_device(0)
        assert npu_device.current() == 0
        return True
    assert on_thread(body)


def test_current_after_reset_device_of_the_threads_device():
    """A device reset removes its context: the thread's cached index must not survive it."""
    bound, reset_done = threading.Event(), threading.Event()
    out = {}

    def worker():
        runtime.set_device(6)
        out["before"] = npu_device.current()
        bound.set()
        assert reset_done.wait(60), "the reset did not come"
        # the context of device 6 is gone, the thread still names it: the full path chooses
        # the default device again, as runtime.set_device() does
        out["after"] = npu_device.current()
        out["runtime"] = runtime.get_device()
        out["stream_device"] = rt_current.current_stream().device_id

    t = threading.Thread(target=worker, name="lib-step-reset")
    t.start()
    try:
        assert bound.wait(60)
        assert 6 in rt_current.contexts_by_device
        runtime.reset_device(6)
        assert 6 not in rt_current.contexts_by_device
    finally:
        reset_done.set()
        t.join(60)
    assert not t.is_alive()
    assert out["before"] == 6
    assert out["after"] != 6 and out["after"] == out["runtime"] == out["stream_device"]


def test_current_after_reset_on_the_same_thread():
    def body():
        runtime.set_device(7)
        assert npu_device.current() == 7
        runtime.reset_device(7)
        d = npu_device.current()           # chooses a device again, as runtime.get_device() does
        assert d != 7 and d == runtime.get_device()
        assert 7 not in rt_current.contexts_by_device
        return True
    assert on_thread(body)


# ---------------------------------------------------------------------- current streams
def test_runtime_current_stream_follows_blocks_devices_and_set_current_stream():
    def body():
        runtime.set_device(0)
        d0 = runtime.default_stream()
        assert rt_current.current_stream() is d0
        s = runtime.Stream()
        with runtime.stream(s):
            assert rt_current.current_stream() is s
            runtime.set_device(1)          # another device: its own stack
            assert rt_current.current_stream() is runtime.default_stream()
            assert rt_current.current_stream().device_id == 1
            runtime.set_device(0)
            assert rt_current.current_stream() is s
            s2 = runtime.Stream()
            rt_current.set_current_stream(s2)
            assert rt_current.current_stream() is s2
        assert rt_current.current_stream() is d0
        s.synchronize()
        s.destroy()
        s2.destroy()
        return True
    assert on_thread(body)


def test_current_stream_raises_without_a_device_like_current_context(monkeypatch):
    def body():
        monkeypatch.setattr(rt_current, "process_device", None)
        rt_current.thread.device = None
        with pytest.raises(ContextError, match="no NPU device is set"):
            rt_current.current_stream()
        with pytest.raises(ContextError):
            rt_current.current_context()
        return True
    assert on_thread(body)


def test_torch_npu_current_stream_is_the_default_one_and_follows_stream_blocks():
    def body():
        torch.npu.set_device(0)
        a, b = torch.npu.current_stream(), torch.npu.current_stream()
        assert a is b                       # one wrapper of the default stream, kept
        assert a.stream_id == 0 and a.device_index == 0
        assert a == torch.npu.default_stream() and a is torch.npu.default_stream()
        assert a.npu_stream is runtime.default_stream()
        s = torch.npu.Stream()
        with torch.npu.stream(s):
            c = torch.npu.current_stream()
            assert c is s and c.stream_id != 0
            assert torch.npu.current_stream(0) is s
            one = torch.npu.current_stream(1)          # another device: no switch left behind
            assert one.device_index == 1 and one.stream_id == 0
            assert torch.npu.current_device() == 0
            assert torch.npu.current_stream() is s
        assert torch.npu.current_stream() is a
        assert torch.npu.default_stream(1) is torch.npu.current_stream(1)
        assert torch.npu.default_stream(1).npu_stream.device_id == 1
        assert torch.npu.current_device() == 0
        with pytest.raises(RuntimeError, match="Invalid device ordinal"):
            torch.npu.current_stream(99)
        return True
    assert on_thread(body)


# ---------------------------------------------------------------------- a library step
def test_tiny_llama_step_on_npu_equals_cpu_bitwise():
    transformers = pytest.importorskip("transformers")

    def steps(dev):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=32)
        m = transformers.LlamaForCausalLM(cfg).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
        ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1)).to(dev)
        losses = []
        for _ in range(2):
            loss = m(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach() for p in m.parameters()]

    def on_npu():
        runtime.set_device(0)
        return steps("npu")
    (lc, pc), (ln, pn) = steps("cpu"), on_thread(on_npu)
    assert lc == ln
    for a, b in zip(pc, pn):
        assert b.device.type == "npu"
        assert torch.equal(_bits(a), _bits(b))


# ---------------------------------------------------------------------- pinned batches
def test_pin_memory_keeps_empty_likes_strides_and_the_values():
    from runtime.torch import pinned
    g = torch.Generator().manual_seed(3)
    cases = [torch.randint(0, 64, (4, 16), generator=g),                     # a DataLoader batch
             torch.randn(1, 5, generator=g).as_strided((1, 5), (99, 1)),       # odd size-1 stride
             torch.randn(5, 1, generator=g).as_strided((5, 1), (1, 7)),
             torch.randn(3, 4, generator=g).t(),                               # not contiguous
             torch.randn(2, 3, 4, generator=g).permute(2, 0, 1),
             torch.randn((), generator=g), torch.empty(0, 3)]
    for x in cases:
        p = x.pin_memory()
        assert p.is_pinned() and p.device.type == "cpu" and p.dtype == x.dtype
        assert p.stride() == torch.empty_like(x, device="meta").stride()
        assert torch.equal(p, x)
        if p.numel():
            assert p.data_ptr() != x.data_ptr()
            assert p.untyped_storage().data_ptr() in pinned._live
    assert not torch.ones(2, device="npu").is_pinned()
    assert not pinned.is_pinned(torch.empty(2, device="meta"))
    assert not torch.ones(2).is_pinned()


def test_torch_npu_default_stream_after_reset_device_is_the_new_contexts():
    from torch_npu.npu import streams

    def body():
        torch.npu.set_device(5)
        old = torch.npu.current_stream()
        old_rt = old.npu_stream
        assert streams._defaults[5] is old
        runtime.reset_device(5)
        torch.npu.set_device(5)                    # a new context, a new default stream
        new = torch.npu.current_stream()
        assert new is not old and new.npu_stream is not old_rt
        assert new.npu_stream is runtime.default_stream() and new.stream_id == 0
        assert streams._defaults[5] is new          # the old wrapper is not kept
        assert torch.npu.default_stream(5) is new
        torch.npu.set_device(0)
        assert torch.npu.current_stream(5) is new
        return True
    assert on_thread(body)
