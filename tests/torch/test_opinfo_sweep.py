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
def test_a_storage_freed_inside_the_device_lock_does_not_hang():
    """The garbage collector may free an npu storage on a thread that is inside an allocation:
    the sweep hung there (cdist's gradient) on storage.py's lock. The free takes no lock of
    storage.py (the storage's _live entry goes in _Owner.__del__, no weakref callback) and the
    device's pool lock only when it is free (runtime.free_from_gc defers the free otherwise):
    nothing hangs, and the memory is back at the next allocation."""
    from runtime.context import contexts_by_device
    torch.npu.set_device(0)
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    done = threading.Event()

    def inside_the_lock():
        torch.npu.set_device(0)
        t = torch.ones(100, device="npu")
        with contexts_by_device[0].lock:
            del t                         # its storage dies here, as under a gc callback
        done.set()
    threading.Thread(target=inside_the_lock, daemon=True).start()
    assert done.wait(10), "an npu storage's free hung inside the device lock"
    torch.empty(1, device="npu")          # the next allocation frees what was deferred
    assert torch.npu.memory_allocated() == base


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


def test_results_keep_the_cpu_kernels_dense_layout():
    """An npu result has the strides the CPU kernel gave it when they are dense (a permuted
    layout), as torch's empty_like keeps them: elementwise operators on permuted inputs, and
    the query gradient of CPU's fused attention (which the sweep found contiguous on npu)."""
    torch.npu.set_device(0)
    x = torch.randn(2, 3, 4)
    c = x.permute(2, 0, 1) + 1
    n = x.to("npu").permute(2, 0, 1) + 1
    assert c.stride() == n.stride() == (1, 12, 4)
    assert torch.equal(n.cpu(), c)
    q, k, v = (torch.randn(2, 4, 3, 8, requires_grad=True) for _ in range(3))
    qn, kn, vn = (t.detach().to("npu").requires_grad_() for t in (q, k, v))
    F = torch.nn.functional
    gc = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), [q, k, v])
    gn = torch.autograd.grad(F.scaled_dot_product_attention(qn, kn, vn).sum(), [qn, kn, vn])
    for a, b in zip(gc, gn):
        assert a.stride() == b.stride()
        assert torch.equal(b.cpu().view(torch.int32), a.view(torch.int32))


def test_a_written_argument_that_grows_is_laid_out_as_on_cpu():
    """An out= or in-place argument that the CPU kernel grows is grown from a copy with its
    sizes, strides and values: an in-place addbmm_ on a broadcast self grows it on CPU (it
    raised "not resizable" on npu), and an out= given as a 0-d tensor gets the CPU's contiguous
    layout, not LAPACK's column-major one (cholesky_inverse, geqrf)."""
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    b1, b2 = torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, 6, generator=g)
    for self_shape in ((6,), (1, 6), ()):
        s = torch.randn(self_shape, generator=g)
        c = s.clone().addbmm_(b1, b2)
        n = s.to("npu").addbmm_(b1.to("npu"), b2.to("npu"))
        assert n.shape == c.shape == (4, 6) and n.stride() == c.stride()
        assert torch.equal(n.cpu().view(torch.int32), c.view(torch.int32))
    a = torch.randn(4, 4, generator=g)
    a = a @ a.T + 4 * torch.eye(4)
    for fn in (torch.cholesky_inverse, lambda t, out: torch.geqrf(
            t, out=(out, torch.empty(0, device=t.device)))):
        co, no = torch.zeros(()), torch.zeros((), device="npu")
        fn(a, out=co)
        fn(a.to("npu"), out=no)
        assert no.shape == co.shape and no.stride() == co.stride(), (no.stride(), co.stride())
        assert torch.equal(no.cpu().view(torch.int32), co.view(torch.int32))


def test_sdpa_with_a_mask_that_requires_grad_takes_the_math_path_as_on_cpu():
    """CPU's sdpa takes the math path when the additive mask requires grad (its fused kernel has
    no gradient for the mask); npu took the fused kernel and raised "not differentiable with
    respect to argument 'attn_mask'"."""
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 3, 8, generator=g) for _ in range(3))
    m = torch.randn(3, 3, generator=g)
    F = torch.nn.functional
    cpu = [t.clone().requires_grad_() for t in (q, k, v, m)]
    npu = [t.to("npu").requires_grad_() for t in (q, k, v, m)]
    gc = torch.autograd.grad(F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3]).sum(),
                             cpu)
    gn = torch.autograd.grad(F.scaled_dot_product_attention(*npu[:3], attn_mask=npu[3]).sum(),
                             npu)
    for a, b in zip(gc, gn):
        assert torch.equal(b.cpu().view(torch.int32), a.view(torch.int32))


def test_mode_out_and_channels_last_3d_results():
    """``torch.mode(..., out=)`` (a composite that accepted CPU and CUDA tensors only: "mode only
    supports CPU, CUDA and XPU device type, got: npu") and a channels-last-3d result (nearest
    3-d interpolation of a channels-last-3d input came out contiguous on npu)."""
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (4, 5), generator=g).float()
    vc, ic = torch.empty(0), torch.empty(0, dtype=torch.long)
    vn, in_ = torch.empty(0, device="npu"), torch.empty(0, dtype=torch.long, device="npu")
    torch.mode(x, 1, out=(vc, ic))
    torch.mode(x.to("npu"), 1, out=(vn, in_))
    assert torch.equal(vn.cpu(), vc) and torch.equal(in_.cpu(), ic)
    v = torch.randn(1, 2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last_3d)
    F = torch.nn.functional
    c = F.interpolate(v, scale_factor=2, mode="nearest")
    n = F.interpolate(v.to("npu"), scale_factor=2, mode="nearest")
    assert n.stride() == c.stride() and c.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(n.cpu(), c)
    e = torch.empty(1, 2, 3, 4, 5, device="npu", memory_format=torch.channels_last_3d)
    assert e.stride() == torch.empty_like(v).stride() == (120, 1, 40, 10, 2)


def test_operators_see_the_conjugate_and_negative_bits():
    """``a.conj() @ b`` on npu computed ``a @ b``: the conjugate fallback lets mm through with the
    bit, and the CPU view of the npu tensor dropped it (linalg.eig's gradient then raised)."""
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64, generator=g)
    b = torch.randn(3, 3, dtype=torch.complex64, generator=g)
    an, bn = a.to("npu"), b.to("npu")
    for c, n in ((a.conj() @ b, an.conj() @ bn), (a.mH @ b, an.mH @ bn),
                 (a.conj() + b, an.conj() + bn),
                 (torch._neg_view(a.real) @ b.real, torch._neg_view(an.real) @ bn.real)):
        assert torch.equal(n.cpu(), c)
    x = torch.randn(4, 4, generator=g, requires_grad=True)
    xn = x.detach().to("npu").requires_grad_()
    gc, = torch.autograd.grad(torch.linalg.eig(x)[0].abs().sum(), [x])
    gn, = torch.autograd.grad(torch.linalg.eig(xn)[0].abs().sum(), [xn])
    assert torch.equal(gn.cpu().view(torch.int32), gc.view(torch.int32))


def test_a_result_laid_out_with_gaps_is_followed():
    """linalg.lstsq's solution is a (3, 3) view with strides (1, 4) of LAPACK's work array: the
    npu tensor that follows it needs more storage than 9 elements ("setStorage: ... out of
    bounds" before)."""
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    c = torch.linalg.lstsq(a, b, driver="gels").solution
    n = torch.linalg.lstsq(a.to("npu"), b.to("npu"), driver="gels").solution
    assert c.stride() == n.stride() == (1, 4)
    assert torch.equal(n.cpu().view(torch.int32), c.view(torch.int32))


def test_smooth_l1_loss_warns_as_on_cpu():
    """``F.smooth_l1_loss`` on npu warned "An output with one or more elements was resized"
    (its composite writes the elementwise loss into a 0-d out= first); CPU does not."""
    import warnings
    torch.npu.set_device(0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = torch.nn.functional.smooth_l1_loss(a, b)
        n = torch.nn.functional.smooth_l1_loss(a.to("npu"), b.to("npu"))
    assert not [w for w in caught if "was resized" in str(w.message)]
    assert torch.equal(n.cpu().view(torch.int32), c.view(torch.int32))


def test_in_place_composites_reject_what_cpu_rejects():
    """addr_ on a 0-d self and logical_and_ / ldexp_ on a zero-element self of another broadcast
    shape raise on CPU; on npu they computed (the in-place composite reached npu's out= kernel,
    where torch's "out is self" check no longer held)."""
    torch.npu.set_device(0)
    s, v1, v2 = torch.tensor(2.0), torch.randn(3), torch.randn(4)
    x, y = torch.zeros(0, 1, 3), torch.zeros(0, 10, 3)
    for d in ("cpu", "npu"):
        with pytest.raises(RuntimeError, match="2D tensor expected"):
            s.to(d).addr_(v1.to(d), v2.to(d))
        for fn in (torch.Tensor.logical_and_, torch.Tensor.logical_or_, torch.Tensor.ldexp_):
            with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
                fn(x.to(d), y.to(d))
    m = torch.randn(3, 4)
    assert torch.equal(m.to("npu").addr_(v1.to("npu"), v2.to("npu")).cpu(), m.clone().addr_(v1, v2))


# ---------------------------------------------------------------------- the sweep itself
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest: "
                                         "pip install expecttest")
from benchmarks import opinfo_sweep as sweep  # noqa: E402

# The operators a training step spends its calls on (forward, loss, backward, optimizer, data
# handling), by their OpInfo names: float32 with every variant in CI.
TRAINING_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "neg", "pow", "sqrt", "rsqrt", "exp", "log",
    "tanh", "sigmoid", "clamp", "where", "masked_fill", "addcmul",
    "mm", "bmm", "matmul", "addmm", "baddbmm", "nn.functional.linear",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.mish",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.dropout",
    "nn.functional.embedding", "nn.functional.scaled_dot_product_attention",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.conv2d",
    "nn.functional.adaptive_avg_pool2d", "sum", "mean", "var", "amax", "argmax", "cumsum",
    "norm", "topk", "cat", "stack", "split", "view", "reshape", "transpose", "permute",
    "unsqueeze", "clone", "index_select", "gather", "scatter_add", "index_put", "__getitem__",
    "zeros_like", "arange", "to", "expand", "squeeze", "flatten", "lerp", "addcdiv", "einsum",
    "tril", "full_like", "chunk",
    "nn.functional.leaky_relu", "nn.functional.softplus",
]


def _unexplained(result) -> str:
    return "\n".join(f"{r['op']} {r['dtype']} {r['variant']} sample {r['sample']}: "
                     f"{r['status']}: {r['detail']}" for r in result["listed"]
                     if r["reason"] == "UNEXPLAINED")


@pytest.mark.timeout(600)
def test_training_ops_bitwise_in_every_variant():
    """The most used training operators, float32, every variant (forward, gradient, in place,
    five out= forms): each sample equal to CPU bitwise, or listed with a known reason."""
    result = sweep.run(TRAINING_OPS, ("float32",), sweep.VARIANTS)
    s = result["summary"]
    assert s["unexplained"] == 0, _unexplained(result)
    assert s["ops"] == len(TRAINING_OPS)          # every operator yielded samples
    ran = {r["variant"] for r in result["listed"]}
    assert s["samples"] > 600 and s["equal"] > 0.95 * s["checks"], s
    for op in ("add", "matmul", "nn.functional.cross_entropy", "nn.functional.layer_norm"):
        c = result["ops"][op]
        assert c["equal"] >= 2 * c["samples"], (op, c)     # forward and gradient at least
    assert not ran - set(sweep.VARIANTS)


def test_a_crashing_op_is_listed_and_the_sweep_goes_on(monkeypatch, tmp_path):
    """Per-op isolation: a child that dies on an operator is replaced; the operator is listed
    with the signal, the next ones are checked."""
    monkeypatch.setenv("NPUSIM_OPINFO_CRASH", "neg")
    result = sweep.run_isolated(["abs", "neg", "sqrt"], ("float32",), ("fwd",), cap=20)
    assert set(result["ops"]) == {"abs", "neg", "sqrt"}
    died = [r for r in result["listed"] if r["op"] == "neg"]
    assert len(died) == 1 and "SIGSEGV" in died[0]["detail"], result["listed"]
    assert result["ops"]["sqrt"]["equal"] == result["ops"]["sqrt"]["samples"] > 0


# ---------------------------------------------------------------------- the page is current
def _stored():
    with open(os.path.join(ROOT, "docs", "opinfo.json")) as f:
        result = json.load(f)
    with open(os.path.join(ROOT, "docs", "opinfo.md")) as f:
        text = f.read()
    return result, text


def test_page_is_the_json_and_the_known_reasons_are_current():
    """docs/opinfo.md is generated from docs/opinfo.json (the whole sweep, on the committed
    tree); every listed check there has the reason KNOWN gives it today; no KNOWN entry is
    stale (explains nothing an op of the sweep listed); nothing unexplained."""
    result, text = _stored()
    s = result["summary"]
    assert s["full"] and s["ops"] >= 500, s
    assert text == sweep.page(result, sweep.COMMAND)
    row = (f"| {s['ops']} | {s['samples']} | {s['checks']} | {s['equal']} | {s['listed']} | "
           f"{s['mismatch']} | {s['error']} | {s['unexplained']} | {s['skipped']} |")
    assert row in text
    assert s["listed"] == len(result["listed"]) == s["mismatch"] + s["error"]
    # (a sample_inputs that raises is a skip that is not a check)
    assert s["equal"] + s["listed"] <= s["checks"] <= s["equal"] + s["listed"] + s["skipped"]
    for r in result["listed"]:
        _, why = sweep.reason_for(r["op"], r["variant"], r["detail"])
        assert (why or "UNEXPLAINED") == r["reason"], r
    assert s["unexplained"] == 0
    used = {r["reason"] for r in result["listed"]}
    stale = [e for e in sweep.KNOWN if e[3] not in used]
    assert not stale, f"KNOWN entries that explain nothing in docs/opinfo.json: {stale}"


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_whole_sweep_has_nothing_unexplained():
    """The whole sweep (every OpInfo, float32 / bfloat16 / int64 / bool, every variant), each
    operator in a child process: nothing unexplained (docs/opinfo.md has its figures)."""
    result = sweep.run_isolated(None, sweep.DTYPES, sweep.VARIANTS)
    assert result["summary"]["ops"] >= 500
    assert result["summary"]["unexplained"] == 0, _unexplained(result)
