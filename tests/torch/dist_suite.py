"""torch's own ``_DistTestBase`` suite (torch/testing/_internal/distributed/distributed_test.py)
on the "hccl" backend, as test/distributed/test_distributed_spawn.py drives it for gloo.

Not collected by default (the whole suite takes long); run it by naming this file:

    PYTHONPATH=. python -m pytest tests/torch/dist_suite.py -q            # hccl, world 3
    NPUSIM_TORCH_SUITE=gloo PYTHONPATH=. python -m pytest tests/torch/dist_suite.py -q

``NPUSIM_TORCH_SUITE_START=fork`` forks the ranks from the test process instead of spawning them
(torch's former test_distributed_fork.py): each test then skips 3 imports of torch, ~3x faster.

The skip rules are gloo's: the suite reads ``BACKEND`` when it is imported (its decorators), so
that happens with ``BACKEND=gloo``; the backend the ranks then initialise is the module's
``BACKEND`` at run time, set here to ``NPUSIM_TORCH_SUITE`` (default "hccl"). The ranks are
spawned processes that import this module again, so they make the same choice. Rendezvous is
the suite's own ``file://`` init method: the backend starts from torch's Store, no npurun.
"""
from __future__ import annotations

import os
import tempfile

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install -e '.[torch]'")

os.environ["BACKEND"] = "gloo"                     # gloo's skip rules
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="npusim-dist-suite-"))
for _k in ("NPUSIM_JOB_SECRET", "RANK", "LOCAL_RANK"):     # not an npurun job
    os.environ.pop(_k, None)

import hccl.torch_backend  # noqa: E402,F401
from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402

dt.BACKEND = os.environ.get("NPUSIM_TORCH_SUITE", "hccl")


class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("NPUSIM_TORCH_SUITE_START") == "fork":   # torch's old fork variant
            import torch.multiprocessing
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
