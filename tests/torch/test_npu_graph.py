"""torch.npu.NPUGraph, torch.npu.graph, make_graphed_callables (issue 52): npu operators and the
backend's collectives captured into npusim's task graphs, replayed bitwise equal to eager;
static inputs and outputs as CUDA graphs have them; what cannot be captured refused by name.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

import torch_npu  # noqa: E402,F401

from runtime.errors import GraphCaptureError  # noqa: E402
from tests.leakcheck import LeakCheck, run_npurun  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.GELU(), torch.nn.Linear(64, 8)).to("npu")


def test_mlp_forward_replays_bitwise_on_its_static_tensors():
    m = _mlp()
    x = torch.randn(16, 32).to("npu")
    with torch.no_grad():
        ref = m(x).cpu()
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            out = m(x)
        assert len(g) >= 5                      # every operator is a node: nothing ran eagerly
        ptr = out.data_ptr()
        g.replay()
        assert torch.equal(out.cpu(), ref)
        for seed in (1, 2, 3):                  # new input copied into the static one
            torch.manual_seed(seed)
            x.copy_(torch.randn(16, 32).to("npu"))
            g.replay()
            assert out.data_ptr() == ptr        # the replay rewrites the same output memory
            assert torch.equal(out.cpu(), m(x).cpu())
    assert not torch.npu.is_current_stream_capturing()


def test_capture_allocations_come_from_the_graph_pool_and_go_with_reset():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        tmp = x * 2                              # allocated during the capture, then dropped
        out = tmp + 1
        del tmp
    pool = g.pool().private
    assert len(pool.live) >= 2 and pool.nbytes >= 2 * 48
    x.fill_(5.0)
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), torch.full((3, 4), 11.0))
    del out
    gc.collect()
    held = torch.npu.memory_allocated()
    assert len(pool.live) >= 2                  # a dead static output keeps its memory
    g.reset()
    gc.collect()
    assert not pool.live and not pool.held
    assert torch.npu.memory_allocated() <= held - 2 * 48
    with pytest.raises(GraphCaptureError, match="not been captured"):
        g.replay()


def test_a_plain_runtime_graph_captures_npu_operators_too():
    import runtime
    x = torch.arange(4, dtype=torch.float32).to("npu")
    y = torch.empty(4).to("npu")
    g = runtime.Graph()
    with runtime.graph(g):                      # the fast path is not taken while capturing
        torch.add(x, 1, out=y)
        y.mul_(x)
        with pytest.raises(GraphCaptureError, match="malloc"):
            x * 2                               # no private pool: NPUGraph has one
    assert len(g) == 2
    x.fill_(2.0)
    g.replay()
    runtime.current_stream().synchronize()
    assert torch.equal(y.cpu(), torch.full((4,), 6.0))


def test_sync_operators_are_refused_by_name_and_the_capture_is_discarded():
    x = torch.ones(4).to("npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(GraphCaptureError, match=r"_local_scalar_dense.*not permitted when "
                                                r"stream is capturing"):
        with torch.npu.graph(g):
            y = x + 1
            y.sum().item()
    assert len(g) == 0 and not torch.npu.is_current_stream_capturing()
    assert float((x + 1).sum().cpu()) == 8.0     # the streams are usable again
    with pytest.raises(GraphCaptureError, match=r"_copy_from to the host.*not permitted"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            (x * 3).cpu()
    with pytest.raises(GraphCaptureError, match="nonzero"):
        with torch.npu.graph(torch.npu.NPUGraph()):
            torch.nonzero(x)
    with pytest.raises(TypeError, match="NPUGraph"):
        torch.npu.graph(object())
    with pytest.raises(ValueError, match="capture_error_mode"):
        torch.npu.graph(torch.npu.NPUGraph(), capture_error_mode="loose")


def test_a_host_to_device_copy_is_a_node_and_dropout_replays_as_eager():
    host = torch.arange(6, dtype=torch.float32)
    dst = torch.zeros(6).to("npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        dst.copy_(host)                         # staged at the capture, copied at each replay
        out = dst * 2
    dst.zero_()
    g.replay()
    assert torch.equal(out.cpu(), host * 2)
    # a random operator draws from the device's generator at each replay, as eager code does
    x = torch.ones(64).to("npu")
    torch.manual_seed(11)                       # native_dropout draws from CPU's generator
    torch.npu.manual_seed(11)
    eager = [torch.nn.functional.dropout(x, 0.5).cpu() for _ in range(3)]
    torch.manual_seed(11)
    torch.npu.manual_seed(11)
    g2 = torch.npu.NPUGraph()
    with torch.npu.graph(g2):
        y = torch.nn.functional.dropout(x, 0.5)
    got = []
    for _ in range(3):
        g2.replay()
        got.append(y.cpu())
    assert all(torch.equal(a, b) for a, b in zip(eager, got))


def _step(m, opt, x, y):
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(m(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


_OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    # torch's rule for a captured Adam step: its step counters on the device (capturable)
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, capturable=True, foreach=True),
}


@pytest.mark.parametrize("optim", sorted(_OPTIMIZERS))
def test_training_step_with_backward_and_optimizer_replays_bitwise(optim):
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randn(8, 32, generator=gen), torch.randn(8, 8, generator=gen))
            for _ in range(6)]
    m = _mlp()
    opt = _OPTIMIZERS[optim](m.parameters())
    eager = [_step(m, opt, x.to("npu"), y.to("npu")).cpu() for x, y in data]
    m2 = _mlp()
    opt2 = _OPTIMIZERS[optim](m2.parameters())
    sx, sy = data[0][0].to("npu"), data[0][1].to("npu")
    got = []
    for x, y in data[:2]:                        # warm-up: momentum buffers made eagerly
        sx.copy_(x)
        sy.copy_(y)
        got.append(_step(m2, opt2, sx, sy).cpu())
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        loss = _step(m2, opt2, sx, sy)
    for x, y in data[2:]:
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
        got.append(loss.cpu())
    assert all(torch.equal(a, b) for a, b in zip(eager, got))
    assert all(torch.equal(a.detach().cpu(), b.detach().cpu())
               for a, b in zip(m.parameters(), m2.parameters()))


def test_make_graphed_callables_forward_and_backward_equal_eager():
    m_ref, m = _mlp(), _mlp()
    x = torch.randn(16, 32).to("npu").requires_grad_()
    graphed = torch.npu.make_graphed_callables(m, (x,), num_warmup_iters=2)
    assert graphed is m
    for seed in (3, 4):
        torch.manual_seed(seed)
        inp = torch.randn(16, 32)
        a = inp.to("npu").requires_grad_()
        b = inp.to("npu").requires_grad_()
        m_ref.zero_grad(set_to_none=True)
        m.zero_grad(set_to_none=True)
        out_ref, out = m_ref(a), graphed(b)
        assert torch.equal(out.cpu(), out_ref.cpu())
        out_ref.square().sum().backward()
        out.square().sum().backward()
        assert torch.equal(a.grad.cpu(), b.grad.cpu())
        for p, q in zip(m_ref.parameters(), m.parameters()):
            assert torch.equal(p.grad.cpu(), q.grad.cpu())

    def fn(u, v):
        return u * v + u.sin()
    u, v = torch.randn(5).to("npu").requires_grad_(), torch.randn(5).to("npu")
    gfn = torch.npu.make_graphed_callables(fn, (u, v))
    out = gfn(u, v)
    assert torch.equal(out.cpu(), fn(u, v).cpu())
    with pytest.raises(TypeError, match="npu tensor"):
        torch.npu.make_graphed_callables(fn, (u.cpu(), v))


@pytest.mark.timeout(300)
def test_transfer_to_npu_names_are_npusim_graphs():
    code = textwrap.dedent("""
        import json, torch
        from torch_npu.contrib import transfer_to_npu
        out = {}
        out["same"] = [torch.cuda.CUDAGraph is torch.npu.NPUGraph,
                       torch.cuda.graph is torch.npu.graph,
                       torch.cuda.make_graphed_callables is torch.npu.make_graphed_callables]
        lin = torch.nn.Linear(8, 8).cuda()
        x = torch.randn(4, 8, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.no_grad():
            with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
                y = lin(x)
            x.copy_(torch.randn(4, 8, device="cuda"))
            g.replay()
            out["equal"] = torch.equal(y.cpu(), lin(x).cpu())
        print("RESULT", json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert out == {"same": [True, True, True], "equal": True}


DDP_JOB = '''
import os, sys, torch, torch_npu, torch.distributed as dist
import torch.nn.functional as F
DDP = sys.argv[1] == "ddp"          # DistributedDataParallel(model), else all_reduce by hand
dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dev = f"npu:{rank}"
STEPS, WARM = 7, 2

def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                            torch.nn.Linear(32, 4)).to(dev)
    if DDP:
        m = torch.nn.parallel.DistributedDataParallel(m, device_ids=[rank])
    return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

g = torch.Generator().manual_seed(100 + rank)
data = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(STEPS)]

def step(m, opt, x, y):
    opt.zero_grad(set_to_none=False)
    loss = F.mse_loss(m(x), y)
    loss.backward()                   # DDP: its buckets' all_reduces run in here
    for p in ([] if DDP else m.parameters()):   # by hand: the gradients' mean over the ranks
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    opt.step()
    return loss.detach()

m, opt = make()
eager = [step(m, opt, x.to(dev), y.to(dev)).cpu() for x, y in data]
m2, opt2 = make()
sx, sy = data[0][0].to(dev), data[0][1].to(dev)
got = []
for x, y in data[:WARM]:
    sx.copy_(x); sy.copy_(y)
    got.append(step(m2, opt2, sx, sy).cpu())
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph):
    loss = step(m2, opt2, sx, sy)
names = [n.name for n in graph._t.graph._nodes]
for x, y in data[WARM:]:
    sx.copy_(x); sy.copy_(y)
    graph.replay()
    got.append(loss.cpu())
same_loss = all(torch.equal(a, b) for a, b in zip(eager, got))
same_params = all(torch.equal(a.detach().cpu(), b.detach().cpu())
                  for a, b in zip(m.parameters(), m2.parameters()))
# the ranks' parameters agree (the all_reduce ran in every replay)
flat = torch.cat([p.detach().reshape(-1) for p in m2.parameters()])
other = flat.clone()
dist.broadcast(other, 0)
print("RESULT", rank, same_loss, same_params, torch.equal(flat.cpu(), other.cpu()),
      sum("ALLREDUCE" in n.upper() or "all_reduce" in n for n in names), flush=True)
dist.destroy_process_group()
'''


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["ddp", "by_hand"])
def test_data_parallel_step_with_all_reduce_captured_at_world_2_bitwise(tmp_path, mode):
    """A step of DDP(model) (or of a model whose gradients are all_reduced by hand): forward,
    backward with the all_reduces, SGD with momentum; replayed bitwise equal to eager."""
    job = tmp_path / "graph_ddp_job.py"
    job.write_text(DDP_JOB)
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", str(job), mode, env=lc.env,
                         cwd=str(tmp_path), timeout=360)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = sorted(ln.split("RESULT ")[1].split() for ln in res.stdout.splitlines()
                  if "RESULT " in ln)
    assert [r[:4] for r in rows] == [["0", "True", "True", "True"], ["1", "True", "True", "True"]]
    assert all(int(r[4]) >= 1 for r in rows)     # the all_reduces are nodes of the graph
