"""The corners of the npu device contract that libraries lean on (issue 50), each against CPU
bitwise: Parameter identity across ``.to()``, one-element results into ``out=`` tensors,
pinned host memory and non-blocking copies, torch.Stream / torch.Event, storage resize,
autocast's lists, CPU kernels over decompositions, Dynamo over npusim's own Python."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
pytest.importorskip("torch_npu")

import runtime  # noqa: E402


def _same(a, b):
    """Bitwise equal: dtype, shape and bytes (NaNs included)."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    if a.is_floating_point() or a.is_complex():
        a, b = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    assert torch.equal(a, b)


@pytest.fixture(autouse=True)
def _npu0():
    torch.npu.set_device(0)
    yield
    torch.npu.synchronize()


# ---------------------------------------------------------------------- 1. Parameter identity
class _TiedLM(torch.nn.Module):
    """GPT-2's tie: lm_head.weight is wte.weight."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(50, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                       torch.nn.Linear(32, 16))
        self.lm_head = torch.nn.Linear(16, 50, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        return self.lm_head(self.mlp(self.wte(ids)))


def test_module_to_npu_keeps_parameters_and_ties():
    torch.manual_seed(0)
    m = _TiedLM()
    before = {n: p for n, p in m.named_parameters(remove_duplicate=False)}
    m.to("npu")
    for n, p in m.named_parameters(remove_duplicate=False):
        assert p is before[n], n
        assert p.device.type == "npu"
    assert m.lm_head.weight is m.wte.weight
    assert len(list(m.parameters())) == len(set(map(id, m.parameters())))
    # and back: the same objects again
    m.to("cpu")
    assert all(p is before[n] for n, p in m.named_parameters(remove_duplicate=False))
    assert m.lm_head.weight.device.type == "cpu"
    # a meta move is not a shallow copy (torch's answer for CPU / CUDA too)
    assert not torch._has_compatible_shallow_copy_type(torch.ones(1, device="npu"),
                                                       torch.ones(1, device="meta"))


def _train(device, steps=3):
    """accelerate's documented loop: the optimizer is made before the model moves."""
    torch.manual_seed(0)
    m = _TiedLM()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m.to(device)
    ids = torch.randint(0, 50, (4, 7))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = m(ids.to(device))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids.reshape(-1).to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return m, losses


def test_optimizer_made_before_to_npu_trains_the_model():
    m_cpu, l_cpu = _train("cpu")
    m_npu, l_npu = _train("npu")
    for a, b in zip(l_cpu, l_npu):
        _same(a, b)
    assert l_npu[-1].item() < l_npu[0].item()           # it trains
    for (n, a), (_, b) in zip(m_cpu.named_parameters(), m_npu.named_parameters()):
        assert b.device.type == "npu", n
        _same(a, b)
    assert m_npu.lm_head.weight is m_npu.wte.weight       # still tied after the steps


# ---------------------------------------------------------------------- 2. out= into empty tensors
_REPEAT = 50


def _empty_out(dtype=torch.float32):
    return torch.empty(0, device="npu", dtype=dtype)


@pytest.mark.parametrize("shape", [(), (1,)])
def test_one_element_add_into_empty_out(shape):
    a, b = torch.full(shape, 1.25), torch.full(shape, -3.5)
    want = torch.add(a, b)
    an, bn = a.npu(), b.npu()
    for _ in range(_REPEAT):
        o = _empty_out()
        r = torch.add(an, bn, out=o)
        assert r is o
        _same(o, want)


def test_one_element_factories_and_logical_ops():
    x, y = torch.tensor(float("nan")), torch.tensor(0.0)
    xn, yn = x.npu(), y.npu()
    for _ in range(_REPEAT):
        _same(torch.arange(1, device="npu"), torch.arange(1))
        _same(torch.logical_or(xn.isnan(), xn.isinf()), torch.logical_or(x.isnan(), x.isinf()))
        _same(torch.logical_or(yn.isnan(), yn.isinf()), torch.logical_or(y.isnan(), y.isinf()))
        o = _empty_out(torch.bool)
        torch.logical_or(yn.isnan(), yn.isinf(), out=o)
        _same(o, torch.tensor(False))
        o = _empty_out()
        torch.sum(torch.ones(3, device="npu"), 0, out=o)
        _same(o, torch.tensor(3.0))
        o = _empty_out(torch.int64)
        torch.arange(1, out=o)
        _same(o, torch.arange(1))


def test_empty_npu_tensor_has_no_bytes():
    for shape in [(0,), (0, 3), (2, 0, 5)]:
        for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.complex64):
            e = torch.empty(shape, device="npu", dtype=dtype)
            assert e.shape == shape and e.dtype == dtype
            assert e.untyped_storage().nbytes() == 0


def _out_case(fn, out_shape):
    """``fn(out=...)`` on npu and on CPU with an out= of ``out_shape``: result and warnings."""
    got = {}
    for dev in ("cpu", "npu"):
        o = torch.full(out_shape, 7.0, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = fn(dev, o)
        assert r is o
        got[dev] = (o, ["resized" in str(x.message) for x in w])
    _same(got["cpu"][0], got["npu"][0])
    assert got["cpu"][0].stride() == got["npu"][0].stride()
    return any(got["cpu"][1]), any(got["npu"][1])


def test_zero_dim_and_wrong_sized_out():
    a = torch.arange(6.0).reshape(2, 3)

    def add(dev, o):
        return torch.add(a.to(dev), 0.5, out=o)

    def mm(dev, o):
        return torch.mm(a.to(dev), a.t().to(dev), out=o)

    def total(dev, o):
        return torch.sum(a.to(dev), out=o, dim=(0, 1))
    # right size: no warning; 0-d or wrong size: torch's warning, then resized
    assert _out_case(add, (2, 3)) == (False, False)
    assert _out_case(add, ()) == (True, True)
    assert _out_case(add, (5,)) == (True, True)
    assert _out_case(add, (4, 4)) == (True, True)
    assert _out_case(mm, (1,)) == (True, True)
    assert _out_case(total, ()) == (False, False)
    assert _out_case(total, (3,)) == (True, True)


# ---------------------------------------------------------------------- 7. CPU kernels
class _LlamaMLP(torch.nn.Module):
    def __init__(self, d=64, h=172):
        super().__init__()
        self.gate = torch.nn.Linear(d, h, bias=False)
        self.up = torch.nn.Linear(d, h, bias=False)
        self.down = torch.nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_backward_is_cpu_kernel_in_llama_mlp(dtype):
    torch.manual_seed(0)
    x, g = torch.randn(32, 172, dtype=dtype), torch.randn(32, 172, dtype=dtype)
    want = torch.ops.aten.silu_backward(g, x)
    # the decomposition a new backend gets from torch rounds otherwise: the test has teeth
    assert not torch.equal(want, torch.ops.aten.silu_backward.default.decompose(g, x))
    _same(torch.ops.aten.silu_backward(g.npu(), x.npu()), want)
    for op in (torch.ops.aten.mish_backward, torch.ops.aten.gelu_backward,
               torch.ops.aten.hardswish_backward):
        _same(op(g.npu(), x.npu()), op(g, x))
    m = _LlamaMLP().to(dtype)
    xs = torch.randn(4, 9, 64, dtype=dtype)
    grads = {}
    for dev in ("cpu", "npu"):
        m.zero_grad()
        m.to(dev)
        out = m(xs.to(dev).requires_grad_())
        out.float().square().mean().backward()
        grads[dev] = [out] + [p.grad for p in m.parameters()]
    for a, b in zip(grads["cpu"], grads["npu"]):
        _same(a, b)


def test_composite_ops_take_the_cpu_kernel():
    """Every aten op with a CPU kernel that npu would otherwise run as a decomposition is routed
    to the fallback (the CPU kernel), as the CPU's dispatch table does (structured ops' own
    composites, which run their CPU out= kernel, stay: kernels._cpu_kernel_ops)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("aten::silu_backward", "aten::mish_backward", "aten::addr", "aten::_stack",
                 "aten::native_layer_norm", "aten::_softmax"):
        assert has(name, "CPU") and has(name, "PrivateUse1"), name
    left = [n for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and has(n, "CPU") and not has(n, "PrivateUse1")
            and (has(n, "CompositeImplicitAutograd") or has(n, "CompositeExplicitAutograd"))
            and n not in ("aten::_pin_memory", "aten::is_pinned")]   # npusim's own CPU kernels
    assert left == []


# ---------------------------------------------------------------------- 6. autocast as CUDA's
def _autocast_dtypes(dtype):
    x = torch.randn(4, 8, device="npu")
    w = torch.randn(8, 8, device="npu")
    y = torch.randint(0, 8, (4,), device="npu")
    F = torch.nn.functional
    with torch.autocast("npu", dtype=dtype):
        h = x @ w
        return {
            "mm": h, "linear": F.linear(x, w), "bmm": torch.bmm(x[None], w[None]),
            "sdpa": F.scaled_dot_product_attention(x[None], x[None], x[None]),
            "softmax": torch.softmax(h, -1), "log_softmax": torch.log_softmax(h, -1),
            "cross_entropy": F.cross_entropy(h, y), "nll_loss": F.nll_loss(h, y),
            "mse_loss": F.mse_loss(h, x), "layer_norm": F.layer_norm(h, (8,)),
            "rms_norm": F.rms_norm(h, (8,)), "group_norm": F.group_norm(h, 2),
            "exp": h.exp(), "log": h.abs().log(), "pow": h.pow(2), "rsqrt": h.abs().rsqrt(),
            "sum": h.sum(), "sum_dim": h.sum(0), "cumsum": h.cumsum(0), "prod": h.prod(),
            "norm": h.norm(), "vector_norm": torch.linalg.vector_norm(h),
            "logsumexp": h.logsumexp(-1),
            "addcmul": torch.addcmul(h, x, x), "atan2": torch.atan2(h, x),
            "add": h + h, "relu": torch.relu(h), "gelu": F.gelu(h), "silu": F.silu(h),
            "mul_fp32": h * x,
        }


# the output dtype CUDA's autocast gives (torch 2.13, ATen/autocast_mode.h): "low" = the
# autocast dtype; ops not on a list keep their inputs' (type promotion: bf16 * fp32 = fp32)
_CUDA_DTYPE = {
    "mm": "low", "linear": "low", "bmm": "low", "sdpa": "low",
    "softmax": "fp32", "log_softmax": "fp32", "cross_entropy": "fp32", "nll_loss": "fp32",
    "mse_loss": "fp32", "layer_norm": "fp32", "rms_norm": "fp32", "group_norm": "fp32",
    "exp": "fp32", "log": "fp32", "pow": "fp32", "rsqrt": "fp32", "sum": "fp32",
    "sum_dim": "fp32", "cumsum": "fp32", "prod": "fp32", "norm": "fp32", "vector_norm": "fp32",
    "logsumexp": "fp32", "addcmul": "fp32", "atan2": "fp32",
    "add": "low", "relu": "low", "gelu": "low", "silu": "low", "mul_fp32": "fp32",
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_output_dtypes_are_cudas(dtype):
    got = _autocast_dtypes(dtype)
    want = {k: dtype if v == "low" else torch.float32 for k, v in _CUDA_DTYPE.items()}
    assert {k: v.dtype for k, v in got.items()} == want
    with torch.autocast("npu", dtype=dtype), \
            pytest.raises(RuntimeError, match="unsafe to autocast"):
        torch.nn.functional.binary_cross_entropy(torch.rand(3, device="npu"),
                                                 torch.rand(3, device="npu"))


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), \
            torch.nn.Linear(32, 10)

    def forward(self, x, y):
        h = self.fc2(self.ln(torch.nn.functional.gelu(self.fc1(x))))
        return torch.nn.functional.cross_entropy(h, y)


def _cuda_casts_on_cpu(m, x, y, low):
    """_Head's forward on CPU with the casts CUDA's autocast makes, written out."""
    F = torch.nn.functional
    h = F.linear(x.to(low), m.fc1.weight.to(low), m.fc1.bias.to(low))            # lower
    h = F.gelu(h)                                                                # no list
    h = F.layer_norm(h.float(), (32,), m.ln.weight, m.ln.bias)                   # fp32
    h = F.linear(h.to(low), m.fc2.weight.to(low), m.fc2.bias.to(low))            # lower
    # cross_entropy decomposes into log_softmax(h, 1, dtype=h.dtype), which keeps its explicit
    # dtype, and nll_loss, on the fp32 list
    return F.nll_loss(torch.log_softmax(h, 1, dtype=low).float(), y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_loss_is_fp32_and_bitwise_cudas_casts(dtype):
    torch.manual_seed(0)
    m = _Head()
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    want = _cuda_casts_on_cpu(m, x, y, dtype)
    want.backward()
    want_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m.npu()
    with torch.autocast("npu", dtype=dtype):
        loss = m(x.npu(), y.npu())
    assert loss.dtype == torch.float32
    loss.backward()
    _same(loss, want)
    for p, g in zip(m.parameters(), want_grads):
        _same(p.grad, g)


def test_fp16_grad_scaler_steps_when_nothing_overflows():
    torch.manual_seed(0)
    m = _Head().npu()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu")
    x, y = torch.randn(8, 16, device="npu"), torch.randint(0, 10, (8,), device="npu")
    for step in range(3):
        opt.zero_grad()
        with torch.autocast("npu", dtype=torch.float16):
            loss = m(x, y)
        assert loss.dtype == torch.float32
        scaler.scale(loss).backward()
        before = m.fc1.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == 2.0 ** 16, step        # no inf found: not backed off
        assert not torch.equal(before, m.fc1.weight.detach()), step   # and the step was taken


# ---------------------------------------------------------------------- 5. storage resize, FSDP2
def test_untyped_storage_resize_in_place():
    t = torch.arange(6.0, device="npu")
    view = t[2:]
    st = t.untyped_storage()
    base = torch.npu.memory_allocated()
    st.resize_(0)                                   # FSDP2's free of a gathered parameter
    assert st.nbytes() == 0 and t.untyped_storage().nbytes() == 0
    assert torch.npu.memory_allocated() < base      # the allocation went back to the pool
    st.resize_(24)                                  # and its allocation again
    assert t.untyped_storage().nbytes() == 24 and view.untyped_storage().data_ptr() == st.data_ptr()
    t.copy_(torch.arange(6.0) * 2)
    _same(view, torch.arange(2.0, 6.0) * 2)
    st.resize_(12)                                  # shrinking and growing keep the first bytes
    st.resize_(40)
    _same(t[:3], torch.tensor([0.0, 2.0, 4.0]))
    with pytest.raises(ValueError, match="size=-1"):
        st.resize_(-1)
    c = torch.ones(3).untyped_storage()             # CPU storages keep torch's method
    c.resize_(4)
    assert c.nbytes() == 4


def fsdp2_rank(rank: int, device: str = "npu") -> dict:
    """FSDP2 (fully_shard per Linear and the root) trains 3 steps on ``device``; losses and the
    full parameters after."""
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import hccl.torch_backend  # noqa: F401
    warnings.filterwarnings("ignore")
    if device == "npu":
        torch.npu.set_device(rank)
    dist.init_process_group("hccl" if device == "npu" else "gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    model.to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)           # reshard after forward: storage.resize_(0)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(world * 4, 8, generator=g), torch.randint(0, 3, (world * 4,), generator=g)
    losses = []
    for _ in range(3):
        rows = slice(rank * 4, rank * 4 + 4)
        loss = torch.nn.functional.cross_entropy(model(x[rows].to(device)), y[rows].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.full_tensor().cpu().tolist() for p in model.parameters()]
    dist.destroy_process_group()
    return {"losses": losses, "params": params}


@pytest.mark.timeout(400)
def test_fsdp2_fully_shard_on_npu_bitwise_gloo():
    import functools

    import launcher
    npu = launcher.spawn(fsdp2_rank, 2, timeout=180)
    cpu = launcher.spawn(functools.partial(fsdp2_rank, device="cpu"), 2, timeout=180)
    assert npu[0]["losses"][-1] < npu[0]["losses"][0]
    assert npu == cpu                               # losses and parameters, every rank, bitwise


# ---------------------------------------------------------------------- 4. torch.Stream / Event
def test_npu_stream_and_event_are_torch_stream_and_event():
    t = torch.ones(4, device="npu")
    cur = torch.npu.current_stream()
    assert isinstance(cur, torch.Stream) and cur.device_type == 20 and cur.device == t.device
    assert cur.stream_id == 0 and cur == torch.npu.default_stream()
    # torch's own answer (its Python device guard knows one stream: id 0) names the same stream
    assert torch.accelerator.current_stream() == cur
    t.record_stream(cur)                              # ZeRO-3 does this
    t.record_stream(torch.accelerator.current_stream())
    s = torch.npu.Stream()
    t.record_stream(s)
    assert s.stream_id != 0 and s != cur
    same = torch.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=20)
    assert s == same and hash(s) == hash(same) and {s: 1}[same] == 1
    assert torch.npu.Stream(stream_id=s.stream_id, device_index=0, device_type=20) is s
    with pytest.raises(RuntimeError, match="record_stream.*npu"):
        t.record_stream(torch.Stream(device="cpu"))
    # the methods are npusim's: work on s is ordered and waited for
    e0, e1 = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    assert isinstance(e0, torch.Event)
    with s:                                           # torch.Stream's context manager
        assert torch.npu.current_stream() is s
        e0.record()
        u = t * 3
        e1.record()
    assert torch.npu.current_stream() is cur
    cur.wait_event(e1)
    cur.wait_stream(s)
    s.synchronize()
    assert s.query() and e1.query() and e0.elapsed_time(e1) >= 0.0
    _same(u, torch.full((4,), 3.0))
    assert isinstance(s.record_event(), torch.npu.Event)


# ---------------------------------------------------------------------- 8. Dynamo
def compiled_ddp_rank(rank: int, device: str = "npu") -> dict:
    """torch.compile(DDP(model), backend="aot_eager"): 2 steps; losses and gradients."""
    import warnings

    import torch.distributed as dist

    import hccl.torch_backend  # noqa: F401
    warnings.filterwarnings("ignore")
    if device == "npu":
        torch.npu.set_device(rank)
    dist.init_process_group("hccl" if device == "npu" else "gloo")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    m.to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    run = torch.compile(ddp, backend="aot_eager") if device == "npu" else ddp
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank))
    out = {"losses": [], "grads": []}
    for _ in range(2):
        m.zero_grad()
        loss = run(x.to(device)).square().mean()
        loss.backward()
        out["losses"].append(loss.item())
        out["grads"].append([p.grad.cpu().tolist() for p in m.parameters()])
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.1 * p.grad
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(400)
def test_compiled_ddp_on_npu_never_traces_npusim():
    import functools

    import launcher
    # npusim's packages are on Dynamo's skip list once Dynamo is imported
    import torch._dynamo.trace_rules as trace_rules
    for pkg in ("runtime", "hccl", "torch_npu"):
        assert trace_rules.check_file(__import__(pkg).__file__).skipped, pkg
    npu = launcher.spawn(compiled_ddp_rank, 1, timeout=300)
    cpu = launcher.spawn(functools.partial(compiled_ddp_rank, device="cpu"), 1, timeout=200)
    assert npu == cpu                 # compiled on npu, bitwise DDP eager on CPU gloo


# ---------------------------------------------------------------------- 3. pinned, non-blocking
def _busy(seconds=0.3):
    """Hold the current stream busy so that npu operators behind it are queued tasks."""
    import threading
    go = threading.Event()
    runtime.launch(lambda: go.wait(seconds), stream=torch.npu.current_stream().npu_stream)
    return go


def test_pin_memory_and_is_pinned():
    x = torch.arange(12.0).reshape(3, 4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu" and p.stride() == x.stride()
    _same(p, x)
    t = x.t().pin_memory()                            # a transposed tensor keeps its layout
    assert t.is_pinned() and t.stride() == (1, 4)
    _same(t, x.t())
    assert not p.clone().is_pinned()                  # only the pinned storage itself
    assert p[1:].is_pinned()                          # a view of it is
    assert not torch.ones(2, device="npu").is_pinned()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2,
                                         pin_memory=True)
    batches = list(loader)
    assert all(b[0].is_pinned() for b in batches)
    _same(torch.cat([b[0] for b in batches]), x)


def test_non_blocking_copies_are_right_after_synchronize():
    x = torch.arange(1000.0)
    pinned = x.pin_memory()
    for _ in range(5):
        go = _busy()
        d = pinned.to("npu", non_blocking=True)       # queued behind the busy stream
        y = (d * 2).to("cpu", non_blocking=True)      # npu -> host, non-blocking
        go.set()
        torch.npu.synchronize()
        _same(y, x * 2)
        e = torch.npu.Event()
        go = _busy()
        z = (d + 1).to("cpu", non_blocking=True)
        e.record()
        go.set()
        e.synchronize()
        _same(z, x + 1)
    a = torch.randn(3, 4, device="npu", requires_grad=True)
    b = a.to("cpu", non_blocking=True)                # differentiable, as .to() is
    (b * 3).sum().backward()
    _same(a.grad, torch.full((3, 4), 3.0))
    assert a.grad.device.type == "npu"


def test_pinned_factories_have_no_python_route_by_default():
    """torch.empty(..., pin_memory=True) asks the PrivateUse1 hooks for a C++ allocator, which
    torch 2.13's Python route cannot provide (runtime/torch/pinned.py, docs/torch.md "Device
    contract"): without the opt-in it raises torch's NotImplementedError naming
    getPinnedMemoryAllocator. If a torch release adds the route, this test says so. (The opt-in
    changes the whole process: it is tested in rank processes, below.)"""
    from runtime.torch import pinned
    if pinned._factories_lib is not None:
        pytest.skip("this process opted in to pinned factories")
    with pytest.raises(NotImplementedError, match="getPinnedMemoryAllocator"):
        torch.empty(3, pin_memory=True)


def test_out_into_empty_and_wrong_sized_tensors_behind_a_busy_stream():
    """The same out= cases when the operator is a queued task (its sizes from meta kernels)."""
    a, b = torch.full((), 1.25), torch.full((1,), -3.5)
    for _ in range(10):
        go = _busy()
        o1, o2 = _empty_out(), torch.empty(5, device="npu")
        torch.add(a.npu(), b.npu(), out=o1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.mul(torch.ones(2, 3, device="npu"), 2.0, out=o2)
        go.set()
        torch.npu.synchronize()
        _same(o1, torch.add(a, b))
        _same(o2, torch.full((2, 3), 2.0))


def ddp_unused_rank(rank: int, device: str = "npu", opt_in: bool = True) -> dict:
    """DDP(find_unused_parameters=True) (the transformers Trainer's default) with a branch unused
    in the forward: 3 steps, losses and parameters."""
    import warnings

    import torch.distributed as dist

    import hccl.torch_backend  # noqa: F401
    import runtime.torch
    warnings.filterwarnings("ignore")
    from runtime.torch import pinned
    if device == "npu" and not opt_in:
        torch.npu.set_device(rank)
        assert pinned._factories_lib is None      # DDP(find_unused_parameters=True) opts in
    elif device == "npu":
        runtime.torch.enable_pinned_factories()
        torch.npu.set_device(rank)
        assert torch.empty(3, pin_memory=True).is_pinned()
        assert torch.zeros(2, 3, pin_memory=True).is_pinned()
        assert not torch.empty(3).is_pinned()
        assert torch.empty(2, device="npu").device.type == "npu"
    dist.init_process_group("hccl" if device == "npu" else "gloo")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.unused = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)

        def forward(self, x):
            return self.a(x)
    torch.manual_seed(0)
    m = Net().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(m, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = ddp(x.to(device)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [p.detach().cpu().tolist() for p in m.parameters()]
    if device == "npu":
        assert pinned._factories_lib is not None
    dist.destroy_process_group()
    return {"losses": losses, "params": params}


@pytest.mark.timeout(300)
def test_ddp_find_unused_parameters_with_pinned_factories_opt_in():
    import functools

    import launcher
    npu = launcher.spawn(ddp_unused_rank, 2, timeout=200)
    cpu = launcher.spawn(functools.partial(ddp_unused_rank, device="cpu"), 2, timeout=200)
    assert npu[0]["losses"][-1] < npu[0]["losses"][0]
    assert npu == cpu


@pytest.mark.timeout(300)
def test_ddp_find_unused_parameters_on_npu_opts_in_by_itself():
    """The Trainer's default, unchanged: DDP(find_unused_parameters=True) over npu parameters
    turns the pinned factories on as it is built (pinned.watch_ddp), and trains as on CPU."""
    import functools

    import launcher
    npu = launcher.spawn(functools.partial(ddp_unused_rank, opt_in=False), 2, timeout=200)
    cpu = launcher.spawn(functools.partial(ddp_unused_rank, device="cpu"), 2, timeout=200)
    assert npu[0]["losses"][-1] < npu[0]["losses"][0]
    assert npu == cpu
