"""Device indices of the npu device (runtime/torch/device.py, the note): backward on ``npu:N``,
N > 0, a process bound to NPU 1 as a DDP rank is, placement of ``"npu"`` / ``"npu:0"``,
torch.save / torch.load across NPUs, and torch's error for two NPUs in one operator.

Each test runs on a fresh thread (``on_thread``, tests/torch/threads_util.py): the device a thread
is bound to and its autograd mode are per thread, so the pytest thread is left as it was.
"""
import gc
import io

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from tests.torch.threads_util import on_thread  # noqa: E402


def _bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(-1).view(torch.uint8)


def _step_model(device):
    """Two SGD steps (momentum) of a small MLP on ``device``; its parameters and losses."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    m = m.to(device) if device != "npu()" else m.npu()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(2):
        x = torch.randn(5, 6, generator=g)
        x = x.to(device) if device != "npu()" else x.npu()
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss)
    return list(m.parameters()), losses


def test_backward_on_npu_1_without_set_device():
    def body():
        x = torch.arange(4.0, device="npu:1", requires_grad=True)
        (x * x).sum().backward()
        assert x.grad.device == torch.device("npu", 1)
        assert x.grad.tolist() == [0.0, 2.0, 4.0, 6.0]
        # the thread now runs its own backward passes (torch's engine never sees index 1)
        assert not torch.autograd.is_multithreading_enabled()
    before = torch.autograd.is_multithreading_enabled()
    on_thread(body)
    assert torch.autograd.is_multithreading_enabled() == before     # other threads: as they were
    assert on_thread(torch.autograd.is_multithreading_enabled)     # a thread without npu work


def test_a_process_bound_to_npu_1_trains_as_on_cpu():
    want_params, want_losses = _step_model("cpu")

    def body():
        torch.npu.set_device(1)
        assert torch.npu.current_device() == 1
        assert torch.npu.device_count() == runtime.device_count()
        before0, before1 = torch.npu.memory_allocated(0), torch.npu.memory_allocated(1)
        # every spelling a script uses places on the bound NPU; the tensor says which
        for spelled in (torch.ones(2).to("npu"), torch.ones(2).npu(), torch.ones(2, device="npu"),
                        torch.ones(2, device="npu:0"), torch.ones(2).to("npu:1"),
                        torch.ones(2).to(torch.device("npu", torch.npu.current_device()))):
            assert spelled.device == torch.device("npu", 1), spelled.device
        for how in ("npu", "npu:1", "npu()"):
            params, losses = _step_model(how)
            assert all(p.device == torch.device("npu", 1) and p.grad.device == p.device
                       for p in params)
            for a, b in zip(params + losses, want_params + want_losses):
                assert torch.equal(_bits(a), _bits(b)), how
        assert torch.npu.memory_allocated(1) > before1          # counted on NPU 1 ...
        assert torch.npu.memory_allocated(0) == before0         # ... and nothing on NPU 0
        del params, losses, spelled, a, b
        gc.collect()                  # autograd graphs of the losses hold reference cycles
        torch.npu.synchronize()
        assert torch.npu.memory_allocated(1) == before1         # freed again
    on_thread(body)


def test_save_load_keeps_or_maps_the_npu():
    def body():
        torch.npu.set_device(1)
        m = torch.nn.Linear(3, 2).npu()
        buf = io.BytesIO()
        torch.save(m.state_dict(), buf)

        def load(**kw):
            buf.seek(0)
            return torch.load(buf, **kw)["weight"]
        assert load().device == torch.device("npu", 1)                       # where it was
        assert load(map_location="npu:2").device == torch.device("npu", 2)
        assert load(map_location=torch.device("npu", 3)).device == torch.device("npu", 3)
        assert load(map_location="npu").device == torch.device("npu", 1)      # the bound NPU
        assert load(map_location="cpu").device.type == "cpu"
        for w in (load(), load(map_location="npu:2"), load(map_location="cpu")):
            assert torch.equal(_bits(w), _bits(m.weight))
    on_thread(body)


def test_two_npus_in_one_operator_is_torchs_error():
    def body():
        a = torch.ones(3, device="npu:1")
        b = torch.ones(3, device="npu:2")
        with pytest.raises(RuntimeError, match="same device.*npu:1 and npu:2"):
            a + b
        assert (a + b.to("npu:1")).tolist() == [2.0, 2.0, 2.0]     # moved: fine
        with pytest.raises(RuntimeError, match="there are .* npu devices"):
            torch.ones(1, device=f"npu:{runtime.device_count()}")
    on_thread(body)
