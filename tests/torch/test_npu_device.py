"""The torch ``npu`` device backed by npusim (runtime/torch, torch_npu): names, bitwise results,
memory, async semantics, errors, transfer_to_npu."""
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime.errors import MemoryAccessError, OutOfMemoryError, StreamRaceError, TaskError  # noqa: E402


def _same(a, b):
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(-1).view(torch.uint8) if a.is_floating_point() else a,
                       b.view(-1).view(torch.uint8) if b.is_floating_point() else b)


def _slow(s, seconds=0.3):
    """Queue a kernel that holds ``s`` busy, so npu operators behind it become tasks."""
    go = threading.Event()
    runtime.launch(lambda: go.wait(seconds), stream=s.npu_stream)
    return go


@pytest.fixture(autouse=True, scope="module")
def _warm_meta():
    """torch's first meta kernel imports sympy (seconds on a loaded machine): do it once here,
    not while a test holds a stream busy."""
    torch.npu.set_device(0)
    s = torch.npu.current_stream()
    go = _slow(s, 60)
    torch.arange(8.0, device="npu").mul(2)
    go.set()
    s.synchronize()


# ---------------------------------------------------------------------- torch.npu names
def test_device_names():
    assert torch.npu.is_available()
    assert torch.npu.device_count() == runtime.device_count()
    torch.npu.set_device(0)
    assert torch.npu.current_device() == 0
    assert torch.npu.get_device_name(0) == "Ascend910B1"     # the simulated SoC, as a card names it
    with torch.npu.device(2):
        assert torch.npu.current_device() == 2
    assert torch.npu.current_device() == 0
    x = torch.ones(3, device="npu:2")
    assert x.device == torch.device("npu", 2) and x.sum().item() == 3.0
    torch.npu.synchronize()
    torch.npu.synchronize(2)


def test_streams_and_events():
    torch.npu.set_device(0)
    d = torch.npu.default_stream()
    assert torch.npu.current_stream() == d
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        go = _slow(s, 30)
        x = torch.arange(8.0, device="npu") * 2
        assert not s.query()
        ev = torch.npu.Event()
        ev.record()
        assert not ev.query()
        go.set()
    d.wait_stream(s)
    ev.wait(d)
    ev.synchronize()
    assert ev.query() and s.query()
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    s.synchronize()
    t0, t1 = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    t0.record()
    torch.randn(64, 64, device="npu") @ torch.randn(64, 64, device="npu")
    t1.record()
    t1.synchronize()
    assert t0.elapsed_time(t1) >= 0.0


def test_memory_stats_move_and_return():
    torch.npu.set_device(0)
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    x = torch.randn(1000, 100, device="npu")
    y = x * 2
    assert torch.npu.memory_allocated() >= base + 2 * 400_000
    assert torch.npu.max_memory_allocated() >= base + 2 * 400_000
    assert torch.npu.memory_reserved() >= torch.npu.memory_allocated()
    assert torch.npu.max_memory_reserved() >= torch.npu.memory_reserved()
    assert torch.npu.memory_stats()["allocated_bytes.all.current"] == torch.npu.memory_allocated()
    assert "memory summary" in torch.npu.memory_summary()
    free, total = torch.npu.mem_get_info()
    assert 0 < free <= total
    del x, y
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base
    torch.npu.empty_cache()
    # nn.Parameter carries the storage: a module's parameters stay in device memory
    m = torch.nn.Linear(100, 100).npu()
    assert torch.npu.memory_allocated() >= base + 40_000
    assert isinstance(m.weight, torch.nn.Parameter) and m.weight.device.type == "npu"
    del m
    assert torch.npu.memory_allocated() == base


def test_seeds():
    torch.npu.manual_seed(7)
    a = torch.randn(5, device="npu")
    torch.npu.manual_seed_all(7)
    b = torch.randn(5, device="npu")
    _same(a, b)
    torch.manual_seed(3)
    c = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.5)
    torch.manual_seed(3)
    _same(c, torch.nn.functional.dropout(torch.ones(100), 0.5))


def test_autocast_and_grad_scaler():
    x = torch.randn(8, 8, device="npu")
    with torch.autocast("npu", dtype=torch.float16):
        assert (x @ x).dtype == torch.float16
        assert (x + x).dtype == torch.float32
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        assert torch.nn.functional.linear(x, x).dtype == torch.bfloat16
    m = torch.nn.Linear(8, 2).npu()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.npu.amp.GradScaler()
    w0 = m.weight.detach().cpu().clone()
    with torch.autocast("npu"):
        loss = m(x).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() in (2.0 ** 16, 2.0 ** 15)   # 2**15 when fp16 grads overflowed
    assert m.weight.grad.device.type == "npu"


# ---------------------------------------------------------------------- bitwise equal to CPU
def test_operators_bitwise():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(17, 33, generator=g), torch.randn(33, 9, generator=g)
    i = torch.randint(0, 17, (40,), generator=g)
    cases = [
        lambda a, b, i: a + 1.5 * a.sin(),
        lambda a, b, i: a @ b,
        lambda a, b, i: a.sum(1),
        lambda a, b, i: a.softmax(-1),
        lambda a, b, i: a.t().contiguous().exp(),
        lambda a, b, i: a[i],
        lambda a, b, i: torch.cat([a, a * 2], 0),
        lambda a, b, i: a.max(0).values,
        lambda a, b, i: torch.nn.functional.layer_norm(a, (33,)),
        lambda a, b, i: (a > 0).float().mean(),
        lambda a, b, i: a.to(torch.bfloat16) * 3,
        lambda a, b, i: torch.where(a > 0, a, b.sum()),
        lambda a, b, i: a.cumsum(0)[::2, 1:5],
    ]
    for k, f in enumerate(cases):
        try:
            _same(f(a.npu(), b.npu(), i.npu()), f(a, b, i))
        except AssertionError:
            raise AssertionError(f"case {k} differs") from None
    # the same on a busy stream: every operator is then a task
    s = torch.npu.current_stream()
    go = _slow(s, 30)
    outs = [f(a.npu(), b.npu(), i.npu()) for f in cases]
    go.set()
    for f, o in zip(cases, outs):
        _same(o, f(a, b, i))


class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 4, 3, stride=2)
        self.fc = torch.nn.Linear(4 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.nn.functional.max_pool2d(torch.relu(self.c2(x)), 1)
        return self.fc(x.flatten(1))


class _Block(torch.nn.Module):
    """A pre-norm transformer block. Attention is written out: torch's scaled_dot_product_attention
    picks its fused CPU kernel for CPU tensors and the math path for a new backend (docs/torch.md,
    limits), which rounds differently."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


def _train_both(cpu, npu, opt, shape, seed: int, steps: int = 3):
    """``steps`` optimizer steps of the same model on CPU and on npu, from the same inputs; every
    loss and every gradient bitwise equal. Returns the input generator, to draw on from."""
    oc, on = opt(cpu.parameters()), opt(npu.parameters())
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(*shape, generator=g)
        lc, ln = cpu(x).square().mean(), npu(x.npu()).square().mean()
        _same(ln, lc)
        oc.zero_grad()
        on.zero_grad()
        lc.backward()
        ln.backward()
        for pc, pn in zip(cpu.parameters(), npu.parameters()):
            _same(pn.grad, pc.grad)
        oc.step()
        on.step()
    return g


@pytest.mark.parametrize("make, shape, opt", [
    (_CNN, (4, 3, 16, 16), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (_Block, (2, 10, 32), lambda p: torch.optim.AdamW(p, lr=1e-3)),
])
def test_model_steps_bitwise(make, shape, opt):
    torch.manual_seed(0)
    cpu = make()
    npu = make()
    npu.load_state_dict(cpu.state_dict())
    npu = npu.npu()
    _train_both(cpu, npu, opt, shape, seed=1)
    for (kc, vc), (kn, vn) in zip(cpu.state_dict().items(), npu.state_dict().items()):
        assert kc == kn
        _same(vn, vc)


# ---------------------------------------------------------------------- async semantics
def test_operators_queue_behind_stream_work():
    s = torch.npu.current_stream()
    x = torch.arange(4.0, device="npu")
    go = _slow(s, 30)
    y = (x + 1) * 2
    assert not s.query()          # queued behind the kernel, not run
    threading.Timer(0.2, go.set).start()
    assert y.tolist() == [2.0, 4.0, 6.0, 8.0]      # waits for the stream
    assert s.query()


def test_stream_check_names_cross_stream_use():
    runtime.enable_stream_check()
    try:
        x = torch.ones(1000, device="npu")          # written on the default stream
        y = x * 3                                   # line A
        s = torch.npu.Stream()
        with torch.npu.stream(s):
            with pytest.raises(StreamRaceError) as e:
                y.add(1)                            # line B: reads y with nothing ordering it
        msg = str(e.value)
        assert "'aten::mul" in msg and "'aten::add" in msg
        assert msg.count("test_npu_device.py") >= 2
        s.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(s):
            z = y.add(1)                            # ordered now: no report
        s.synchronize()
        assert z[0].item() == 4.0
    finally:
        torch.npu.synchronize()
        runtime.enable_stream_check("off")


def test_failing_kernel_is_task_error_with_operator_and_line():
    s = torch.npu.current_stream()
    x = torch.arange(4.0, device="npu")
    idx = torch.tensor([9], device="npu")
    go = _slow(s, 30)
    y = x[idx]                                      # the failing line: out of range, found later
    go.set()
    with pytest.raises(TaskError) as e:
        y.cpu()
    msg = str(e.value)
    assert "aten::index.Tensor" in msg and "test_npu_device.py" in msg and "y = x[idx]" not in msg
    assert e.value.site.split(":")[0].endswith("test_npu_device.py")
    assert (x + 1).tolist() == [1.0, 2.0, 3.0, 4.0]   # the stream runs new work again


# ---------------------------------------------------------------------- bad input
def test_bad_input_errors():
    n = torch.npu.device_count()
    with pytest.raises(RuntimeError, match=f"there are {n} npu devices"):
        torch.npu.set_device(n)
    with pytest.raises(RuntimeError, match="same device.*npu:0 and cpu"):
        torch.ones(3, device="npu") + torch.ones(3)
    with pytest.raises(OutOfMemoryError, match="capacity"):
        torch.empty(runtime.get_mem_info()[1] // 4 + 1024, device="npu")


def test_use_of_a_reset_device():
    with torch.npu.device(5):
        x = torch.ones(10, device="npu:5")
        y = x * 2                                   # x's CPU view is cached (the fast path)
        runtime.reset_device(5)
    with pytest.raises(MemoryAccessError):
        (x + 1).cpu()
    with torch.npu.device(5):                       # the fast path checks its cached views too
        with pytest.raises(MemoryAccessError):
            x + 1
        with pytest.raises(MemoryAccessError):
            y.mul_(3)


# ---------------------------------------------------------------------- transfer_to_npu
def test_transfer_to_npu_cuda_script(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "cuda_script.py"
    script.write_text(
        "import torch\n"
        "from torch_npu.contrib import transfer_to_npu\n"
        "assert torch.cuda.is_available()\n"
        "torch.cuda.set_device(0)\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()\n"
        "x = torch.randn(4, 8).to('cuda')\n"
        "m(x).sum().backward()\n"
        "assert x.device == torch.device('npu', 0), x.device\n"
        "assert m[0].weight.grad.device.type == 'npu'\n"
        "assert torch.cuda.memory_allocated() > 0\n"
        "torch.cuda.synchronize()\n"
        "print('ok', m[0].weight.grad.sum().item())\n")
    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)
    m(x).sum().backward()
    assert r.stdout.split() == ["ok", str(m[0].weight.grad.sum().item())]


# ---------------------------------------------------------------------- save / load, default device
def test_save_load_and_default_device():
    import io
    m = torch.nn.Linear(3, 2).npu()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)                                  # back onto npu:0
    assert sd["weight"].device == torch.device("npu", 0)
    _same(sd["weight"], m.weight)
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["weight"].device.type == "cpu"
    cpu = io.BytesIO()
    torch.save(torch.nn.Linear(3, 2).state_dict(), cpu)
    cpu.seek(0)
    assert torch.load(cpu, map_location="npu")["bias"].device.type == "npu"
    torch.set_default_device("npu")
    try:
        assert torch.ones(3).device.type == "npu"
    finally:
        torch.set_default_device(None)


def test_a_real_torch_npu_wins(tmp_path):
    """npusim's torch_npu loads another torch_npu found on sys.path in its own place."""
    import os
    import subprocess
    import sys
    fake = tmp_path / "site" / "torch_npu"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import torch_npu, torch; print(getattr(torch_npu, 'REAL', False), hasattr(torch, 'npu'))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, str(tmp_path / "site")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"]
    env["NPUSIM_TORCH_NPU"] = "1"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.stdout.split() == ["False", "True"], r.stderr[-500:]


# ---------------------------------------------------------------------- the fast path (ops._now)
def test_fast_path_results_views_and_written_arguments():
    """On an idle stream an operator runs at once on cached CPU views (runtime/torch/ops.py):
    results, out= resizes, views at offsets, aliasing and foreach operators stay exact."""
    torch.npu.set_device(0)
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    out = torch.empty(0, device="npu")
    r = torch.add(a.npu(), b.npu(), out=out)            # the CPU kernel resizes out's view
    assert r is out and out.shape == (5, 7) and out.device.type == "npu"
    _same(out, a + b)
    _same(out * 2, (a + b) * 2)                         # the cached view follows the new storage
    x = torch.arange(24.0).view(4, 6)
    xn = x.npu()
    for f in (lambda t: t[1:, 2:] * 2, lambda t: t.t() + 1, lambda t: t[::2].sum(0),
              lambda t: t.reshape(-1)[5:9].exp(), lambda t: t.t().contiguous().view(-1)):
        _same(f(xn), f(x))
    xn[1:3].add_(10)                                    # in place through a view at an offset
    x[1:3].add_(10)
    _same(xn, x)
    y = torch.randn(6, generator=g)
    yn = y.npu()
    yn.mul_(yn)                                         # one tensor read and written
    y.mul_(y)
    _same(yn, y)
    ts = [torch.randn(3, 4, generator=g).abs() for _ in range(5)]
    tn = [t.npu() for t in ts]
    torch._foreach_add_(ts, ts, alpha=0.5)              # one fallback call for the whole list
    torch._foreach_add_(tn, tn, alpha=0.5)
    for p, q in zip(ts, tn):
        _same(q, p)
    for p, q in zip(torch._foreach_sqrt(ts), torch._foreach_sqrt(tn)):
        _same(q, p)
    del out, r, xn, yn, tn, q
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base


def _line_of(text: str) -> int:
    """The line number of the one line of this file that contains ``text``."""
    import inspect
    lines = [k + 1 for k, s in enumerate(inspect.getsource(inspect.getmodule(_same)).splitlines())
             if text in s and "_line_of" not in s]
    assert len(lines) == 1, lines
    return lines[0]


def test_stream_check_sees_tensors_made_on_the_fast_path():
    """Tensors made and written on the fast path (sanitizer off), then used with the sanitizer on:
    the race is named with both operators and both lines, and the buffer's allocation site."""
    torch.npu.set_device(0)
    torch.npu.synchronize()
    x = torch.ones(1000, device="npu")
    y = x * 3                                           # fast path: a cached CPU view of y
    runtime.enable_stream_check()
    try:
        z = y * 2                                       # race site A
        s = torch.npu.Stream()
        with torch.npu.stream(s):
            with pytest.raises(StreamRaceError) as e:
                z.add(1)                                # race site B
        msg = str(e.value)
        first = next(s for s in msg.splitlines() if s.strip().startswith("first:"))
        second = next(s for s in msg.splitlines() if s.strip().startswith("second:"))
        assert "'aten::mul.out'" in first and "'aten::add.out'" in second
        assert f"test_npu_device.py:{_line_of('# race site A')} " in first
        assert f"test_npu_device.py:{_line_of('# race site B')} " in second
        # z was allocated while the sanitizer was on: its allocation site is the user's line
        assert f"allocated at {__file__}:{_line_of('# race site A')} " in msg
    finally:
        torch.npu.synchronize()
        runtime.enable_stream_check("off")
    assert (y + 1)[0].item() == 4.0                     # fast path again


def test_profiler_shows_npu_operators(tmp_path):
    import json
    torch.npu.set_device(0)
    x = torch.ones(100, device="npu")
    y = x * 3                                           # before the profile: not in the trace
    path = tmp_path / "trace.json"
    with runtime.profile(str(path)):
        z = torch.relu(y * 2 + 1)                       # profiled line
    tr = json.loads(path.read_text())
    ev = [e for e in (tr["traceEvents"] if isinstance(tr, dict) else tr) if e.get("ph") == "X"]
    names = [e["name"] for e in ev]
    assert names.count("aten::mul.out") == 1 and names.count("aten::add.out") == 1
    assert names.count("aten::relu") == 1
    line = _line_of("# profiled line")
    assert all(e["args"]["site"].startswith(f"{__file__}:{line} ") for e in ev
               if e["name"].startswith("aten::")), [e["args"] for e in ev]
    assert z.tolist() == [7.0] * 100


def test_transformer_training_bitwise():
    """nn.TransformerEncoder (its attention through scaled_dot_product_attention: the CPU's
    fused kernel on npu too, runtime/torch/attention.py) trains bitwise as on CPU with AdamW."""
    import copy
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    cpu = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    npu = copy.deepcopy(cpu).npu()
    g = _train_both(cpu, npu, lambda p: torch.optim.AdamW(p, lr=1e-3), (2, 10, 32), seed=2)
    for pc, pn in zip(cpu.parameters(), npu.parameters()):
        _same(pn, pc)
    q = torch.randn(2, 4, 8, 16, generator=g)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()   # a mask: torch's decomposition, as before
    out = torch.nn.functional.scaled_dot_product_attention(q.npu(), q.npu(), q.npu(), attn_mask=mask.npu())
    torch.testing.assert_close(out.cpu(), torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask))


_EXIT_SCRIPT = r"""
import threading
import torch, torch_npu
import runtime
x = torch.ones(1 << 20, device="npu")
go = threading.Event()
runtime.launch(lambda: go.wait(0.05))      # the stream is busy: the operators below are tasks
for _ in range(50):
    x = x * 1.0001 + 0.5
print("queued", flush=True)                # and the script ends with them still queued
"""


@pytest.mark.timeout(60)
def test_a_script_may_end_with_npu_operators_still_queued():
    """The stream's worker runs them in torch's C++, which it must not be in at the
    interpreter's finalization (runtime/torch/exitgate.py): this aborted every time."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True,
                         timeout=50, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["queued"] and "terminate" not in res.stderr
