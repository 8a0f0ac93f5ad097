"""Collective test bodies shared by the threaded-rank and the real-process tests.

A case is a plain dict (op, dtype, redop, count, root, inplace). ``run_case(comm, case)`` runs it on
one rank through the public API on a runtime stream and returns the host result;
``expected(size, rank, case)`` computes the same thing with numpy from every rank's input.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

import hccl
import runtime
from hccl import DataType, ReduceOp

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
          "float32", "float64", "bfloat16"]
OPS = ["SUM", "PROD", "MAX", "MIN"]


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def make_input(rank: int, n: int, dtype: str, redop: str | None, salt: int = 0) -> np.ndarray:
    """Deterministic input of ``n`` elements for ``rank``; PROD uses values near 1."""
    rng = np.random.default_rng(1000 * rank + 17 * salt + n)
    dt = np_dtype(dtype)
    if redop == "PROD":
        if dt.kind == "f" or dtype == "bfloat16":
            return rng.uniform(0.9, 1.1, n).astype(dt)
        return rng.integers(1, 4, n).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -100), min(info.max, 100)
        return rng.integers(lo, hi, n, endpoint=True).astype(dt)
    return rng.uniform(-4, 4, n).astype(dt)


def _reduce(arrays, redop, dt):
    if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
        acc = np.stack([a.astype(np.float64) for a in arrays])
    else:
        acc = np.stack(arrays)
    if redop in ("MAX", "MIN"):
        return (np.max if redop == "MAX" else np.min)(acc, axis=0).astype(dt)
    f = np.sum if redop == "SUM" else np.prod
    # integers wrap exactly like the device: accumulate in the dtype itself
    return f(acc, axis=0).astype(dt) if acc.dtype != dt else f(acc, axis=0, dtype=dt)


def expected(size: int, rank: int, case: dict) -> np.ndarray:
    op, dtype, redop, c = case["op"], case["dtype"], case.get("redop"), case["count"]
    dt = np_dtype(dtype)
    if op == "all_reduce":
        return _reduce([make_input(r, c, dtype, redop) for r in range(size)], redop, dt)
    if op == "reduce":
        if rank != case["root"]:
            return None
        return _reduce([make_input(r, c, dtype, redop) for r in range(size)], redop, dt)
    if op == "all_gather":
        return np.concatenate([make_input(r, c, dtype, None) for r in range(size)])
    if op == "reduce_scatter":
        full = _reduce([make_input(r, c * size, dtype, redop) for r in range(size)], redop, dt)
        return full[rank * c:(rank + 1) * c]
    if op == "broadcast":
        return make_input(case["root"], c, dtype, None)
    if op == "all_to_all":
        return np.concatenate([make_input(r, c * size, dtype, None)[rank * c:(rank + 1) * c]
                               for r in range(size)])
    if op == "sendrecv":   # ring shift: receive what rank-1 sent
        return make_input((rank - 1) % size, c, dtype, None)
    raise ValueError(op)


def run_case(comm, case: dict, stream=None) -> np.ndarray:
    """Run one case on this rank; returns the host copy of the result."""
    op, dtype, redop, c = case["op"], case["dtype"], case.get("redop"), case["count"]
    size, rank = comm.size, comm.rank
    dt = np_dtype(dtype)
    s = stream or runtime.current_stream()
    rop = ReduceOp[redop] if redop else None
    inplace = case.get("inplace", False)
    if op in ("all_reduce", "reduce"):
        send = runtime.to_device(make_input(rank, c, dtype, redop))
        recv = send if inplace else runtime.empty(c, dt)
        if op == "all_reduce":
            hccl.all_reduce(send, recv, c, dt, rop, comm, s)
        else:
            hccl.reduce(send, recv, c, dt, rop, case["root"], comm, s)
    elif op == "all_gather":
        send = runtime.to_device(make_input(rank, c, dtype, None))
        recv = runtime.empty(c * size, dt)
        hccl.all_gather(send, recv, c, dt, comm, s)
    elif op == "reduce_scatter":
        send = runtime.to_device(make_input(rank, c * size, dtype, redop))
        recv = runtime.empty(c, dt)
        hccl.reduce_scatter(send, recv, c, dt, rop, comm, s)
    elif op == "broadcast":
        x = make_input(rank, c, dtype, None) if rank == case["root"] else np.zeros(c, dt)
        send = recv = runtime.to_device(x)
        hccl.broadcast(recv, c, dt, case["root"], comm, s)
    elif op == "all_to_all":
        send = runtime.to_device(make_input(rank, c * size, dtype, None))
        recv = runtime.empty(c * size, dt)
        hccl.all_to_all(send, c, recv, c, dt, comm, s)
    elif op == "sendrecv":
        send = runtime.to_device(make_input(rank, c, dtype, None))
        recv = runtime.empty(c, dt)
        if size > 1:
            # even ranks send first, odd ranks receive first: no deadlock whatever the transport
            nxt, prv = (rank + 1) % size, (rank - 1) % size
            if rank % 2 == 0:
                hccl.send(send, c, dt, nxt, comm, s)
                hccl.recv(recv, c, dt, prv, comm, s)
            else:
                hccl.recv(recv, c, dt, prv, comm, s)
                hccl.send(send, c, dt, nxt, comm, s)
        else:
            runtime.memcpy(recv, send, send.nbytes)
    else:
        raise ValueError(op)
    s.synchronize()
    out = recv.to_host() if recv is not None else None
    if op == "reduce" and rank != case["root"]:
        out = None
    return out


def tolerance(dtype: str, size: int, redop: str | None):
    """(rtol, atol) for float results reduced in another order than numpy's."""
    if dtype == "bfloat16":
        return 2e-2 * max(1, size), 0.05 * size
    if dtype == "float16":
        return 2e-3 * max(1, size), 0.01 * size
    if dtype == "float32":
        return 1e-5, 1e-5
    return 1e-12, 1e-12


def check(out, exp, case: dict, size: int) -> None:
    if exp is None:
        assert out is None
        return
    dt = np_dtype(case["dtype"])
    assert out.dtype == dt and out.shape == exp.shape, (out.dtype, out.shape, exp.shape)
    if dt.kind in "iu" or case["op"] in ("all_gather", "broadcast", "all_to_all", "sendrecv") \
            or case.get("redop") in ("MAX", "MIN"):
        np.testing.assert_array_equal(out.view(np.uint8), exp.view(np.uint8), err_msg=str(case))
    else:
        rtol, atol = tolerance(case["dtype"], size, case.get("redop"))
        np.testing.assert_allclose(out.astype(np.float64), exp.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=str(case))


def cases(counts, dtypes=DTYPES, ops=OPS, size=4):
    """The case matrix for one world size."""
    out = []
    for dtype, c in itertools.product(dtypes, counts):
        for redop in ops:
            out.append({"op": "all_reduce", "dtype": dtype, "redop": redop, "count": c,
                        "inplace": c % 2 == 1})
            out.append({"op": "reduce_scatter", "dtype": dtype, "redop": redop, "count": c})
            out.append({"op": "reduce", "dtype": dtype, "redop": redop, "count": c,
                        "root": (c + 1) % size})
        out.append({"op": "all_gather", "dtype": dtype, "count": c})
        out.append({"op": "broadcast", "dtype": dtype, "count": c, "root": c % size})
        out.append({"op": "all_to_all", "dtype": dtype, "count": c})
        out.append({"op": "sendrecv", "dtype": dtype, "count": c})
    return out
