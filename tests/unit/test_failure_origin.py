"""hccl.failure.origin: the npusim error behind the RuntimeError torch makes of a failed Future."""
from __future__ import annotations

from hccl.errors import RemoteRankError
from hccl.failure import Failure, handed_to_torch, of_exception, origin


def test_torchs_runtime_error_stands_for_the_error_handed_to_it():
    err = RemoteRankError("[rank 0] ALLREDUCE(comm=world, seq=102, count=4810, FP32, SUM) "
                          "failed: rank 1 killed by SIGKILL; the job is being stopped")
    handed_to_torch(err)
    # torch's words (torch/csrc/jit/python/pybind_utils.h), as DDP raises them from backward()
    torn = RuntimeError(f"Got the following error when running the callback: RemoteRankError: "
                        f"{err}\n\nAt:\n  /x/hccl/torch_work.py(120): outcome\n")
    assert origin(torn) is err
    assert of_exception(torn) == (Failure.RELEASED, "RemoteRankError")
    # anything else stays itself: another RuntimeError, a subclass, the error itself
    other = RuntimeError("CUDA error: out of memory")
    assert origin(other) is other and of_exception(other) == (Failure.ERROR, "RuntimeError")
    assert origin(err) is err
    sub = type("MyError", (RuntimeError,), {})(str(torn))
    assert origin(sub) is sub
