"""Start the ranks of tests/faults/rank_prog.py without npurun, act on them, collect what they saw."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.leakcheck import wait_for

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_prog.py")
BIG = 1 << 20          # float32 elements: 4 MiB, many slices under HCCL_BUFFSIZE=1, shared memory
FAULT_ENV = {"HCCL_BUFFSIZE": "1", "NPUSIM_SHM_MIN_BYTES": str(64 << 10),
             "HCCL_EXEC_TIMEOUT": "120", "NPUSIM_HBM_BYTES": str(256 << 20)}


def read(path):
    with open(path) as f:
        return json.load(f)


class Ranks:
    """``n`` rank processes of one root-info job in ``out``; ``close`` kills what is left."""

    def __init__(self, out, n, plan, env, extra=None):
        self.out, self.n = str(out), n
        e = {**env, **FAULT_ENV, **(extra or {})}
        self.procs = [subprocess.Popen([sys.executable, PROG, self.out, str(r), str(n),
                                        json.dumps(plan)], env=e, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
                      for r in range(n)]

    def path(self, name):
        return os.path.join(self.out, name)

    def wait_ready(self, timeout=90):
        # every rank ready, or exited (a victim may die right after its own ready file, before
        # the others wrote theirs; a rank that exited without one failed init)
        wait_for(lambda: all(os.path.exists(self.path(f"ready.{r}")) or p.poll() is not None
                             for r, p in enumerate(self.procs)), timeout, what="ranks ready")
        for r, p in enumerate(self.procs):
            assert os.path.exists(self.path(f"ready.{r}")), self.output(r)

    def results(self, ranks, timeout):
        """{rank: result dict} of ``ranks`` once each wrote one (AssertionError after timeout)."""
        wait_for(lambda: all(os.path.exists(self.path(f"result.{r}")) for r in ranks),
                 timeout, what=f"results of ranks {list(ranks)}")
        return {r: read(self.path(f"result.{r}")) for r in ranks}

    def wait_exit(self, timeout=30):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(max(0.1, deadline - time.monotonic()))
        return [p.returncode for p in self.procs]

    def output(self, r):
        p = self.procs[r]
        if p.poll() is None:
            return "(running)"
        return p.stdout.read()

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
            p.stdout.close()
