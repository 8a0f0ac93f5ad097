"""The ``_foreach_*`` kernels of npu tensors (runtime/torch/foreach.py) against CPU eager, bitwise:
every foreach operator the optimizers run (AdamW, Adam, SGD with momentum), in place and
functional, over Scalar / List / ScalarList / Tensor overloads, contiguous, non-contiguous and
mixed-shape lists, float32 / bfloat16 / float16; the fallback's branches (a busy stream, a CPU
tensor mixed in, a 0-dim CPU scalar, another device, empty results); and optimizers' training."""
import sys
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
if __name__ == "__main__" and "--old" in sys.argv:     # the benchmark at the end, without them
    import runtime.torch.foreach as _F
    _F.foreach_kernel = lambda op: None
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime.torch import foreach as F  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _device():
    torch.npu.set_device(0)
    torch.arange(8.0, device="npu").mul(2)      # torch's first meta kernel imports sympy


def _same(a, b):
    """npu tensor ``a`` is CPU tensor ``b``: dtype, sizes, strides, bits."""
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), (a, b)
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.is_floating_point():
        a, b = a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)
    assert torch.equal(a, b)


def _same_lists(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        _same(x, y)


def _slow(seconds):
    """Hold the current npu stream busy with a kernel until the returned event is set."""
    go = threading.Event()
    runtime.launch(lambda: go.wait(seconds), stream=torch.npu.current_stream().npu_stream)
    return go


class _Count:
    """Counts the calls foreach.py hands to the general fallback."""
    def __init__(self, monkeypatch):
        self.n = 0
        real = F.fallback

        def counted(op, *a, **k):
            self.n += 1
            return real(op, *a, **k)
        monkeypatch.setattr(F, "fallback", counted)


# ----------------------------------------------------------------- the lists
def _bases(layout, dtype, seed):
    """CPU tensors and a view function for each: the list's tensors are ``view(base)``, on CPU
    and on npu alike (so the npu ones have the same strides)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        shapes, views = [(4, 3)] * 5, [lambda t: t] * 5
    elif layout == "mixed":
        shapes = [(7,), (3, 5), (2, 3, 4), (1,), ()]
        views = [lambda t: t] * 5
    else:                             # non-contiguous: transposed, strided, offset
        shapes = [(6, 8)] * 4
        views = [lambda t: t.t(), lambda t: t[:, ::2], lambda t: t[1:, 2:5],
                 lambda t: t.view(2, 3, 8).permute(2, 0, 1)[::2]]
    # positive values (sqrt, div), away from zero
    return [(torch.rand(s, generator=g) + 0.5).to(dtype) for s in shapes], views


def _lists(layout, dtype, n=3):
    """``n`` lists of the same shapes, as (CPU lists, npu lists)."""
    cpu, npu = [], []
    for k in range(n):
        bases, views = _bases(layout, dtype, 10 + k)
        cpu.append([v(b.clone()) for b, v in zip(bases, views)])
        npu.append([v(b.to("npu")) for b, v in zip(bases, views)])
    for c, d in zip(cpu, npu):
        for x, y in zip(c, d):
            assert x.stride() == y.stride()
    return cpu, npu


def _scalars(xs):
    return [0.25 + 0.125 * k for k in range(len(xs))]


def _scalar_tensor(dev, dtype):
    return torch.tensor(0.7, dtype=dtype, device=dev)


# each case: fn(a, b, c) with three lists on one device
INPLACE = {
    "mul_.Scalar": lambda a, b, c: torch._foreach_mul_(a, 0.9),
    "mul_.List": lambda a, b, c: torch._foreach_mul_(a, b),
    "mul_.ScalarList": lambda a, b, c: torch._foreach_mul_(a, _scalars(a)),
    "mul_.Tensor": lambda a, b, c: torch._foreach_mul_(
        a, torch.tensor(0.7, dtype=a[0].dtype, device=a[0].device)),
    "add_.Scalar": lambda a, b, c: torch._foreach_add_(a, 1e-8),
    "add_.List": lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.01),
    "add_.ScalarList": lambda a, b, c: torch._foreach_add_(a, _scalars(a)),
    "add_.Tensor": lambda a, b, c: torch._foreach_add_(
        a, torch.tensor(0.3, dtype=a[0].dtype, device=a[0].device), alpha=2),
    "sub_.List": lambda a, b, c: torch._foreach_sub_(a, b, alpha=0.5),
    "div_.Scalar": lambda a, b, c: torch._foreach_div_(a, 3.0),
    "div_.List": lambda a, b, c: torch._foreach_div_(a, b),
    "div_.ScalarList": lambda a, b, c: torch._foreach_div_(a, _scalars(a)),
    "lerp_.Scalar": lambda a, b, c: torch._foreach_lerp_(a, b, 0.1),
    "lerp_.List": lambda a, b, c: torch._foreach_lerp_(a, b, c),
    "addcmul_.Scalar": lambda a, b, c: torch._foreach_addcmul_(a, b, b, value=0.001),
    "addcmul_.ScalarList": lambda a, b, c: torch._foreach_addcmul_(a, b, c, _scalars(a)),
    "addcmul_.Tensor": lambda a, b, c: torch._foreach_addcmul_(
        a, b, c, torch.tensor(_scalars(a), device=a[0].device)),
    "addcdiv_.Scalar": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, value=-0.001),
    "addcdiv_.ScalarList": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, _scalars(a)),
    "addcdiv_.Tensor": lambda a, b, c: torch._foreach_addcdiv_(
        a, b, c, torch.tensor(_scalars(a), device=a[0].device)),
    "maximum_.List": lambda a, b, c: torch._foreach_maximum_(a, b),
    "clamp_min_.Scalar": lambda a, b, c: torch._foreach_clamp_min_(a, 0.9),
    "sqrt_": lambda a, b, c: torch._foreach_sqrt_(a),
    "reciprocal_": lambda a, b, c: torch._foreach_reciprocal_(a),
    "neg_": lambda a, b, c: torch._foreach_neg_(a),
    "exp_": lambda a, b, c: torch._foreach_exp_(a),
    "pow_.Scalar": lambda a, b, c: torch._foreach_pow_(a, 1.5),
    "zero_": lambda a, b, c: torch._foreach_zero_(a),
    "copy_": lambda a, b, c: torch._foreach_copy_(a, b),
}
FUNCTIONAL = {
    "sqrt": lambda a, b, c: torch._foreach_sqrt(a),
    "add.List": lambda a, b, c: torch._foreach_add(a, b, alpha=0.01),
    "add.Scalar": lambda a, b, c: torch._foreach_add(a, 1e-8),
    "add.Tensor": lambda a, b, c: torch._foreach_add(
        a, torch.tensor(0.3, dtype=a[0].dtype, device=a[0].device)),
    "sub.Scalar": lambda a, b, c: torch._foreach_sub(a, 1.0),
    "mul.Scalar": lambda a, b, c: torch._foreach_mul(a, 0.9),
    "mul.ScalarList": lambda a, b, c: torch._foreach_mul(a, _scalars(a)),
    "div.List": lambda a, b, c: torch._foreach_div(a, b),
    "maximum.List": lambda a, b, c: torch._foreach_maximum(a, b),
    "neg": lambda a, b, c: torch._foreach_neg(a),
    "exp": lambda a, b, c: torch._foreach_exp(a),
    "pow.Scalar": lambda a, b, c: torch._foreach_pow(a, 2.0),
    "lerp.Scalar": lambda a, b, c: torch._foreach_lerp(a, b, 0.3),
    "addcdiv.ScalarList": lambda a, b, c: torch._foreach_addcdiv(a, b, c, _scalars(a)),
    "addcmul.Scalar": lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.5),
    "norm": lambda a, b, c: torch._foreach_norm(a),
    "norm.inf": lambda a, b, c: torch._foreach_norm(a, float("inf")),
    "max": lambda a, b, c: torch._foreach_max(a),
    "clone": lambda a, b, c: torch._foreach_clone(a),
    "sub.List": lambda a, b, c: torch._foreach_sub(a, b, alpha=2),
    "mul.List": lambda a, b, c: torch._foreach_mul(a, b),
    "div.Scalar": lambda a, b, c: torch._foreach_div(a, 3.0),
    "div.ScalarList": lambda a, b, c: torch._foreach_div(a, _scalars(a)),
    "add.ScalarList": lambda a, b, c: torch._foreach_add(a, _scalars(a)),
    "pow.List": lambda a, b, c: torch._foreach_pow(a, b),
    "pow.ScalarList": lambda a, b, c: torch._foreach_pow(a, _scalars(a)),
    "addcmul.ScalarList": lambda a, b, c: torch._foreach_addcmul(a, b, c, _scalars(a)),
    "addcdiv.Scalar": lambda a, b, c: torch._foreach_addcdiv(a, b, c, value=-0.5),
    "addcdiv.Tensor": lambda a, b, c: torch._foreach_addcdiv(
        a, b, c, torch.tensor(_scalars(a), device=a[0].device)),
    "lerp.List": lambda a, b, c: torch._foreach_lerp(a, b, c),
    "lerp.ScalarList": lambda a, b, c: torch._foreach_lerp(a, b, _scalars(a)),
    "maximum.Scalar": lambda a, b, c: torch._foreach_maximum(a, 1.0),
    "minimum.List": lambda a, b, c: torch._foreach_minimum(a, b),
    "sigmoid": lambda a, b, c: torch._foreach_sigmoid(a),
    "log": lambda a, b, c: torch._foreach_log(a),
    "rsqrt": lambda a, b, c: torch._foreach_rsqrt(a),
    "reciprocal": lambda a, b, c: torch._foreach_reciprocal(a),
    "round": lambda a, b, c: torch._foreach_round(a),
    "sign": lambda a, b, c: torch._foreach_sign(a),
    "lgamma": lambda a, b, c: torch._foreach_lgamma(a),
    "tanh": lambda a, b, c: torch._foreach_tanh(a),
    "zero": lambda a, b, c: torch.ops.aten._foreach_zero(a),
}
LAYOUTS = ("contiguous", "noncontiguous", "mixed")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(INPLACE))
def test_in_place_foreach_is_the_cpus_bitwise(name, layout, dtype, monkeypatch):
    fn = INPLACE[name]
    cpu, npu = _lists(layout, dtype)
    count = _Count(monkeypatch)
    for _ in range(2):
        fn(*npu)
        fn(*cpu)
        for c, d in zip(cpu, npu):
            _same_lists(d, c)
    assert count.n == 0                   # the fast path, not the fallback


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_foreach_is_the_cpus_bitwise_with_its_layout(name, layout, dtype,
                                                                monkeypatch):
    fn = FUNCTIONAL[name]
    cpu, npu = _lists(layout, dtype)
    count = _Count(monkeypatch)
    for _ in range(3):                    # the first call learns the results' metadata
        got = fn(*npu)
        assert all(t.device.type == "npu" for t in got)
        _same_lists(got, fn(*cpu))
    assert count.n <= 1
    for c, d in zip(cpu, npu):            # the inputs untouched
        _same_lists(d, c)


def test_functional_results_follow_promotion_and_the_default_dtype(monkeypatch):
    i = [torch.arange(6, dtype=torch.int32).view(2, 3) + 1, torch.arange(4) + 2]
    n = [t.npu() for t in i]
    count = _Count(monkeypatch)
    for _ in range(2):
        _same_lists(torch._foreach_sqrt(n), torch._foreach_sqrt(i))          # int -> float
        _same_lists(torch._foreach_add(n, 2), torch._foreach_add(i, 2))      # int stays int
        _same_lists(torch._foreach_add(n, 2.5), torch._foreach_add(i, 2.5))  # int + float
        _same_lists(torch._foreach_mul(n, [2, 0.5]), torch._foreach_mul(i, [2, 0.5]))
        _same_lists(torch._foreach_norm(n[1:] and [t.float() for t in n]),
                    torch._foreach_norm([t.float() for t in i]))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _same_lists(torch._foreach_sqrt(n), torch._foreach_sqrt(i))          # now float64
        _same_lists(torch._foreach_add(n, 2.5), torch._foreach_add(i, 2.5))
    finally:
        torch.set_default_dtype(prev)
    assert count.n <= 7                   # one learning call per signature at most


def test_the_step_sizes_of_a_scalar_list_change_without_learning_again(monkeypatch):
    cpu, npu = _lists("contiguous", torch.float32)
    count = _Count(monkeypatch)
    for k in range(4):
        s = [0.1 * k + j for j in range(len(cpu[0]))]
        _same_lists(torch._foreach_mul(npu[0], s), torch._foreach_mul(cpu[0], s))
        torch._foreach_addcdiv_(npu[0], npu[1], npu[2], s)
        torch._foreach_addcdiv_(cpu[0], cpu[1], cpu[2], s)
        _same_lists(npu[0], cpu[0])
    assert count.n <= 1


def test_every_in_place_overload_writes_only_its_self_list():
    """The claim the in-place kernel rests on: its only written argument is the positional
    ``self`` (never resized: no ``out=``), and the functional ones write nothing."""
    kinds = {}
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::_foreach_"):
            continue
        name = full[len("aten::"):]
        op = torch.ops.aten
        for part in name.split("."):
            op = getattr(op, part)
        if isinstance(op, torch._ops.OpOverloadPacket):
            op = op.default
        k = kinds[name] = F.kind(op)
        written = [(i, a) for i, a in enumerate(op._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write]
        if k == "inplace":
            assert len(written) == 1 and written[0][0] == 0 and written[0][1].name == "self" \
                and not written[0][1].kwarg_only, name
            assert not op._schema.returns
        elif k == "functional":
            assert not written
            assert F.out_overload(op) is not None
        else:                               # .out, _foreach_mm, _foreach_pow.ScalarAndTensor
            assert name.endswith("out") or name in ("_foreach_mm", "_foreach_pow.ScalarAndTensor")
    assert sum(k == "inplace" for k in kinds.values()) > 60
    assert sum(k == "functional" for k in kinds.values()) > 60
    assert kinds["_foreach_sqrt"] == "functional" and kinds["_foreach_addcdiv_.ScalarList"] == \
        "inplace" and kinds["_foreach_sqrt.out"] is None


def test_an_in_place_broadcast_that_does_not_fit_raises_and_resizes_nothing():
    a, b = torch.ones(3, 1), torch.ones(3, 4)
    na, nb = a.npu(), b.npu()
    with pytest.raises(RuntimeError) as cpu_err:
        torch._foreach_add_([a], [b])
    with pytest.raises(RuntimeError) as npu_err:
        torch._foreach_add_([na], [nb])
    assert str(npu_err.value) == str(cpu_err.value)
    assert na.shape == (3, 1) and na.stride() == (1, 1)
    _same(na, a)


def test_the_out_overloads_keep_the_fallback_and_resize_their_out():
    x = [torch.rand(3, 4) + 1, torch.rand(5)]
    n = [t.npu() for t in x]
    outs = [torch.empty(0, device="npu"), torch.empty(5, device="npu")]
    torch.ops.aten._foreach_sqrt.out(n, out=outs)     # the first one grows from nothing
    _same_lists(outs, torch._foreach_sqrt(x))


# ----------------------------------------------------------------- the fallback's branches
def test_a_busy_stream_takes_the_task_path_with_the_same_results(monkeypatch):
    cpu, npu = _lists("noncontiguous", torch.float32)
    torch._foreach_sqrt(npu[0])                   # learnt on an idle stream
    s = torch.npu.current_stream()
    count = _Count(monkeypatch)
    go = _slow(60)
    try:
        assert not s.npu_stream.idle()
        torch._foreach_mul_(npu[0], 0.9)
        torch._foreach_addcmul_(npu[1], npu[0], npu[2], _scalars(npu[0]))
        roots = torch._foreach_sqrt(npu[1])
        assert not s.npu_stream.idle()            # queued behind the kernel, not run
    finally:
        go.set()
    assert count.n == 3
    torch._foreach_mul_(cpu[0], 0.9)
    torch._foreach_addcmul_(cpu[1], cpu[0], cpu[2], _scalars(cpu[0]))
    _same_lists(roots, torch._foreach_sqrt(cpu[1]))
    _same_lists(npu[1], cpu[1])


def test_a_cpu_tensor_in_a_list_raises_torchs_error():
    n = [torch.ones(3, device="npu"), torch.ones(3)]
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_mul_(n, 2.0)
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_sqrt(n)
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_([torch.ones(3, device="npu")], [torch.ones(3)])


def test_a_0_dim_cpu_scalar_takes_the_fallback_and_is_the_cpus(monkeypatch):
    cpu, npu = _lists("mixed", torch.float32)
    count = _Count(monkeypatch)
    s = torch.tensor(0.3)
    torch._foreach_mul_(npu[0], s)            # _foreach_mul_.Tensor
    torch._foreach_mul_(cpu[0], s)
    _same_lists(npu[0], cpu[0])
    assert count.n == 1
    r = torch.ops.aten._foreach_mul.Tensor(npu[0], s)
    assert count.n == 2
    _same_lists(r, torch.ops.aten._foreach_mul.Tensor(cpu[0], s))


def test_empty_results_and_empty_tensors(monkeypatch):
    x = [torch.empty(0, 3), torch.rand(4) + 1]
    n = [t.npu() for t in x]
    count = _Count(monkeypatch)
    for _ in range(2):
        _same_lists(torch._foreach_sqrt(n), torch._foreach_sqrt(x))
        torch._foreach_mul_(n, 3.0)
        torch._foreach_mul_(x, 3.0)
        _same_lists(n, x)
    assert count.n == 2                   # the functional one each time: no elements


def test_another_device_than_the_current_one_takes_the_fallback(monkeypatch):
    if torch.npu.device_count() < 2:
        pytest.skip("one npu device")
    x = [torch.rand(3) + 1, torch.rand(2, 2) + 1]
    n = [t.to("npu:1") for t in x]
    count = _Count(monkeypatch)
    r = torch._foreach_sqrt(n)
    torch._foreach_mul_(n, 2.0)
    assert count.n == 2
    assert all(t.device == torch.device("npu:1") for t in r)
    _same_lists(r, torch._foreach_sqrt(x))
    torch._foreach_mul_(x, 2.0)
    _same_lists(n, x)
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_([torch.ones(2, device="npu:0")], [torch.ones(2, device="npu:1")])


def test_the_profiler_takes_the_fallback(monkeypatch):
    cpu, npu = _lists("contiguous", torch.float32)
    count = _Count(monkeypatch)
    monkeypatch.setattr(F.profiler, "active", lambda: True)
    monkeypatch.setattr(runtime.profiler, "active", lambda: True)
    torch._foreach_mul_(npu[0], 2.0)
    r = torch._foreach_sqrt(npu[0])
    monkeypatch.undo()
    torch.npu.synchronize()
    assert count.n == 2
    torch._foreach_mul_(cpu[0], 2.0)
    _same_lists(r, torch._foreach_sqrt(cpu[0]))


def test_the_stream_sanitizer_takes_the_fallback(monkeypatch):
    cpu, npu = _lists("contiguous", torch.float32)
    torch._foreach_sqrt(npu[0])
    count = _Count(monkeypatch)
    runtime.enable_stream_check()
    try:
        torch._foreach_mul_(npu[0], 2.0)
        r = torch._foreach_sqrt(npu[0])
        torch.npu.synchronize()
    finally:
        runtime.enable_stream_check("off")
    assert count.n == 2
    torch._foreach_mul_(cpu[0], 2.0)
    _same_lists(r, torch._foreach_sqrt(cpu[0]))


# ----------------------------------------------------------------- the remembered views
def test_a_tensor_whose_metadata_changes_in_place_gets_a_new_view():
    base = torch.rand(4, 6) + 0.5
    a, c = base.npu(), base.clone()
    other = (torch.rand(4, 6) + 0.5)
    o_npu = other.npu()
    for step in range(5):
        torch._foreach_mul_([a], 1.5)               # remembered
        torch._foreach_mul_([c], 1.5)
        _same(a, c)
        if step == 0:
            a.t_(), c.t_()                          # same address, other sizes and strides
        elif step == 1:
            a.as_strided_((3, 2), (1, 4), 2), c.as_strided_((3, 2), (1, 4), 2)
        elif step == 2:
            a.resize_(5), c.resize_(5)
        elif step == 3:
            a.set_(o_npu), c.set_(other)            # another storage
    _same(o_npu, other)
    a.data, c.data = a.data.view(torch.int32), c.data.view(torch.int32)    # another dtype
    torch._foreach_add_([a], 7)
    torch._foreach_add_([c], 7)
    _same(a, c)
    _same(o_npu, other)


def test_a_remembered_view_goes_with_its_tensor():
    x = torch.rand(3, device="npu")
    torch._foreach_mul_([x], 2.0)
    k = id(x)
    assert k in F._VIEWS and F._VIEWS[k][0]() is x
    r = torch._foreach_sqrt([x])                    # learns the results' metadata
    assert id(r[0]) not in F._VIEWS
    r = torch._foreach_sqrt([x])                    # results are remembered when made
    assert id(r[0]) in F._VIEWS and F._VIEWS[id(r[0])][7] is F.S.shared_cpu_view(r[0])
    rk = id(r[0])
    del x, r
    assert k not in F._VIEWS and rk not in F._VIEWS


def test_a_remembered_view_of_a_reset_device_raises():
    from runtime.errors import MemoryAccessError
    with torch.npu.device(6):
        x = [torch.ones(10, device="npu:6"), torch.ones(3, device="npu:6")]
        torch._foreach_mul_(x, 2.0)                 # remembered
        r = torch._foreach_sqrt(x)
        runtime.reset_device(6)
        with pytest.raises(MemoryAccessError):
            torch._foreach_mul_(x, 2.0)
        with pytest.raises(MemoryAccessError):
            torch._foreach_add_(r, 1.0)
        with pytest.raises(MemoryAccessError):
            torch._foreach_sqrt(x)


# ----------------------------------------------------------------- optimizers
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                               torch.nn.Linear(32, 8))


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01, amsgrad=True,
                                               foreach=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                              weight_decay=1e-3, foreach=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_with_foreach_optimizers_is_the_cpus_bitwise(name):
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, 16, generator=g) for _ in range(5)]
    params = {}
    for dev in ("cpu", "npu"):
        m = _model().to(dev)
        opt = OPTIMIZERS[name](m.parameters())
        for x in xs:
            loss = m(x.to(dev)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        params[dev] = [p.detach() for p in m.parameters()]
    _same_lists(params["npu"], params["cpu"])


# ----------------------------------------------------------------- the measurement
def bench(rounds: int = 15) -> dict:
    """AdamW.step() after a forward and backward on benchmarks/npu_ops.py's Trainer (24
    parameters): npu (foreach, torch's default for the device) against CPU's for-loop (its
    default) and CPU foreach=True; ``_foreach_sqrt`` and ``_foreach_mul_`` per call on the 24
    parameters. Process CPU time, one torch thread, the kinds interleaved round by round, the
    best round of each: ``python tests/torch/test_foreach_kernels.py [--old]`` (``--old``: every
    foreach overload through ops.fallback, as before runtime/torch/foreach.py)."""
    import time
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from benchmarks.npu_ops import Trainer
    torch.set_num_threads(1)
    torch.npu.set_device(0)
    tr = {d: Trainer(d) for d in ("cpu", "npu")}
    fe = Trainer("cpu")
    fe.opt = torch.optim.AdamW(fe.m.parameters(), lr=1e-3, foreach=True)
    for t in (*tr.values(), fe):
        t.step()
        t.step()

    def step(t):
        loss = t.m(t.x).square().mean()
        t.opt.zero_grad()
        loss.backward()
        s = time.process_time()
        t.opt.step()
        return time.process_time() - s

    sq = {d: [p.detach().abs() for p in tr[d].m.parameters()] for d in tr}

    def per_call(f, n=10):
        s = time.process_time()
        for _ in range(n):
            f()
        return (time.process_time() - s) / n
    kinds = {
        "step_cpu_loop": lambda: step(tr["cpu"]), "step_cpu_foreach": lambda: step(fe),
        "step_npu": lambda: step(tr["npu"]),
        "sqrt_cpu": lambda: per_call(lambda: torch._foreach_sqrt(sq["cpu"])),
        "sqrt_npu": lambda: per_call(lambda: torch._foreach_sqrt(sq["npu"])),
        "mul__cpu": lambda: per_call(lambda: torch._foreach_mul_(sq["cpu"], 1.0)),
        "mul__npu": lambda: per_call(lambda: torch._foreach_mul_(sq["npu"], 1.0)),
    }
    best = {k: float("inf") for k in kinds}
    for _ in range(rounds):
        for k, f in kinds.items():
            best[k] = min(best[k], min(f() for _ in range(3)))
    torch.npu.synchronize()
    out = {k: round(v * 1e6, 1) for k, v in best.items()}
    out["npu/cpu_loop"] = round(best["step_npu"] / best["step_cpu_loop"], 2)
    out["npu/cpu_foreach"] = round(best["step_npu"] / best["step_cpu_foreach"], 2)
    return out


if __name__ == "__main__":
    print({"foreach_kernels": "--old" not in sys.argv, **bench()})
