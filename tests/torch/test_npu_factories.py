"""The npu factories' own kernels (runtime/torch/factories.py): ``arange``, ``zeros``, ``ones``,
``full``, ``scalar_tensor``, ``eye``, ``linspace``, ``*_like``, ``new_*``, ``_to_copy``
(``torch.tensor(..., device="npu")``, ``.to("npu")``) and attention's ``_fused_sdp_choice``:
bitwise, dtype and strides as CPU eager over many arguments, CPU's errors, and the slow path
(torch's composite) kept where it matters: a busy stream, the profiler's names, another
device, a graph capture."""
import json
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import runtime  # noqa: E402
from runtime import profiler  # noqa: E402
from runtime.torch import factories  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

DTYPES = [None, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]


@pytest.fixture(autouse=True, scope="module")
def _device():
    torch.npu.set_device(0)
    torch.arange(8.0, device="npu").mul(2)      # torch's first meta kernel imports sympy


def _same(n, c):
    """npu result ``n`` is CPU result ``c``: device type, dtype, sizes, strides and bits."""
    assert n.device.type == "npu" and c.device.type == "cpu"
    n = n.cpu()
    assert (n.dtype, n.shape, n.stride()) == (c.dtype, c.shape, c.stride()), (n, c)
    n, c = n.contiguous().reshape(-1), c.contiguous().reshape(-1)
    if n.dtype.is_floating_point or n.dtype.is_complex:
        n, c = n.view(torch.uint8), c.view(torch.uint8)
    assert torch.equal(n, c), (n, c)


def _both(f, *args, **kwargs):
    """``f`` on CPU and on npu (``device=``): equal results, or the same exception and words."""
    try:
        c = f(*args, device="cpu", **kwargs)
    except Exception as e:      # noqa: BLE001 - the npu call must raise the same
        with pytest.raises(type(e)) as got:
            f(*args, device="npu", **kwargs)
        assert str(got.value).split("\n")[0] == str(e).split("\n")[0]
        return None
    n = f(*args, device="npu", **kwargs)
    _same(n, c)
    return n


def _busy(seconds=60):
    """Hold the current npu stream busy until the returned event is set."""
    go = threading.Event()
    runtime.launch(lambda: go.wait(seconds), stream=torch.npu.current_stream().npu_stream)
    return go


def _no_composite(monkeypatch, *names):
    """Make torch's composite kernel of ``names`` raise: the call must take the fast path."""
    class Refuse:
        def call_boxed(self, *a, **k):
            raise AssertionError("took the composite")
    for name in names:
        monkeypatch.setitem(factories._COMPOSITE, name, Refuse())


# ---------------------------------------------------------------------- arange
NUM = st.one_of(st.integers(-40, 40), st.floats(-20, 20, allow_nan=False, width=32),
                st.sampled_from([0.1, -0.3, 1e-3, 2.5, float("inf"), float("nan"), True]))


@SETTINGS
@given(start=NUM, end=NUM, step=st.one_of(st.sampled_from([1, 2, -1, -3, 0, 0.0]), NUM),
       dtype=st.sampled_from(DTYPES))
def test_arange_is_the_cpus_bitwise_with_its_dtype_and_errors(start, end, step, dtype):
    try:
        n = torch.arange(start, end, step, dtype=dtype, device="meta").numel()
    except Exception:           # noqa: BLE001 - an error: compared below
        n = 0
    if n > 100_000:
        return                  # ranges too long for the test (and for the device's memory)
    _both(torch.arange, start, end, step, dtype=dtype)


@pytest.mark.parametrize("args", [(64,), (5.0,), (0,), (-3,), (2, 9), (2.5, 9), (9, 2, -2),
                                  (0, 1, 0.1), (1, 0, -0.1), (0, 10, 3), (-5, 5, 0.7),
                                  (0, 3, 0), (0, float("inf")), (5, 0, 1), (0, 2 ** 40, 2 ** 38),
                                  (True,), (-0.0, 3.0)])
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.int32, torch.float16])
def test_arange_corners(args, dtype):
    _both(torch.arange, *args, dtype=dtype)


def test_arange_dtype_follows_the_default_dtype_and_its_kernel_takes_the_fast_path(monkeypatch):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert _both(torch.arange, 0, 1, 0.25).dtype == torch.float64
        assert _both(torch.arange, 4).dtype == torch.int64
    finally:
        torch.set_default_dtype(prev)
    assert _both(torch.arange, 0, 1, 0.25).dtype == torch.float32      # the same key, now
    _no_composite(monkeypatch, "arange", "arange.start", "arange.start_step")
    _both(torch.arange, 7)
    _both(torch.arange, 1, 7)
    _both(torch.arange, 1, 7, 2)


def test_arange_out_and_requires_grad():
    out = torch.empty(0, device="npu", dtype=torch.int64)
    torch.arange(5, out=out)
    _same(out, torch.arange(5))
    t = torch.arange(4.0, device="npu", requires_grad=True)
    assert t.requires_grad and t.is_leaf
    (t * 2).sum().backward()
    _same(t.grad, torch.full((4,), 2.0))


# ---------------------------------------------------------------------- zeros, ones, full
SIZES = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
FILL = st.one_of(st.integers(-300, 300), st.floats(allow_nan=True, width=32), st.booleans(),
                 st.sampled_from([-0.0, 1e30, 2 ** 40, complex(1, -2)]))


@SETTINGS
@given(size=SIZES, dtype=st.sampled_from(DTYPES), value=FILL)
def test_zeros_ones_full_are_the_cpus(size, dtype, value):
    _both(torch.zeros, size, dtype=dtype)
    _both(torch.ones, size, dtype=dtype)
    _both(torch.full, size, value, dtype=dtype)
    if not size:
        _both(torch.scalar_tensor, value, dtype=dtype)


def test_full_infers_its_dtype_from_the_value_and_the_default_dtype():
    assert _both(torch.full, (2,), 3).dtype == torch.int64
    assert _both(torch.full, (2,), True).dtype == torch.bool
    assert _both(torch.full, (2,), 1.5).dtype == torch.float32
    assert _both(torch.full, (2,), 1j).dtype == torch.complex64
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert _both(torch.full, (2,), 1.5).dtype == torch.float64
        assert _both(torch.full, (2,), 1j).dtype == torch.complex128
        assert _both(torch.ones, (2,)).dtype == torch.float64
        assert _both(torch.zeros, (2,)).dtype == torch.float64
        assert _both(torch.scalar_tensor, 2).dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)


@pytest.mark.parametrize("call", [
    lambda device: torch.zeros(-1, 3, device=device),
    lambda device: torch.ones((2, -2), device=device),
    lambda device: torch.full((2,), 1.0, layout=torch.sparse_coo, device=device),
    lambda device: torch.full((2,), 300, dtype=torch.int8, device=device),
    lambda device: torch.full((2,), 1j, dtype=torch.float32, device=device),
    lambda device: torch.arange(0, 3, 0, device=device),
    lambda device: torch.arange(0, 3, -1, device=device),
    lambda device: torch.arange(0, float("nan"), device=device),
    lambda device: torch.arange(3, dtype=torch.bool, device=device),
    lambda device: torch.eye(-1, device=device),
    lambda device: torch.eye(2, -3, device=device),
    lambda device: torch.linspace(0, 1, -1, device=device),
    # empty and empty_strided (runtime/torch/kernels.py, storage.check_sizes): they named a
    # negative malloc, or made a tensor of a format the CPU refuses
    lambda device: torch.empty(-1, device=device),
    lambda device: torch.empty((2, -3), dtype=torch.bfloat16, device=device),
    lambda device: torch.empty_strided((-1,), (1,), device=device),
    lambda device: torch.empty_strided((2,), (-1,), device=device),
    lambda device: torch.empty(2, 3, memory_format=torch.channels_last, device=device),
    lambda device: torch.empty(2, 3, 4, 5, memory_format=torch.channels_last_3d, device=device),
    lambda device: torch.empty(2, memory_format=torch.preserve_format, device=device),
])
def test_the_errors_are_the_cpus(call):
    with pytest.raises(Exception) as cpu:
        call("cpu")
    with pytest.raises(type(cpu.value)) as npu:
        call("npu")
    assert str(npu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


@pytest.mark.parametrize("fmt,rank", [(torch.channels_last, 4), (torch.channels_last_3d, 5)])
def test_empty_in_a_channels_last_format_has_the_cpus_strides_zero_sizes_too(fmt, rank):
    import itertools
    for size in itertools.product([0, 1, 2, 3], repeat=rank):
        n = torch.empty(size, memory_format=fmt, device="npu")
        assert n.stride() == torch.empty(size, memory_format=fmt).stride(), size
        assert n.is_contiguous(memory_format=fmt)


def test_the_factories_take_their_fast_path(monkeypatch):
    a = torch.randn(3, 4)
    n = a.npu()
    _no_composite(monkeypatch, *factories._KERNELS)
    got = [torch.zeros(2, 3, device="npu"), torch.ones(2, 3, device="npu"),
           torch.full((2, 3), 7, device="npu"), torch.scalar_tensor(7, device="npu"),
           torch.eye(3, 4, device="npu"), torch.linspace(-1, 1, 7, device="npu"),
           torch.zeros_like(n), torch.ones_like(n), torch.full_like(n, 2), n.new_zeros(2),
           n.new_ones(2), n.new_full((2,), 3), torch.tensor([1, 2], device="npu"), n.double(),
           a.t().to("npu")]
    host = [n.t().cpu(), n.to("cpu", torch.float16)]
    monkeypatch.undo()          # .cpu() takes _to_copy's composite (to the host)
    want = [torch.zeros(2, 3), torch.ones(2, 3), torch.full((2, 3), 7), torch.scalar_tensor(7),
            torch.eye(3, 4), torch.linspace(-1, 1, 7), torch.zeros_like(a), torch.ones_like(a),
            torch.full_like(a, 2), a.new_zeros(2), a.new_ones(2), a.new_full((2,), 3),
            torch.tensor([1, 2]), a.double(), a.t().clone()]
    for g, w in zip(got, want):
        _same(g, w)
    for h, w in zip(host, (a.t(), a.half())):
        assert h.device.type == "cpu" and h.stride() == w.stride() and torch.equal(h, w)


def test_requires_grad_and_reused_memory_is_overwritten():
    z = torch.zeros(4, device="npu", requires_grad=True)
    assert z.requires_grad and z.is_leaf
    (z + 1).sum().backward()
    _same(z.grad, torch.ones(4))
    for _ in range(3):          # reused pool memory holds old bytes: zeros / ones overwrite them
        torch.full((64,), float("nan"), device="npu")
        _same(torch.zeros(64, device="npu"), torch.zeros(64))
        _same(torch.ones(64, device="npu", dtype=torch.float16),
              torch.ones(64, dtype=torch.float16))


@SETTINGS
@given(n=st.integers(0, 6), m=st.one_of(st.none(), st.integers(0, 6)),
       dtype=st.sampled_from(DTYPES))
def test_eye_is_the_cpus(n, m, dtype):
    if m is None:
        _both(torch.eye, n, dtype=dtype)
    else:
        _both(torch.eye, n, m, dtype=dtype)


@SETTINGS
@given(start=NUM, end=NUM, steps=st.integers(0, 9),
       dtype=st.sampled_from([None, torch.float32, torch.float64, torch.float16, torch.int64,
                              torch.int32, torch.complex64]))
def test_linspace_is_the_cpus(start, end, steps, dtype):
    _both(torch.linspace, start, end, steps, dtype=dtype)


# ---------------------------------------------------------------------- *_like, new_*
def _layouts():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 6, 2, 3, generator=g)
    return [base, base[:, :3], base.transpose(0, 2), base.permute(3, 1, 0, 2),
            base.contiguous(memory_format=torch.channels_last), base[::2], base[0, 0],
            base.reshape(-1)[:0], torch.randn((), generator=g), base.to(torch.float16),
            (base * 10).to(torch.int32), base > 0, base.expand(2, 4, 6, 2, 3)]


@pytest.mark.parametrize("k", range(13))
@pytest.mark.parametrize("fmt", [None, torch.preserve_format, torch.contiguous_format,
                                 torch.channels_last])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int16])
def test_like_factories_are_the_cpus_with_its_strides(k, fmt, dtype):
    c = _layouts()[k]
    n = c.to("npu")
    kw = {"dtype": dtype}
    if fmt is not None:
        kw["memory_format"] = fmt
    for f, args in ((torch.zeros_like, ()), (torch.ones_like, ()), (torch.full_like, (-2.5,)),
                    (torch.full_like, (7,))):
        try:
            want = f(c, *args, **kw)
        except Exception as e:      # noqa: BLE001
            with pytest.raises(type(e)):
                f(n, *args, **kw)
            continue
        _same(f(n, *args, **kw), want)


@pytest.mark.parametrize("k", range(13))
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bool])
def test_new_factories_are_the_cpus(k, dtype):
    c = _layouts()[k]
    n = c.to("npu")
    for size in ((), (3,), (2, 0), (2, 3)):
        _same(n.new_zeros(size, dtype=dtype), c.new_zeros(size, dtype=dtype))
        _same(n.new_ones(size, dtype=dtype), c.new_ones(size, dtype=dtype))
        _same(n.new_full(size, 3, dtype=dtype), c.new_full(size, 3, dtype=dtype))
        _same(n.new_full(size, -0.0, dtype=dtype), c.new_full(size, -0.0, dtype=dtype))


def test_like_to_another_device_type_is_torchs():
    n = torch.randn(3).npu()
    r = torch.zeros_like(n, device="cpu")
    assert r.device.type == "cpu" and torch.equal(r, torch.zeros(3))
    r = n.new_ones(2, device="cpu")
    assert r.device.type == "cpu" and torch.equal(r, torch.ones(2))


# ---------------------------------------------------------------------- _to_copy
DATA = st.one_of(
    st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=6),
    st.lists(st.floats(allow_nan=True, width=64), max_size=6),
    st.lists(st.booleans(), max_size=6),
    st.lists(st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=2), max_size=3),
    st.floats(allow_nan=True), st.integers(-5, 5))


@SETTINGS
@given(data=DATA, dtype=st.sampled_from([None, torch.float32, torch.float64, torch.float16,
                                         torch.bfloat16, torch.int64, torch.int8, torch.bool]))
def test_tensor_on_npu_is_the_cpus(data, dtype):
    _both(torch.tensor, data, dtype=dtype)


@pytest.mark.parametrize("k", range(13))
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.float16, torch.int32])
@pytest.mark.parametrize("fmt", [None, torch.contiguous_format, torch.channels_last])
def test_to_npu_and_dtype_casts_on_npu_are_the_cpus(k, dtype, fmt):
    c = _layouts()[k]
    kw = {} if fmt is None else {"memory_format": fmt}
    try:
        want = c.to(dtype or c.dtype, copy=True, **kw)
    except Exception as e:          # noqa: BLE001
        with pytest.raises(type(e)):
            c.to("npu", dtype, **kw)
        return
    _same(c.to("npu", dtype, **kw) if dtype else c.to("npu", **kw), want)
    n = c.to("npu")
    _same(n.to(dtype or c.dtype, copy=True, **kw), want)
    h = n.to("cpu", dtype or c.dtype, **kw)            # to the host, laid out as on CPU
    assert h.device.type == "cpu"
    assert (h.dtype, h.shape, h.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(h.contiguous().reshape(-1).view(torch.uint8),
                       want.contiguous().reshape(-1).view(torch.uint8))


def test_to_npu_of_a_conjugate_and_from_npu_to_the_host():
    c = torch.randn(3, dtype=torch.complex64)
    _same(c.conj().to("npu"), c.conj().resolve_conj())
    n = c.to("npu")
    back = n.to("cpu", torch.complex128)
    assert back.device.type == "cpu" and torch.equal(back, c.to(torch.complex128))


# ---------------------------------------------------------------------- the slow paths
def _calls():
    a = torch.randn(3, 4)
    return [
        lambda d: torch.arange(1, 9, 2, device=d),
        lambda d: torch.arange(0, 1, 0.125, device=d),
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.ones(5, device=d, dtype=torch.int8),
        lambda d: torch.full((2,), 1.5, device=d),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.linspace(0, 1, 5, device=d),
        lambda d: torch.tensor([1.5, 2.5], device=d),
        lambda d: torch.zeros_like(a.to(d)),
        lambda d: torch.full_like(a.to(d), 4),
        lambda d: a.to(d).new_ones(2),
        lambda d: a.to(d).half(),
    ]


def test_a_busy_stream_takes_the_composite_in_stream_order():
    outs = []
    s = torch.npu.current_stream()
    calls = _calls()
    go = _busy()
    try:
        assert not s.npu_stream.idle()
        outs = [f("npu") for f in calls]
        assert not s.npu_stream.idle()          # queued behind the kernel, not run
    finally:
        go.set()
    for f, o in zip(calls, outs):
        _same(o, f("cpu"))


def test_the_profiler_records_the_operators_the_composite_calls(tmp_path):
    path = str(tmp_path / "t.json")
    with profiler.profile(path):
        torch.arange(5, device="npu")
        torch.zeros(3, device="npu")
        torch.full((3,), 2.0, device="npu")
        torch.eye(2, device="npu")
        torch.ones_like(torch.empty(2, device="npu"))
    names = [e["name"] for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    assert names == ["aten::arange.start_out", "aten::zero_", "aten::fill_.Scalar",
                     "aten::eye.m_out", "aten::fill_.Scalar"]
    assert names[0].split(".")[0] == "aten::arange"     # torch_npu.profiler's operator name


def test_the_stream_sanitizer_sees_the_factories_writes():
    runtime.enable_stream_check()
    try:
        for f in _calls():
            _same(f("npu"), f("cpu"))
    finally:
        runtime.enable_stream_check("off")


def test_another_device_is_made_there_and_the_current_one_kept():
    torch.npu.set_device(0)
    a = torch.randn(3, 4)
    for r, want in ((torch.arange(6, device="npu:1"), torch.arange(6)),
                    (torch.zeros(2, device="npu:1"), torch.zeros(2)),
                    (torch.full((2,), 3, device="npu:1"), torch.full((2,), 3)),
                    (torch.zeros_like(a.to("npu:1")), torch.zeros(3, 4)),
                    (a.to("npu:1").new_full((2,), 1.5), torch.full((2,), 1.5)),
                    (a.to("npu:1").double(), a.double()),
                    (torch.tensor([1, 2], device="npu:1"), torch.tensor([1, 2]))):
        assert r.device == torch.device("npu", 1)
        _same(r, want)
    assert torch.npu.current_device() == 0


def test_pin_memory_takes_the_composite_as_before(monkeypatch):
    """pin_memory=True names host memory; on npu torch's composite ignores it (as before)."""
    calls = []
    real = factories._COMPOSITE["zeros"]

    class Spy:
        def call_boxed(self, *a, **k):
            calls.append(k.get("pin_memory"))
            return real.call_boxed(*a, **k)
    monkeypatch.setitem(factories._COMPOSITE, "zeros", Spy())
    _same(torch.zeros(3, device="npu", pin_memory=True), torch.zeros(3))
    assert calls == [True]
    _same(torch.arange(3, device="npu", pin_memory=True), torch.arange(3))


def test_factories_are_captured_and_replayed_bitwise():
    with torch.no_grad():
        for f in _calls():
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g):
                out = f("npu")
            assert len(g) >= 1                  # a node: nothing ran eagerly
            g.replay()
            _same(out, f("cpu"))
    assert not torch.npu.is_current_stream_capturing()


# ---------------------------------------------------------------------- _fused_sdp_choice
@pytest.mark.parametrize("shape", [(2, 4, 16, 8), (1, 2, 5, 3), (2, 4, 1, 64), (3, 16, 8)])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_attention_choice_is_the_fallbacks_and_the_cpus(shape, mask, causal, dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(*shape, generator=g).to(dtype)
    m = None
    if mask == "bool":
        m = torch.rand(shape[-2], shape[-2], generator=g) > 0.3
    elif mask == "float":
        m = torch.randn(shape[-2], shape[-2], generator=g).to(dtype)
    for kv in (q, q[..., :1, :, :] if q.dim() == 4 else q):
        args = (q, kv, kv, m, 0.0, causal)
        cpu = torch._fused_sdp_choice(*args)
        nargs = tuple(t.to("npu") if isinstance(t, torch.Tensor) else t for t in args)
        via_fallback = torch.ops.aten._fused_sdp_choice.default(*nargs)
        for gqa in (False, True):
            assert factories.sdp_choice(*nargs, enable_gqa=gqa) == \
                torch._fused_sdp_choice(*args, enable_gqa=gqa)
        assert factories.sdp_choice(*nargs) == via_fallback == cpu
        assert factories.sdp_choice(*nargs, scale=0.5) == torch._fused_sdp_choice(*args,
                                                                                  scale=0.5)


def test_attention_on_npu_is_the_cpus_bitwise():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    F = torch.nn.functional
    for kw in ({}, {"is_causal": True},
               {"attn_mask": torch.rand(16, 16, generator=g) > 0.2}):
        nk = {a: (t.npu() if isinstance(t, torch.Tensor) else t) for a, t in kw.items()}
        _same(F.scaled_dot_product_attention(q.npu(), k.npu(), v.npu(), **nk),
              F.scaled_dot_product_attention(q, k, v, **kw))
