"""launcher.spawn with a rank SIGKILLed in a loop of shared-memory collectives: spawn is the
launcher here, and it reacts before the transport needs to: it raises ProcessExitedError naming
the rank as soon as it reaps it (woken by the child's exit), after stopping the others. Bound:
the exit wake-up plus stopping the survivors (SIGTERM; NPUSIM_STOP_GRACE, 5 s, before SIGKILL);
asserted within twice the grace plus a second for the wake-up (11 s). Nothing is left behind
(LeakCheck)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

import launcher
from launcher import config
from launcher.errors import ProcessExitedError
from tests.leakcheck import MARKER, LeakCheck
from tests.faults.faultlib import BIG, FAULT_ENV


def loop(rank, out, victim):
    import numpy as np
    import hccl
    import runtime
    runtime.set_device(rank)
    comm = hccl.init_comm()
    x = runtime.to_device(np.ones(BIG, np.float32))
    y = runtime.empty(BIG, np.float32)
    for i in range(10 ** 6):
        if rank == victim and i == 3:
            with open(os.path.join(out, "dying"), "w") as f:
                json.dump({"t": time.time()}, f)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(x, y)
        runtime.current_stream().synchronize()


@pytest.mark.timeout(150)
def test_spawn_names_the_sigkilled_rank(tmp_path):
    with LeakCheck(grace=15) as lc:
        with pytest.raises(ProcessExitedError) as ei:
            launcher.spawn(loop, 3, (str(tmp_path), 1), timeout=120,
                           env={MARKER: lc.tag, **FAULT_ENV})
        t_raised = time.time()
    t_fault = json.loads((tmp_path / "dying").read_text())["t"]
    print(f"observed: spawn raised {t_raised - t_fault:.2f} s after the SIGKILL")
    assert ei.value.rank == 1 and ei.value.exitcode == -signal.SIGKILL, ei.value
    assert t_raised - t_fault < 2 * config.stop_grace() + 1.0
