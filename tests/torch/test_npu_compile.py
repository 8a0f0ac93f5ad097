"""torch.compile on npu tensors (issue 52): aot_eager is eager's operators, bitwise; inductor
compiles the graph for the CPU and runs it on CPU views of the npu tensors
(runtime/torch/compile.py), so its results are CPU inductor's, bitwise, and eager's up to the
rounding of its fused kernels. The inductor tests compile C++ with the machine's compiler:
about a minute on a loaded machine, so they are slow tests
(``python -m pytest -m slow tests/torch/test_npu_compile.py``).
"""
from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

import torch_npu  # noqa: E402,F401


def _model(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dev)


def _fwd_bwd(m, x):
    out = m(x)
    loss = out.square().mean()
    loss.backward()
    return out.detach().cpu(), [p.grad.detach().cpu() for p in m.parameters()]


@pytest.mark.timeout(300)
def test_aot_eager_on_a_module_is_eager_bitwise():
    torch._dynamo.reset()
    m = _model("npu")
    mc = copy.deepcopy(m)
    x = torch.randn(4, 8).to("npu")
    out, grads = _fwd_bwd(m, x)
    cout, cgrads = _fwd_bwd(torch.compile(mc, backend="aot_eager"), x)
    assert torch.equal(out, cout)
    assert all(torch.equal(a, b) for a, b in zip(grads, cgrads))


def _f(x, w):
    return (x @ w).relu() * 2 + x.sum(dim=1, keepdim=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_inductor_on_npu_is_cpu_inductor_bitwise_and_eager_closely():
    torch._dynamo.reset()
    torch.manual_seed(1)
    xc, wc = torch.randn(4, 8), torch.randn(8, 6)
    x, w = xc.to("npu"), wc.to("npu")
    got = torch.compile(_f, backend="inductor")(x, w)
    assert got.device.type == "npu"
    torch._dynamo.reset()
    cpu = torch.compile(_f, backend="inductor")(xc, wc)
    assert torch.equal(got.cpu(), cpu)          # the same C++ kernels on the same bytes
    torch.testing.assert_close(got.cpu(), _f(x, w).cpu(), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_inductor_on_an_npu_module_trains_as_eager():
    torch._dynamo.reset()
    m = _model("npu")
    mc = copy.deepcopy(m)
    x = torch.randn(4, 8).to("npu")
    x.add_(1)                       # queued or not, the compiled call sees the stream's result
    out, grads = _fwd_bwd(m, x)
    cm = torch.compile(mc, backend="inductor")
    cout, cgrads = _fwd_bwd(cm, x)
    torch.testing.assert_close(cout, out, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, cgrads):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    assert all(p.grad.device.type == "npu" for p in mc.parameters())
    # a second call reuses the compiled code, on new input
    x2 = torch.randn(4, 8).to("npu")
    torch.testing.assert_close(cm(x2).detach().cpu(), m(x2).detach().cpu(), rtol=1e-6,
                               atol=1e-6)


def ddp_rank(rank: int, backend: str) -> dict:
    """Eager DDP(model) and torch.compile(DDP(model), backend=backend) on npu, 2 steps each
    from the same start: their losses and gradients."""
    import warnings

    import torch.distributed as dist

    import hccl.torch.backend  # noqa: F401
    warnings.filterwarnings("ignore")
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank)).to("npu")
    out = {}
    for mode in ("eager", backend):
        m = _model("npu")
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        run = ddp if mode == "eager" else torch.compile(ddp, backend=backend)
        rows = []
        for _ in range(2):
            m.zero_grad()
            loss = run(x).square().mean()
            loss.backward()
            rows.append([loss.item()] + [p.grad.cpu().tolist() for p in m.parameters()])
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.1 * p.grad
        out[mode] = rows
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(400)
def test_aot_eager_on_ddp_at_world_2_is_eager_ddp_bitwise():
    import launcher
    for r in launcher.spawn(functools.partial(ddp_rank, backend="aot_eager"), 2, timeout=300):
        assert r["aot_eager"] == r["eager"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_inductor_on_ddp_at_world_2_is_eager_ddp_closely():
    import launcher
    for r in launcher.spawn(functools.partial(ddp_rank, backend="inductor"), 2, timeout=800):
        torch.testing.assert_close(torch.tensor(_flat(r["inductor"])),
                                   torch.tensor(_flat(r["eager"])), rtol=1e-5, atol=1e-6)


def _flat(v):
    return [x for item in v for x in _flat(item)] if isinstance(v, list) else [v]
