"""Conformance sweep of the npu device against CPU, driven by torch's own operator database.

    PYTHONPATH=. python -m benchmarks.opinfo_sweep [--ops a,b] [--fast] [--dtypes float32,int64]
        [--cap 20] [--page docs/opinfo.md] [--json docs/opinfo.json]

torch ships ``torch.testing._internal.common_methods_invocations.op_db``: an OpInfo per operator
with sample inputs (it needs ``expecttest``). For every OpInfo, every dtype of the sweep the op
supports on CPU, and every sample input, each *variant* below runs twice, on CPU and on npu, on
inputs with the same bytes and the same sizes, strides and offsets (``mirror``), and the two are
compared bitwise: values including NaN positions and signed zeros (the bits of a float), dtype,
shape, device (an npu result stays on the npu), the significant strides of every tensor result
(torch's ``check_significant_strides``: an npu operator runs torch's CPU kernel, so it must lay
out its result as the CPU does), and the sample's tensors after the call (what an operator
wrote). Both sides raising the same exception type counts as equal (torch's error for a bad
sample); one side raising is not.

Variants (as torch's test_ops.py ``test_compare_cpu``, ``test_out``, ``test_out_warning``,
in-place and gradient tests do for a device):

- ``fwd``: the operator on the sample;
- ``grad``: ``torch.autograd.grad`` of the sum of the (``output_process_fn_grad``-processed)
  floating outputs with respect to every sample tensor that requires grad, where the OpInfo
  supports autograd and the dtype is floating;
- ``inplace``: ``op.inplace_variant`` on the sample (the result must be the input itself);
- ``out``: ``out=`` tensors of the right shape filled with NaN (integers: their max): same data
  pointer and strides after, the result is the ``out`` object;
- ``out_noncontig``: right shape, non-contiguous: strides kept;
- ``out_empty``: ``torch.empty(0)``: resized, without the resize warning;
- ``out_wrong``: one element too many in the last dimension: resized, with torch's warning
  ("An output with one or more elements was resized"), on both sides or on neither;
- ``out_0d``: a 0-d tensor.

Random operators draw from the generator of their device (runtime/torch/random.py): each side
is seeded with ``torch.manual_seed(SEED)`` right before its call, which seeds the CPU's and every
npu's generator alike, so a random operator that consumes its generator as on CPU is compared
bitwise like any other.

Each check is classified *equal*, *mismatch* (different results, or only one side raised),
*error* (the npu raised where CPU did not, or the check could not run) or *skipped* (with a
reason: a sparse sample, a variant the op lacks is simply not counted). Every mismatch and error
is *listed* on the page with its reason from ``KNOWN`` (below): a known, explained difference, or
one "being fixed" elsewhere. A listed check without a reason is ``UNEXPLAINED``: a bug of the
device to fix (tests/torch/test_opinfo_sweep.py asserts there are none on its subset).

Per-check isolation: every check runs in a ``try``; a check that raises is recorded and the sweep
goes on; a check that runs longer than ``--cap`` seconds is interrupted (SIGALRM) and recorded as
an error; the npu stream is synchronized after each sample, and a pending error there is recorded
against that sample.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import os
import signal
import sys
import time
import traceback
import warnings

SEED = 1234
VARIANTS = ("fwd", "grad", "inplace", "out", "out_noncontig", "out_empty", "out_wrong", "out_0d")
OUT_VARIANTS = VARIANTS[3:]
# The dtypes of the whole sweep: float32 with every variant; bfloat16 (reduced-precision
# kernels), int64 and bool (integer and logical kernels) without gradients.
DTYPES = ("float32", "bfloat16", "int64", "bool")
RESIZE_WARNING = "An output with one or more elements was resized"
COMMAND = ("PYTHONPATH=. python -m benchmarks.opinfo_sweep --page docs/opinfo.md "
           "--json docs/opinfo.json")

# ------------------------------------------------------------------------------ known reasons
# (op glob, variant glob, text in the detail or "", reason). The first entry that matches a
# listed check gives its reason. A reason starting "being fixed" names a device-contract bug
# another change fixes (issue 50); the sweep is rerun after it lands.
KNOWN: list[tuple[str, str, str, str]] = [
    ("empty*", "*", "elements differ",
     "uninitialized memory: torch.empty* leaves the values unspecified (torch's own "
     "test_compare_cpu does not compare them); dtype, shape and strides were equal"),
    ("new_empty*", "*", "elements differ",
     "uninitialized memory: Tensor.new_empty* leaves the values unspecified; dtype, shape and "
     "strides were equal"),
    ("linalg.lstsq*", "*", "elements differ",
     "CPU itself: LAPACK's gelsy driver gives other last bits for the same input at another "
     "memory address (measured on CPU alone: 4 of 36 samples differ between two buffers)"),
    ("nn.functional.linear_cross_entropy.chunked*", "*", "elements differ",
     "torch's own device rule: the chunked linear_cross_entropy accumulates bfloat16/float16 "
     "in float32 on cpu and cuda only (LinearCrossEntropyOptions._resolve_auto_acc_dtype), in "
     "the input dtype on any other device (npu, as with a real torch_npu)"),
    ("tensor_split", "*", "to be on cpu",
     "the sample's tensor of split indices must be a CPU tensor on every device (torch's rule); "
     "the sweep moves every sample tensor to the npu"),
    ("to_sparse", "*", "sparse",
     "sparse layouts: npusim's npu device has dense strided tensors only"),
]


def reason_for(op: str, variant: str, detail: str):
    """The KNOWN entry (its index, its reason) explaining a listed check, or (None, None)."""
    for k, (og, vg, text, why) in enumerate(KNOWN):
        if fnmatch.fnmatchcase(op, og) and fnmatch.fnmatchcase(variant, vg) and text in detail:
            return k, why
    return None, None


# ------------------------------------------------------------------------------ the checks
class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout("the check ran past its time cap")


@contextlib.contextmanager
def _cap(seconds: float):
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Sweep:
    """One sweep: torch, npu and op_db loaded once; ``run_op`` checks one OpInfo."""

    def __init__(self, cap: float = 20.0):
        import torch
        import torch_npu  # noqa: F401
        from torch._prims_common import check_significant_strides
        self.torch = torch
        self.cap = cap
        self._placed = True
        self._strides = check_significant_strides
        torch.npu.set_device(0)
        self._ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    # ---------------------------------------------------------------- mirrors of a sample
    def mirror(self, t, device: str, grad: bool = False):
        """A new tensor on ``device`` with ``t``'s bytes, sizes, strides and storage offset (a
        copy of its whole storage), a leaf requiring grad when ``grad`` and ``t`` does."""
        torch = self.torch
        if t.layout != torch.strided or t.is_quantized:
            raise _Unsupported(f"{t.layout} input")
        grad = grad and t.requires_grad
        t = t.detach()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        st = t.untyped_storage()
        n = st.nbytes()
        if t.numel() == 0 or n == 0:
            out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        else:
            src = torch.empty((0,), dtype=torch.uint8).set_(st, 0, (n,), (1,))
            base = torch.empty(n, dtype=torch.uint8, device=device)
            base.copy_(src)
            out = base.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())
        if grad and (t.is_floating_point() or t.is_complex()):
            out.requires_grad_(True)
        return out

    def side(self, sample, device: str, grad: bool = False):
        """(input, args, kwargs, leaves): ``sample`` mirrored onto ``device``; ``leaves``: its
        tensors requiring grad, in order."""
        torch = self.torch
        leaves = []

        def tt(x):
            if isinstance(x, torch.Tensor):
                m = self.mirror(x, device, grad)
                if m.requires_grad:
                    leaves.append(m)
                return m
            if isinstance(x, list):
                return [tt(y) for y in x]
            if isinstance(x, tuple):
                return tuple(tt(y) for y in x)
            if isinstance(x, dict):
                return {k: tt(v) for k, v in x.items()}
            if device != "cpu" and isinstance(x, torch.device) and x.type == "cpu":
                return torch.device(device)
            if device != "cpu" and isinstance(x, str) and x == "cpu":
                return device
            return x
        return tt(sample.input), tt(sample.args), tt(sample.kwargs), leaves

    # ---------------------------------------------------------------- comparison
    def tensors(self, x):
        torch = self.torch
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, (list, tuple)):
            return [t for y in x for t in self.tensors(y)]
        if isinstance(x, dict):
            return [t for y in x.values() for t in self.tensors(y)]
        return []

    def bits(self, t):
        torch = self.torch
        if t.is_complex():
            t = torch.view_as_real(t.resolve_conj())
        if t.dtype.is_floating_point:
            return t.view(self._ints[t.element_size()])
        return t

    def diff(self, c, n, path: str):
        """Where CPU result ``c`` and npu result ``n`` differ (a sentence), or None."""
        torch = self.torch
        if isinstance(c, torch.Tensor):
            if not isinstance(n, torch.Tensor):
                return f"{path}: npu gave {type(n).__name__}, CPU a tensor"
            if c.device.type == "cpu" and n.device.type != "npu" and self._placed:
                return f"{path}: npu result on {n.device}"
            if c.dtype != n.dtype:
                return f"{path}: dtype {n.dtype} on npu, {c.dtype} on CPU"
            if c.shape != n.shape:
                return f"{path}: shape {tuple(n.shape)} on npu, {tuple(c.shape)} on CPU"
            if c.layout != n.layout:
                return f"{path}: layout {n.layout} on npu, {c.layout} on CPU"
            if c.layout != torch.strided:
                c, n = c.to_dense(), n.to_dense()
            if c.numel() and not self._strides(c, n, only_cuda=False)[0]:
                return f"{path}: strides {n.stride()} on npu, {c.stride()} on CPU"
            nc = n.detach().cpu()
            c = c.detach()
            if c.numel() == 0 or torch.equal(self.bits(c), self.bits(nc)):
                return None
            if c.is_floating_point() or c.is_complex():
                same_nan = torch.equal(c.isnan(), nc.isnan())
                fin = ~(c.isnan() | nc.isnan())
                d = (c[fin].double() - nc[fin].double()).abs() if fin.any() else None
                bad = int((self.bits(c) != self.bits(nc)).sum()) if not c.is_complex() else -1
                if d is not None and d.max() == 0 and same_nan:
                    return f"{path}: same values, other bits (NaN payload or signed zero)"
                mx = float(d.max()) if d is not None and d.numel() else float("nan")
                return (f"{path}: {bad} of {c.numel()} elements differ (max abs diff {mx:.3g}"
                        f"{'' if same_nan else ', NaN positions differ'})")
            bad = int((c != nc).sum())
            return f"{path}: {bad} of {c.numel()} elements differ"
        if isinstance(c, (list, tuple)):
            if not isinstance(n, (list, tuple)) or len(c) != len(n):
                return (f"{path}: npu gave {type(n).__name__} of {_len(n)}, "
                        f"CPU {type(c).__name__} of {len(c)}")
            for k, (a, b) in enumerate(zip(c, n)):
                d = self.diff(a, b, f"{path}[{k}]")
                if d:
                    return d
            return None
        if isinstance(c, float) and isinstance(n, float):
            if math.isnan(c) and math.isnan(n) or \
                    c == n and math.copysign(1, c) == math.copysign(1, n):
                return None
            return f"{path}: {n!r} on npu, {c!r} on CPU"
        if isinstance(c, self.torch.dtype) or c is None or isinstance(c, (bool, int, str, complex)):
            same = type(c) is type(n) and c == n
            return None if same else f"{path}: {n!r} on npu, {c!r} on CPU"
        if isinstance(c, self.torch.Size):
            return None if c == n else f"{path}: {n!r} on npu, {c!r} on CPU"
        return None if type(c) is type(n) else f"{path}: npu gave {type(n).__name__}, " \
                                                f"CPU {type(c).__name__}"

    # ---------------------------------------------------------------- one call on one side
    def call(self, fn, sample, device: str, *, grad=False, out_of=None, post=None, keep=False):
        """Run ``fn`` on ``sample`` mirrored onto ``device``: (result, sample tensors after,
        extra facts, exception or None). ``out_of(device)`` makes the ``out=`` argument;
        ``grad`` takes the gradient instead of returning the result."""
        torch = self.torch
        inp, args, kwargs, leaves = self.side(sample, device, grad)
        facts = {}
        exc = None
        res = None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.manual_seed(SEED)
                if out_of is not None:
                    out = out_of(device)
                    ptrs = [t.data_ptr() for t in self.tensors(out)]
                    strides = [t.stride() for t in self.tensors(out)]
                    res = fn(inp, *args, **kwargs, out=out)
                    facts["returns out"] = res is out or (
                        isinstance(res, tuple) and isinstance(out, tuple)
                        and all(a is b for a, b in zip(res, out)))
                    if keep:            # right-sized: written where it is, strides kept
                        facts["same storage"] = ptrs == [t.data_ptr() for t in self.tensors(out)]
                        facts["same strides"] = strides == [t.stride() for t in self.tensors(out)]
                    res = out
                elif grad:
                    r = fn(inp, *args, **kwargs)
                    r = sample.output_process_fn_grad(r)
                    outs = [t for t in self.tensors(r)
                            if t.requires_grad and (t.is_floating_point() or t.is_complex())]
                    if not leaves or not outs:
                        raise _Unsupported("no differentiable input or output")
                    total = sum(t.sum().abs() if t.is_complex() else t.sum() for t in outs)
                    res = torch.autograd.grad(total, leaves, allow_unused=True)
                else:
                    res = fn(inp, *args, **kwargs)
                    if post == "inplace":
                        facts["returns self"] = res is inp
                if device != "cpu":
                    torch.npu.synchronize()
            facts["resize warning"] = any(RESIZE_WARNING in str(w.message) for w in caught)
        except _Unsupported:
            raise
        except Exception as e:          # noqa: BLE001 - every failure is a finding
            exc = e
            if device != "cpu":
                with contextlib.suppress(Exception):
                    torch.npu.synchronize()
        after = (inp, args, kwargs)
        return res, after, facts, exc

    def compare_calls(self, fn, sample, **kw):
        """(status, detail) of ``fn`` on CPU against npu."""
        # a factory given no tensor and no device makes a CPU tensor on both sides
        self._placed = bool(self.tensors([sample.input, sample.args, sample.kwargs])) or any(
            isinstance(v, (str, self.torch.device)) and str(v).startswith("cpu")
            for v in sample.kwargs.values())
        with _cap(self.cap):
            c, c_after, c_facts, c_exc = self.call(fn, sample, "cpu", **kw)
            if isinstance(c_exc, _Timeout):
                raise c_exc
        with _cap(self.cap):
            n, n_after, n_facts, n_exc = self.call(fn, sample, "npu", **kw)
        if c_exc is not None or n_exc is not None:
            if c_exc is not None and n_exc is not None:
                if type(c_exc) is type(n_exc) or isinstance(n_exc, type(c_exc)):
                    return "equal", f"both raise {type(c_exc).__name__}"
                return "mismatch", f"npu raises {_exc(n_exc)}; CPU raises {_exc(c_exc)}"
            if n_exc is not None:
                if isinstance(n_exc, _Timeout):
                    return "error", f"npu call ran past {self.cap:g} s"
                return "error", f"npu raises {_exc(n_exc)}"
            return "mismatch", f"CPU raises {_exc(c_exc)}; npu does not"
        d = self.diff(c, n, "result")
        if d:
            return "mismatch", d
        for key in sorted(c_facts):
            if c_facts[key] != n_facts.get(key):
                return "mismatch", f"{key}: {n_facts.get(key)} on npu, {c_facts[key]} on CPU"
        d = self.diff(self.tensors(c_after), self.tensors(n_after), "inputs after")
        if d:
            return "mismatch", d
        return "equal", ""

    # ---------------------------------------------------------------- one OpInfo
    def run_op(self, op, dtype_names, variants, record):
        """Check every sample of ``op`` in each dtype; ``record(dtype, variant, index, status,
        detail)`` for each check; returns the number of samples."""
        torch = self.torch
        supported = op.supported_dtypes("cpu")
        nsamples = 0
        for dn in dtype_names:
            dtype = getattr(torch, dn)
            if dtype not in supported:
                continue
            want_grad = (op.supports_autograd and dtype.is_floating_point and "grad" in variants
                         and dtype == torch.float32)
            try:
                with _cap(self.cap * 3):
                    torch.manual_seed(SEED)
                    samples = list(op.sample_inputs("cpu", dtype, requires_grad=want_grad))
            except Exception as e:      # noqa: BLE001
                record(dn, "samples", -1, "skipped", f"sample_inputs raises {_exc(e)}")
                continue
            for k, sample in enumerate(samples):
                nsamples += 1
                for v in variants:
                    try:
                        got = self.check(op, sample, v, dtype, want_grad)
                    except _Unsupported as e:
                        got = ("skipped", str(e))
                    except _Timeout:
                        got = ("skipped", f"CPU ran past the cap ({self.cap:g} s)")
                    except Exception as e:      # noqa: BLE001 - the harness itself failed
                        got = ("error", f"harness: {_exc(e)}")
                    if got is not None:
                        record(dn, v, k, got[0], got[1])
        return nsamples

    def check(self, op, sample, v, dtype, want_grad):
        """(status, detail) of variant ``v`` on one sample, or None when ``op`` has no such
        variant."""
        torch = self.torch
        if v == "fwd":
            return self.compare_calls(op, sample)
        if v == "grad":
            if not want_grad:
                return None
            return self.compare_calls(op, sample, grad=True)
        if v == "inplace":
            if op.inplace_variant is None:
                return None
            if not _tensor_input(torch, sample):
                return None
            return self.compare_calls(op.inplace_variant, sample, post="inplace")
        # out= variants: shaped after the CPU result of the sample
        if not op.supports_out:
            return None
        inp, args, kwargs, _ = self.side(sample, "cpu")
        try:
            with _cap(self.cap):
                torch.manual_seed(SEED)
                expected = op(inp, *args, **kwargs)
        except Exception:               # noqa: BLE001 - fwd reports it
            return None
        if isinstance(expected, torch.Tensor):
            shapes = [expected]
        elif isinstance(expected, tuple) and expected and all(
                isinstance(t, torch.Tensor) for t in expected):
            shapes = list(expected)
        else:
            return None
        made = [self._out_tensor(t, v) for t in shapes]

        def out_of(device):
            ms = [self.mirror(m, device) for m in made]
            return ms[0] if isinstance(expected, torch.Tensor) else tuple(ms)
        return self.compare_calls(op, sample, out_of=out_of,
                                  keep=v in ("out", "out_noncontig"))

    def _out_tensor(self, t, v):
        """The CPU ``out=`` tensor of variant ``v`` for expected result ``t``."""
        torch = self.torch
        from torch.testing import make_tensor
        fill = torch.iinfo(t.dtype).max if not (t.is_floating_point() or t.is_complex()) \
            and t.dtype != torch.bool else (True if t.dtype == torch.bool else float("nan"))
        if v == "out":
            return torch.full_like(t, fill)
        if v == "out_noncontig":
            g = torch.Generator().manual_seed(SEED)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(0, 2**30, (), generator=g)))
                return make_tensor(t.shape, dtype=t.dtype, device="cpu", noncontiguous=True)
        if v == "out_empty":
            return torch.empty((0,), dtype=t.dtype)
        if v == "out_wrong":
            shape = list(t.shape)
            if not shape:
                shape = [2]
            else:
                shape[-1] += 1
            return torch.full(shape, fill, dtype=t.dtype)
        if v == "out_0d":
            return torch.full((), fill, dtype=t.dtype)
        raise ValueError(f"variant={v!r}: not an out= variant")


class _Unsupported(Exception):
    """A sample or variant the sweep cannot mirror onto the npu (recorded as skipped)."""


def _len(x):
    return len(x) if isinstance(x, (list, tuple)) else "-"


def _exc(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first[:160]}"


def _tensor_input(torch, sample) -> bool:
    return isinstance(sample.input, torch.Tensor)


# ------------------------------------------------------------------------------ the sweep
def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def load_ops(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    if not names:
        return list(op_db)
    want = set(names)
    keys = {op_key(op) for op in op_db}
    # an exact OpInfo name, or every variant of an operator named without one
    found = [op for op in op_db if op_key(op) in want or
             op.name in want and op.name not in keys]
    missing = want - {op_key(op) for op in found} - {op.name for op in found}
    if missing:
        raise SystemExit(f"--ops: no OpInfo named {', '.join(sorted(missing))} in torch's op_db")
    return found


def check_op(sweep: Sweep, op, dtypes, variants) -> dict:
    """One OpInfo's record: {"op", "counts", "listed", "skipped"} (reasons not yet given)."""
    key = op_key(op)
    counts = {"samples": 0, "checks": 0, "equal": 0, "mismatch": 0, "error": 0, "skipped": 0}
    listed, skipped = [], {}
    t = time.monotonic()

    def record(dn, v, k, status, detail):
        if v != "samples":
            counts["checks"] += 1
        counts[status] += 1
        if status in ("mismatch", "error"):
            listed.append({"op": key, "dtype": dn, "variant": v, "sample": k,
                           "status": status, "detail": detail})
        elif status == "skipped":
            skipped[detail] = skipped.get(detail, 0) + 1
    try:
        counts["samples"] = sweep.run_op(op, dtypes, variants, record)
    except Exception as e:              # noqa: BLE001 - never stop the sweep
        record("-", "op", -1, "error", f"harness: {_exc(e)}")
    counts["seconds"] = round(time.monotonic() - t, 2)
    return {"op": key, "counts": counts, "listed": listed, "skipped": skipped}


def summarize(records, dtypes, variants, full: bool, seconds: float) -> dict:
    """The sweep's JSON-able result from its per-op records: ``summary``, ``ops`` (counts),
    ``listed`` (each with its reason from KNOWN, or UNEXPLAINED), ``skipped`` (reason ->
    checks), ``stale`` (KNOWN entries for ops that ran that explained nothing)."""
    import torch
    per_op, listed, skipped, used = {}, [], {}, set()
    for rec in records:
        per_op[rec["op"]] = rec["counts"]
        for r in rec["listed"]:
            idx, why = reason_for(r["op"], r["variant"], r["detail"])
            if idx is not None:
                used.add(idx)
            listed.append(dict(r, reason=why or "UNEXPLAINED"))
        for why, n in rec["skipped"].items():
            skipped[why] = skipped.get(why, 0) + n
    tot = {k: sum(c[k] for c in per_op.values()) for k in
           ("samples", "checks", "equal", "mismatch", "error", "skipped")}
    ran = set(per_op)
    stale = [list(e) for k, e in enumerate(KNOWN) if k not in used and
             any(fnmatch.fnmatchcase(o, e[0]) for o in ran)]
    summary = dict(ops=sum(1 for c in per_op.values() if c["samples"]), samples=tot["samples"],
                   checks=tot["checks"], equal=tot["equal"], listed=len(listed),
                   mismatch=tot["mismatch"], error=tot["error"], skipped=tot["skipped"],
                   unexplained=sum(1 for r in listed if r["reason"] == "UNEXPLAINED"),
                   seconds=round(seconds, 1), dtypes=list(dtypes), variants=list(variants),
                   torch=torch.__version__, full=full)
    return {"summary": summary, "ops": per_op, "listed": listed, "skipped": skipped,
            "stale": stale}


def _setup():
    import torch
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)


def run(ops=None, dtypes=DTYPES, variants=VARIANTS, cap: float = 20.0, progress=None) -> dict:
    """The sweep in this process (what the tests run); returns ``summarize``'s result."""
    _setup()
    sweep = Sweep(cap)
    t0 = time.monotonic()
    opinfos = load_ops(ops)
    records = []
    for j, op in enumerate(opinfos):
        records.append(check_op(sweep, op, dtypes, variants))
        if progress:
            progress(j + 1, len(opinfos), records[-1])
    return summarize(records, dtypes, variants, ops is None, time.monotonic() - t0)


def run_isolated(ops=None, dtypes=DTYPES, variants=VARIANTS, cap: float = 20.0, progress=None,
                 op_cap: float = 900.0) -> dict:
    """The sweep in child processes: a child runs the ops from an index on and writes a record
    per op (a JSON line); one that dies (a crash of the device or of torch) or stalls past
    ``op_cap`` seconds on one op is replaced by a new child from the next op, and the op it
    died on is listed as an error naming the signal."""
    import subprocess
    import tempfile
    names = [op_key(o) for o in load_ops(ops)]
    t0 = time.monotonic()
    records = []
    start = 0
    with tempfile.TemporaryDirectory(prefix="opinfo-sweep-") as tmp:
        while start < len(names):
            path = os.path.join(tmp, f"records-{start}.jsonl")
            cmd = [sys.executable, "-m", "benchmarks.opinfo_sweep", "--worker", str(start),
                   "--records", path, "--cap", str(cap), "--dtypes", ",".join(dtypes),
                   "--variants", ",".join(variants)]
            if ops:
                cmd += ["--ops", ",".join(names)]
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=os.path.dirname(os.path.dirname(
                                         os.path.abspath(__file__))))
            done, last = 0, time.monotonic()
            rc = None
            while rc is None:
                try:
                    rc = child.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
                got = _read_records(path)
                for rec in got[done:]:
                    records.append(rec)
                    if progress:
                        progress(start + done + 1, len(names), rec)
                    done += 1
                    last = time.monotonic()
                if rc is None and time.monotonic() - last > op_cap:
                    child.kill()
                    rc = child.wait(timeout=60)
                    rc = "stall"
            start += done
            if start >= len(names):
                break
            if rc == 0:
                raise RuntimeError(f"sweep child exited at op {start} of {len(names)} "
                                   f"({names[start]}) without a record")
            why = (f"ran past {op_cap:g} s (killed)" if rc == "stall" else
                   f"the process died ({_signal_name(rc)})")
            rec = {"op": names[start], "listed": [{"op": names[start], "dtype": "-",
                                                  "variant": "op", "sample": -1,
                                                  "status": "error", "detail": why}],
                   "skipped": {}, "counts": {"samples": 0, "checks": 1, "equal": 0,
                                             "mismatch": 0, "error": 1, "skipped": 0,
                                             "seconds": 0}}
            records.append(rec)
            if progress:
                progress(start + 1, len(names), rec)
            start += 1
    return summarize(records, dtypes, variants, ops is None, time.monotonic() - t0)


def _read_records(path: str) -> list:
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in lines[:-1] if x]      # the last is unfinished or ""


def _signal_name(rc) -> str:
    if isinstance(rc, int) and rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            pass
    return f"exit status {rc}"


def _worker(start: int, ops, dtypes, variants, cap: float, path: str) -> int:
    _setup()
    sweep = Sweep(cap)
    opinfos = load_ops(ops)
    crash = os.environ.get("NPUSIM_OPINFO_CRASH")        # the isolation's own test
    with open(path, "a") as f:
        for op in opinfos[start:]:
            if crash == op_key(op):
                os.kill(os.getpid(), signal.SIGSEGV)
            f.write(json.dumps(check_op(sweep, op, dtypes, variants)) + "\n")
            f.flush()
    return 0


# ------------------------------------------------------------------------------ the page
def page(result: dict, command: str) -> str:
    s = result["summary"]
    lines = [
        "# OpInfo conformance sweep: the npu device against CPU, bitwise",
        "",
        "Generated by `benchmarks/opinfo_sweep.py`; do not edit. Regenerate (the whole sweep, "
        "slow):",
        "",
        "```bash",
        command,
        "```",
        "",
        "Every operator of torch's own OpInfo database (`op_db`) and every sample input it "
        "yields, run on npu and on CPU from the same bytes and compared bitwise (values with "
        "NaN positions and signed zeros, dtype, shape, significant strides, the inputs after the "
        "call). Variants: `fwd`, `grad` (`torch.autograd.grad` of the sum of outputs), "
        "`inplace`, and `out=` into a right-sized NaN-filled tensor (`out`), a non-contiguous "
        "one (`out_noncontig`), an empty one (`out_empty`), a wrong-sized one (`out_wrong`, with "
        "torch's resize warning) and a 0-d one (`out_0d`). The module's docstring says how; "
        "`KNOWN` in it gives each listed check its reason. A listed check without a reason is "
        "a bug of the device: tests/torch/test_opinfo_sweep.py fails on it. Random operators "
        "(bernoulli, dropout, normal, ...) draw from the npu's generator, seeded as the CPU's "
        "before each call, and are compared bitwise like the others. Each operator runs in a "
        "child process (a crash lists the operator and the sweep goes on), each call under a "
        "20 s cap.",
        "",
        f"torch {s['torch']}, dtypes {', '.join(s['dtypes'])} (gradients on float32), "
        f"{s['seconds']:.0f} s on this run's machine.",
        "",
        "| ops | samples | checks | equal | listed | of which mismatch | error | unexplained "
        "| skipped |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {s['ops']} | {s['samples']} | {s['checks']} | {s['equal']} | {s['listed']} | "
        f"{s['mismatch']} | {s['error']} | {s['unexplained']} | {s['skipped']} |",
        "",
    ]
    listed = result["listed"]
    if result.get("skipped"):
        lines += ["## Skipped checks", "", "| reason | checks |", "|---|---|"]
        for why, n in sorted(result["skipped"].items(), key=lambda x: -x[1]):
            lines.append(f"| {_cell(why)} | {n} |")
        lines.append("")
    lines += ["## Listed checks, by reason", ""]
    by_reason = {}
    for r in listed:
        by_reason.setdefault(r["reason"], set()).add(r["op"])
    tag = {}
    if by_reason:
        lines += ["| | reason | checks | ops |", "|---|---|---|---|"]
        for why in sorted(by_reason, key=lambda w: (w != "UNEXPLAINED", w)):
            tag[why] = "UNEXPLAINED" if why == "UNEXPLAINED" else f"R{len(tag) + 1}"
            n = sum(1 for r in listed if r["reason"] == why)
            ops = sorted(by_reason[why])
            more = f" and {len(ops) - 12} more" if len(ops) > 12 else ""
            lines.append(f"| {tag[why]} | {_cell(why)} | {n} | {', '.join(ops[:12])}{more} |")
        lines.append("")
    else:
        lines += ["None: every check is equal or skipped.", ""]
    lines += ["## Listed checks, by op", ""]
    by_op = {}
    for r in listed:
        by_op.setdefault(r["op"], []).append(r)
    for op in sorted(by_op):
        rs = by_op[op]
        lines += [f"### {op}", "", "| dtype | variant | samples | reason | first detail |",
                  "|---|---|---|---|---|"]
        groups = {}
        for r in rs:
            groups.setdefault((r["dtype"], r["variant"], r["reason"]), []).append(r)
        for (dn, v, why), g in sorted(groups.items()):
            idx = ",".join(str(r["sample"]) for r in g[:8]) + (",..." if len(g) > 8 else "")
            lines.append(f"| {dn} | {v} | {len(g)} ({idx}) | {tag[why]} | "
                         f"{_cell(g[0]['status'] + ': ' + g[0]['detail'])} |")
        lines.append("")
    if result.get("stale"):
        lines += ["## Stale reasons", "", "KNOWN entries that explained nothing in this run:", ""]
        lines += [f"- `{e[0]}` / `{e[1]}`: {e[3]}" for e in result["stale"]]
        lines.append("")
    return "\n".join(lines)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")[:300]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--fast", action="store_true", help="float32 only")
    ap.add_argument("--dtypes", default="", help="comma-separated dtypes (default: "
                    + ",".join(DTYPES) + ")")
    ap.add_argument("--variants", default="", help="comma-separated variants (default: all)")
    ap.add_argument("--cap", type=float, default=20.0, help="seconds per call (0: none)")
    ap.add_argument("--inline", action="store_true",
                    help="run in this process (a crash stops the sweep)")
    ap.add_argument("--page", default="", help="write the generated Markdown page here")
    ap.add_argument("--json", default="", help="write the JSON result here")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--records", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    dtypes = tuple(a.dtypes.split(",")) if a.dtypes else (("float32",) if a.fast else DTYPES)
    variants = tuple(a.variants.split(",")) if a.variants else VARIANTS
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)} (known: {', '.join(VARIANTS)})")
    ops = [o for o in a.ops.split(",") if o] or None
    if a.worker >= 0:
        return _worker(a.worker, ops, dtypes, variants, a.cap, a.records)

    def progress(j, n, rec):
        c = rec["counts"]
        if not a.quiet:
            print(f"[{j}/{n}] {rec['op']}: {c['samples']} samples, {c['equal']} equal, "
                  f"{c['mismatch']} mismatch, {c['error']} error ({c['seconds']} s)",
                  file=sys.stderr, flush=True)
    result = (run if a.inline else run_isolated)(ops, dtypes, variants, a.cap, progress)
    s = result["summary"]
    print(json.dumps(s))
    cmd = "PYTHONPATH=. python -m benchmarks.opinfo_sweep " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
    if a.page:
        with open(a.page, "w") as f:
            f.write(page(result, cmd if ops or a.fast or a.dtypes else COMMAND))
    for r in result["listed"]:
        if r["reason"] == "UNEXPLAINED" and not a.quiet:
            print(f"UNEXPLAINED {r['op']} {r['dtype']} {r['variant']} #{r['sample']}: "
                  f"{r['status']}: {r['detail']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NPUSIM_LOG_LEVEL", "error")
    sys.exit(main())
