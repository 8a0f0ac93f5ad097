"""npusim leaves the scheduling class of the user's threads alone (4 ranks on 2 cores).

With more ranks than cores collectives run in SCHED_BATCH (runtime/sched.py), but only for their
duration: the user's main thread (which runs a collective when it synchronizes) and a thread of
the user's own keep their class after init, after collectives and after ``comm.destroy()``.
"""
import json
import os
import textwrap

import pytest

from tests.leakcheck import LeakCheck, run_npurun

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH here")

SCRIPT = """
import json, os, threading
import numpy as np
import hccl, runtime
from runtime import sched

inside = []                                    # the class while a collective runs
real_enter = sched.enter
def enter(want):
    moved = real_enter(want)
    inside.append(sched.current())
    return moved
sched.enter = enter

hold, ready = threading.Event(), threading.Event()
user_tid = []
def user_thread():
    user_tid.append(threading.get_native_id())
    ready.set()
    hold.wait(120)
t = threading.Thread(target=user_thread)
t.start()
ready.wait(30)
main_tid = threading.get_native_id()
def classes():
    return [os.sched_getscheduler(main_tid), os.sched_getscheduler(user_tid[0])]

runtime.set_device(int(os.environ["LOCAL_RANK"]))
seen = {"start": classes()}
comm = hccl.init_comm()
seen["init"] = classes()
x = runtime.to_device(np.arange(256, dtype=np.float32) + comm.rank)
for _ in range(20):
    comm.all_reduce(x)                           # synchronous: the main thread runs it
s = runtime.Stream()
comm.all_reduce(x, stream=s)
s.synchronize()
seen["collectives"] = classes()
seen["batched"] = comm.world.transport.sched_batch
seen["inside"] = sorted(set(inside))
comm.destroy()
seen["destroy"] = classes()
hold.set()
t.join(30)
with open(os.path.join({out!r}, f"rank{comm.rank}.json"), "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.timeout(300)
def test_user_threads_keep_their_scheduling_class(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT.replace("{out!r}", repr(str(tmp_path)))))
    crowded = 4 > len(os.sched_getaffinity(0))
    with LeakCheck() as lc:
        # the default turns SCHED_BATCH on when the ranks outnumber the cores (here: 2); on a
        # bigger machine the knob turns it on, so the mechanism runs either way
        lc.env.pop("NPUSIM_SCHED_BATCH", None)
        if not crowded:
            lc.env["NPUSIM_SCHED_BATCH"] = "1"
        res = run_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path),
                         timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in range(4):
        seen = json.loads((tmp_path / f"rank{r}.json").read_text())
        start = seen["start"]
        for phase in ("init", "collectives", "destroy"):
            assert seen[phase] == start, (r, phase, seen)
        assert seen["batched"] is True, seen
        assert seen["inside"] == [os.SCHED_BATCH], seen   # so the test above could fail
