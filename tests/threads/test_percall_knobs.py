"""A communicator reads its environment knobs once, not at every collective."""
import threading

import numpy as np
import pytest

import hccl
import runtime
from hccl import DataType, InvalidArgumentError, ReduceOp, config

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_knobs_are_read_once_per_communicator(monkeypatch):
    monkeypatch.setenv("HCCL_ALGO", "ring")
    monkeypatch.setenv("NPUSIM_SLICE_BYTES", "64")     # 1000 fp32 per rank: many slices
    reads = []
    for name in ("algo_set", "slice_bytes", "exec_timeout"):
        real = getattr(config, name)
        monkeypatch.setattr(config, name, lambda real=real, name=name: reads.append(name) or real())
    calls = 5

    def body(comm):
        x = runtime.to_device(np.arange(1000, dtype=np.float32) * (comm.rank + 1))
        for _ in range(calls):
            hccl.all_reduce(x, x, 1000, DataType.FP32, ReduceOp.SUM, comm)
        out = x.to_host()
        return out, comm._knobs

    outs = run_ranks(2, body)
    # each call doubles-and-adds: x <- x0 * (1 + 2) then x * 2 per call after the first
    want = np.arange(1000, dtype=np.float32) * 3 * 2 ** (calls - 1)
    for out, knobs in outs:
        np.testing.assert_array_equal(out, want)
        assert knobs == ("ring", 64, 1 << 62)         # inproc: every send is a copy
    # one read of each per communicator (2 ranks), not one per call (10)
    assert sorted(reads) == sorted(["algo_set", "slice_bytes", "exec_timeout"] * 2), reads


def test_bad_algorithm_fails_every_call_until_fixed(monkeypatch):
    monkeypatch.setenv("HCCL_ALGO", "nosuchalgo")
    gate = threading.Barrier(2, timeout=30)

    def body(comm):
        x = runtime.to_device(np.full(8, comm.rank + 1, np.float32))
        errors = []
        for _ in range(2):
            with pytest.raises(InvalidArgumentError) as e:
                hccl.all_reduce(x, x, 8, DataType.FP32, ReduceOp.SUM, comm)
            errors.append(str(e.value))
        gate.wait()
        if comm.rank == 0:
            monkeypatch.setenv("HCCL_ALGO", "ring")   # fixed: the next call uses it
        gate.wait()
        hccl.all_reduce(x, x, 8, DataType.FP32, ReduceOp.SUM, comm)
        return errors, x.to_host(), comm._knobs

    for errors, out, knobs in run_ranks(2, body):
        assert len(errors) == 2 and all("nosuchalgo" in m for m in errors), errors
        np.testing.assert_array_equal(out, np.full(8, 3, np.float32))
        assert knobs[0] == "ring"


def test_set_slice_bytes_keeps_its_slice_and_the_algorithm_read_then(monkeypatch):
    monkeypatch.setenv("HCCL_ALGO", "ring")
    monkeypatch.setenv("NPUSIM_WIRE_SLICE_BYTES", "4096")
    reads = []
    real = config.slice_bytes
    monkeypatch.setattr(config, "slice_bytes", lambda: reads.append(1) or real())

    def body(comm):
        for bad in (0, -64, True, 64.0, "64"):
            with pytest.raises(InvalidArgumentError, match="nbytes"):
                comm.set_slice_bytes(bad)
        assert comm._knobs is None                    # a refused value keeps nothing
        comm.set_slice_bytes(1 << 20)                 # past the wire's slice: the wire's
        clamped = comm._knobs
        comm.set_slice_bytes(64)
        x = runtime.to_device(np.arange(1000, dtype=np.float32) * (comm.rank + 1))
        hccl.all_reduce(x, x, 1000, DataType.FP32, ReduceOp.SUM, comm)
        return clamped, comm._knobs, x.to_host()

    for clamped, knobs, out in run_ranks(2, body):
        assert clamped == ("ring", 4096, 1 << 62)
        assert knobs == ("ring", 64, 1 << 62)         # the collective planned with them, kept
        np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32) * 3)
    assert reads == []                                # HCCL_BUFFSIZE's slice never read
