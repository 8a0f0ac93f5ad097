"""How a failed collective reaches torch: as a failed future torch's C++ understands.

``torch.futures.Future.set_exception`` stores the exception as the future's value; DDP's
reducer then read a failed bucket as a successful one holding no tensor and crashed the
backward engine with SIGSEGV (issue 40: every survivor of a killed peer). A failed Work's
future must be failed in torch's terms, and ``Work.wait()`` must still raise npusim's type.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

from hccl.errors import RemoteRankError  # noqa: E402
from hccl.failure import Failure, of_exception, origin  # noqa: E402
from hccl.torch_work import Work  # noqa: E402
from launcher.procs.env import PACKAGE_ROOT  # noqa: E402

ERR = "[rank 0] ALLREDUCE(comm=world, seq=7, count=8, FP32, SUM) failed: rank 1 killed by SIGKILL"


@pytest.mark.timeout(30)
def test_a_failed_work_fails_its_future_and_wait_raises_npusims_error():
    import torch
    out = [torch.ones(2)]
    ok = Work("allreduce", out)
    ok.complete(None)
    assert ok.wait() is True and ok.get_future().wait() is out and ok.is_success()
    err = RemoteRankError(ERR)
    bad = Work("allreduce", [torch.ones(2)])
    assert not bad.is_completed()
    bad.complete(err)
    assert bad.is_completed() and not bad.is_success() and bad.exception() is err
    with pytest.raises(RuntimeError) as torn:      # torch's words, as gloo's errors
        bad.get_future().wait()
    assert ERR in str(torn.value)
    assert origin(torn.value) is err and of_exception(torn.value) == (Failure.RELEASED,
                                                                      "RemoteRankError")
    with pytest.raises(RemoteRankError, match="rank 1 killed by SIGKILL"):
        bad.wait()
    # a chained callback (a DDP comm hook written in Python) sees the failure too
    with pytest.raises(RuntimeError, match="rank 1 killed by SIGKILL"):
        bad.get_future().then(lambda f: f.value()).wait()


DDP_JOB = textwrap.dedent('''
    import torch, torch.distributed as dist
    from hccl.errors import RemoteRankError
    from hccl.torch_work import Work

    class PG(dist.ProcessGroup):    # a backend whose third all_reduce fails, as a dead peer's
        calls = 0
        def getBackendName(self):
            return "failing"
        def _work(self, outs, error=None):
            w = Work("x", outs)
            w.complete(error)
            return w
        def allreduce(self, tensors, opts=None):
            PG.calls += 1
            return self._work(list(tensors), RemoteRankError("%s") if PG.calls > 2 else None)
        def allgather(self, outs, ins, opts=None):
            for o in outs[0]:
                o.copy_(ins[0])
            return self._work(outs[0])
        def broadcast(self, tensors, opts=None):
            return self._work(list(tensors))

    dist.Backend.register_backend("failing", lambda o, b=None: PG(o.group_rank, o.group_size),
                                  extended_api=True, devices=["cpu"])
    dist.init_process_group("failing", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    for step in range(3):
        try:
            model(torch.randn(2, 4)).sum().backward()
            print("step", step, "ok", flush=True)
        except RuntimeError as e:
            print("step", step, "raised:", str(e).splitlines()[0], flush=True)
            break
''' % ERR)


@pytest.mark.timeout(120)
def test_ddp_backward_raises_the_failure_instead_of_crashing():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    res = subprocess.run([sys.executable, "-c", DDP_JOB], env=env, capture_output=True,
                         text=True, timeout=100)
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr[-3000:])
    lines = res.stdout.splitlines()
    assert lines[:2] == ["step 0 ok", "step 1 ok"], res.stdout
    assert lines[2].startswith("step 2 raised: ") and ERR in lines[2], res.stdout
