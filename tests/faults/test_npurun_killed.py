"""npurun SIGKILLed while its ranks run shared-memory collectives: the ranks die with it (their
parent-death signal, SIGKILL, set by launcher.worker before any user code) and its janitor removes
the job's /dev/shm segments. Bound: the kernel delivers the parent-death signal at once; asserted
with tests/bounds.py's slack, and LeakCheck finds no process or segment left."""
from __future__ import annotations

import textwrap
import time

import pytest

from tests import bounds
from tests.leakcheck import LeakCheck, pid_gone, start_npurun, wait_for
from tests.faults.test_link_cut import RANK


@pytest.mark.timeout(120)
def test_sigkilled_npurun_takes_ranks_in_collectives_along(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK.format(out=str(tmp_path), diag_off=False,
                                                  count=1 << 16)))
    with LeakCheck(grace=15) as lc:
        lc.env.update({"NPUSIM_SHM_MIN_BYTES": str(16 << 10), "HCCL_BUFFSIZE": "1"})
        p = start_npurun("--nproc-per-node", "3", str(script), env=lc.env, cwd=str(tmp_path))
        try:
            wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(3))
                     or p.poll() is not None, 90, what="3 ranks ready")
            pids = [int((tmp_path / f"ready.{r}").read_text()) for r in range(3)]
            wait_for(lambda: all((tmp_path / f"running.{r}").exists() for r in range(3)), 60,
                     what="collectives running")   # RANK writes it after its first collective
            t0 = time.monotonic()
            p.kill()
            p.communicate(timeout=10)
            wait_for(lambda: all(pid_gone(pid) for pid in pids), bounds.NPURUN_KILLED_ASSERTED,
                     what="the ranks to die with npurun")
            print(f"observed: npurun SIGKILLed -> ranks gone after {time.monotonic() - t0:.2f} s")
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
    assert not any((tmp_path / f"result.{r}").exists() for r in range(3))   # killed, not failed
