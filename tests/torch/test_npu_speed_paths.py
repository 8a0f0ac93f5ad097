"""The npu operators' fast paths (runtime/torch/ops.py: ``_now``, ``structured_kernel``;
storage.py: ``empty_contiguous``) against CPU eager, bitwise, at their corners: layouts and
promotion the meta signature must tell apart, a busy stream (the task path), the pool's exact
accounting after many operators, an ``out=`` that grows, views of views, and the errors."""
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402


def _same(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), (a, b)
    a, b = a.contiguous(), b.contiguous()
    if a.is_floating_point():
        a, b = a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)
    assert torch.equal(a, b)


def _slow(seconds):
    """Hold the current npu stream busy with a kernel until the returned event is set."""
    go = threading.Event()
    runtime.launch(lambda: go.wait(seconds), stream=torch.npu.current_stream().npu_stream)
    return go


@pytest.fixture(autouse=True, scope="module")
def _device():
    torch.npu.set_device(0)
    torch.arange(8.0, device="npu").mul(2)      # torch's first meta kernel imports sympy


def _inputs():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 5, generator=g)
    b = torch.randn(6, 5, generator=g)
    i = torch.randint(-4, 5, (6, 5), generator=g)
    j = torch.randint(1, 5, (6, 5), generator=g)
    return a, b, i, j


# the structured operators of kernels._STRUCTURED, with the layouts, broadcasts, promotions and
# Python numbers whose result metadata differs (the meta cache's key must tell them apart)
CASES = [
    lambda a, b, i, j: a + b,
    lambda a, b, i, j: a.t() + b.t(),                 # a transposed result, as CPU lays it
    lambda a, b, i, j: a[:, :1] + b,                  # broadcast
    lambda a, b, i, j: a + 2,                         # a Python number (add.Scalar's meta)
    lambda a, b, i, j: i + 2,                         # ... int stays int
    lambda a, b, i, j: i + 2.5,                       # ... int + float is float
    lambda a, b, i, j: i + True,
    lambda a, b, i, j: a + torch.tensor(3.0),         # a 0-dim CPU tensor joins
    lambda a, b, i, j: i * torch.tensor(1.5, dtype=torch.float64),
    lambda a, b, i, j: torch.add(a, b, alpha=0.5),
    lambda a, b, i, j: a - b, lambda a, b, i, j: a * b, lambda a, b, i, j: a / b,
    lambda a, b, i, j: i / j,                         # int / int is float
    lambda a, b, i, j: torch.div(i, j, rounding_mode="floor"),
    lambda a, b, i, j: a @ b.t(), lambda a, b, i, j: a.t() @ b,
    lambda a, b, i, j: torch.addmm(a[:, :1], a, b.t()[:, :1].expand(5, 5).contiguous()),
    lambda a, b, i, j: torch.bmm(a.view(2, 3, 5), b.view(2, 5, 3)),
    lambda a, b, i, j: a.sum(1), lambda a, b, i, j: a.sum(0, keepdim=True),
    lambda a, b, i, j: a.mean(1), lambda a, b, i, j: i.sum(1),
    lambda a, b, i, j: a.pow(2), lambda a, b, i, j: a.sigmoid(), lambda a, b, i, j: a.tanh(),
    lambda a, b, i, j: torch.nn.functional.gelu(a), lambda a, b, i, j: torch.nn.functional.silu(a),
    lambda a, b, i, j: a.exp(), lambda a, b, i, j: -a, lambda a, b, i, j: a.abs().sqrt(),
    lambda a, b, i, j: torch.maximum(a, b), lambda a, b, i, j: a.clamp(-0.5, 0.5),
    lambda a, b, i, j: a > 0, lambda a, b, i, j: a == b, lambda a, b, i, j: i != 0,
    lambda a, b, i, j: a[::2] + b[1::2],              # views with an offset
    lambda a, b, i, j: torch.cat([a, b]), lambda a, b, i, j: torch.cat([a[:, :2], b.t().t()], 1),
    lambda a, b, i, j: torch.cat([i, j, i[:1]]), lambda a, b, i, j: torch.stack([a, b], 1),
    lambda a, b, i, j: a.softmax(-1), lambda a, b, i, j: a.log_softmax(0),
    lambda a, b, i, j: a.t().softmax(1),
    lambda a, b, i, j: torch.addcmul(a, a, b, value=0.5),
    lambda a, b, i, j: torch.addcdiv(a, a, b.abs() + 1, value=2),
    lambda a, b, i, j: torch.lerp(a, b, 0.3), lambda a, b, i, j: (a.abs() + 1).log(),
    lambda a, b, i, j: a.sin() + a.cos(), lambda a, b, i, j: a.clamp_min(0),
    lambda a, b, i, j: torch.pow(a.abs(), b), lambda a, b, i, j: a <= 0,
    lambda a, b, i, j: a < b, lambda a, b, i, j: a >= b, lambda a, b, i, j: i != j,
]
# a 0-dim CPU tensor first: no meta result (torch's meta kernel takes the CPU device's), so on a
# busy stream the operator waits for the stream, then runs (as before the structured kernel)
CPU_FIRST = [lambda a, b, i, j: torch.tensor(3.0) * a, lambda a, b, i, j: torch.tensor(2) - i]


def _run(fn, dev, inputs):
    return fn(*(t.to(dev) for t in inputs))


@pytest.mark.parametrize("k", range(len(CASES + CPU_FIRST)))
def test_structured_operators_are_the_cpus_bitwise_with_its_layout(k):
    inputs = _inputs()
    fn = (CASES + CPU_FIRST)[k]
    for _ in range(2):                  # the second call takes the remembered metadata
        _same(_run(fn, "npu", inputs), _run(fn, "cpu", inputs))


def test_the_remembered_metadata_follows_the_default_dtype():
    i, j = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[2, 2], [2, 2]])
    _same(i.npu() / j.npu(), i / j)                   # float32
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _same(i.npu() / j.npu(), i / j)               # the same signature: now float64
        _same(i.npu() + 0.5, i + 0.5)
    finally:
        torch.set_default_dtype(prev)
    _same(i.npu() / j.npu(), i / j)


def test_a_busy_stream_takes_the_task_path_with_the_same_results():
    inputs = _inputs()
    npu_inputs = [t.to("npu") for t in inputs]
    s = torch.npu.current_stream()
    go = _slow(60)
    try:
        assert not s.npu_stream.idle()
        outs = [f(*npu_inputs) for f in CASES]
        assert not s.npu_stream.idle()            # queued behind the kernel, not run
    finally:
        go.set()
    for f, o in zip(CASES, outs):
        _same(o, f(*inputs))


def test_backward_through_the_structured_operators_is_the_cpus():
    def loss(dev):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                                torch.nn.SiLU(), torch.nn.Linear(32, 8), torch.nn.Tanh(),
                                torch.nn.ReLU(), torch.nn.Linear(8, 4))
        m.to(dev)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(dev)
        y = m(x)
        out = (y.sigmoid() * 3 - 1).pow(2).mean() + y.softmax(-1).sum(0).mean() + \
            torch.nn.functional.cross_entropy(y, torch.arange(8).remainder(4).to(dev)) + \
            torch.cat([y, y.exp()], 1).log_softmax(-1).mean()
        out.backward()
        return out, [p.grad for p in m.parameters()]
    (lc, gc), (ln, gn) = loss("cpu"), loss("npu")
    _same(ln, lc)
    for a, b in zip(gn, gc):
        _same(a, b)


def test_memory_allocated_is_exact_after_many_operators():
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    a, b = torch.randn(64, 64).npu(), torch.randn(64, 64).npu()
    with_inputs = torch.npu.memory_allocated()
    assert with_inputs > base
    for _ in range(300):
        c = (a + b) * a @ b
        c = c.sum(1) + c.mean(0)
        torch.empty(17, 3, device="npu")
        del c
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == with_inputs
    held = [a + b for _ in range(10)]
    one = torch.npu.memory_allocated() - with_inputs
    assert one > 0 and one % 10 == 0
    stats = torch.npu.memory_stats()
    assert stats["allocation.all.current"] >= 12
    del held
    assert torch.npu.memory_allocated() == with_inputs
    del a, b
    assert torch.npu.memory_allocated() == base


def test_an_out_that_grows_or_is_a_view_is_written_as_on_cpu():
    a, b, _, _ = _inputs()
    outs = {}
    for dev in ("cpu", "npu"):
        small = torch.zeros(2, device=dev)
        with pytest.warns(UserWarning, match="resized"):
            r = torch.add(a.to(dev), b.to(dev), out=small)
        assert r is small
        big = torch.zeros(8, 10, device=dev)
        view = big.t()[2:7]                        # a view of a view, as out=
        torch.mul(a.to(dev).t(), 2, out=view[:, :6])
        base = torch.arange(40.0, device=dev).view(5, 8)
        w = base.t()[1:6:2]                         # views of views, written in place
        w.add_(b.to(dev)[:3, :5])
        w[1:].mul_(3)
        outs[dev] = (small, big, base)
    for n, c in zip(outs["npu"], outs["cpu"]):
        _same(n, c)


def test_the_errors_are_torchs():
    a = torch.randn(3, 4).npu()
    with pytest.raises(RuntimeError, match="must match the size"):
        a + torch.randn(5, 4).npu()
    with pytest.raises(RuntimeError, match="same device.*npu:0 and cpu"):
        a + torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        a @ a
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a, torch.randn(3, 4)])
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([a, torch.randn(3, 5).npu()])


def test_another_device_is_switched_to_and_back():
    a = torch.randn(4, 4)
    x = a.to("npu:1")
    torch.npu.set_device(0)
    r = x + x
    assert r.device == torch.device("npu", 1) and torch.npu.current_device() == 0
    _same(r, a + a)


def test_a_dead_storage_leaves_no_entry_and_a_reused_address_its_new_owner():
    """storage.py drops a storage's ``_live`` entry in ``_Owner.__del__`` (no weakref
    callback): the entries are exactly the live storages', a pool address reused by a new
    tensor maps to the new owner, and the typed view (``host_array``) holds the tensor's bits."""
    from runtime.torch import storage as S
    torch.npu.synchronize()
    before = set(S._live)
    kept = [torch.full((16, 16), float(k), device="npu") for k in range(8)]
    for k in range(200):          # short-lived results: the pool hands their addresses out again
        (kept[k % 8] + 1).sum()
    addrs = {t.untyped_storage().data_ptr() for t in kept}
    assert set(S._live) - before == addrs
    assert all(S.owner_of(t).cpu.data_ptr() == t.untyped_storage().data_ptr() for t in kept)
    assert all(torch.equal(S.cpu_view(t), torch.full((16, 16), float(k)))
               for k, t in enumerate(kept))
    del kept
    assert set(S._live) == before


CLONES = [
    lambda x: x.clone(), lambda x: x.t().clone(), lambda x: x[:, ::2].clone(),
    lambda x: x[:1, :3].clone(), lambda x: x.view(2, 3, 2, 5).permute(0, 2, 3, 1).clone(),
    lambda x: x.t().contiguous(), lambda x: x[:, 1:].contiguous(),
    lambda x: x.view(2, 3, 2, 5).clone(memory_format=torch.channels_last),
    lambda x: x.view(2, 3, 2, 5).permute(0, 2, 3, 1).clone(memory_format=torch.contiguous_format),
    lambda x: x[:, :1].expand(6, 4).clone(), lambda x: x.unsqueeze(1).clone(),
]


@pytest.mark.parametrize("k", range(len(CLONES)))
def test_clone_and_contiguous_are_the_cpus_with_its_strides(k):
    """kernels.clone (one Python call on an idle stream): the CPU's strides and bits, for every
    memory format and layout; on a busy stream (the fallback's task path) the same."""
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(k))
    want = CLONES[k](x)
    _same(CLONES[k](x.npu()), want)
    xn = x.npu()
    go = _slow(10)
    try:
        got = CLONES[k](xn)
    finally:
        go.set()
    _same(got, want)


def test_clone_keeps_the_bits_and_the_gradient():
    a = torch.randn(3, 4, dtype=torch.complex64)
    _same(a.npu().conj().clone().resolve_conj(), a.conj().clone().resolve_conj())
    x = torch.randn(5, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    (x.clone() * 2).sum().backward()
    (xn.clone() * 2).sum().backward()
    _same(xn.grad, x.grad)


def test_the_out_form_is_called_through_torchs_function_only_where_it_dispatches_the_same():
    """structured._binding: ``torch.add(a, b, out=c)`` stands for ``add.out`` only where, given
    the same arguments, it dispatches exactly that overload; a Python number among them (the
    Scalar overload) or a patched ``torch.<name>`` keeps the OpOverload. Same bits either way."""
    from runtime.torch import structured as st
    a, b, i, _ = _inputs()
    st._META.clear()
    _same(a.npu() + b.npu(), a + b)
    _same(a.npu() * 3, a * 3)
    _same(i.npu().sum(0), i.sum(0))
    calls = {k[0]: m[4] for k, m in st._META.items()}
    assert calls[torch.ops.aten.add.Tensor] is torch.add
    assert calls[torch.ops.aten.sum.dim_IntList] is torch.sum
    assert calls[torch.ops.aten.mul.Tensor] is torch.ops.aten.mul.Scalar_out
    real = torch.sub
    torch.sub = lambda *args, **kwargs: real(*args, **kwargs)   # a wrapper is never taken
    try:
        st._META.clear()
        _same(a.npu() - b.npu(), a - b)
        assert {k[0]: m[4] for k, m in st._META.items()}[torch.ops.aten.sub.Tensor] is \
            torch.ops.aten.sub.out
    finally:
        torch.sub = real


def test_a_gradient_an_operator_read_is_still_accumulated_in_place():
    """storage.storage_addr: the device finds a storage's owner without ``untyped_storage()``,
    whose Python object torch keeps alive with the storage from then on (its use count stays
    2), so autograd's ``can_accumulate_inplace`` refused every gradient an npu operator had
    read: select_backward's zeros (read by zero_) were summed with a new ``add`` instead of an
    ``add_`` into them. As on CPU, the accumulation is now in place: the summed gradient is in
    the memory of one of the two summed (no profiler: transfer_to_npu's tests swap it)."""
    made = []

    class Read(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            r = torch.zeros_like(g)
            r.add_(g)                   # r is read by operators before it is accumulated
            made.append(r.data_ptr())   # an address only: a reference would keep it
            return r

    def in_place(dev):
        made.clear()
        seen = []
        x = torch.randn(4, 8, device=dev, requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: seen.append(g.data_ptr()))
        (Read.apply(y).sum() + Read.apply(y).sum()).backward()
        assert len(made) == 2 and len(seen) == 1
        return seen[0] in made
    assert in_place("cpu")
    assert in_place("npu")


def test_relu_is_the_cpus_clamp_min_bitwise():
    """kernels.relu: clamp_min(x, 0) as aten defines relu, through the structured kernel: the
    CPU's bits (NaN, -0.0, ints), its strides for a transposed input, its gradient, its error
    for bool."""
    x = torch.tensor([[-1.5, 0.0, -0.0, float("nan")], [2.0, float("-inf"), 3.0, -2.0]])
    for t in (x, x.t(), x.to(torch.float16), torch.tensor([-3, 0, 4]), x[:, ::2]):
        _same(torch.relu(t.npu()), torch.relu(t))
    xn = x.npu().requires_grad_()
    xc = x.clone().requires_grad_()
    torch.relu(xn).sum().backward()
    torch.relu(xc).sum().backward()
    _same(xn.grad, xc.grad)
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        torch.relu(torch.tensor([True]).npu())
