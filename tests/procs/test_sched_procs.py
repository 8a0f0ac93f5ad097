"""npusim's library leaves the scheduling class of the user's threads alone (4 ranks on 2 cores).

By default npurun changes no scheduling class (SCHED_BATCH loses on a shared machine:
runtime/sched.py); NPUSIM_SCHED_BATCH=1 starts the ranks in SCHED_BATCH and npurun says so, also
for ranks forked by the fork server. Either way the main
thread (which runs a collective when it synchronizes) and a thread of the user's own keep the
class they started with through init, collectives (checked while one runs) and
``comm.destroy()``.
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
from hccl import executor

inside = []                                    # the class while a collective runs
real_run = executor.Program.run
def run(*args, **kwargs):
    inside.append(os.sched_getscheduler(0))
    return real_run(*args, **kwargs)
executor.Program.run = run

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
seen["inside"] = sorted(set(inside))
comm.destroy()
seen["destroy"] = classes()
hold.set()
t.join(30)
with open(os.path.join({out!r}, f"rank{comm.rank}.json"), "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("knob,fork", [(None, "1"), ("1", "1"), ("1", "0"), ("0", "1")])
def test_user_threads_keep_their_scheduling_class(tmp_path, knob, fork):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        lc.env.pop("NPUSIM_SCHED_BATCH", None)
        lc.env["NPUSIM_FORKSERVER"] = fork
        if knob is not None:
            lc.env["NPUSIM_SCHED_BATCH"] = knob
        res = run_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path),
                         timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    batch = knob == "1"
    assert ("the ranks run in Linux's SCHED_BATCH class" in res.stderr) is batch, res.stderr
    launched = os.SCHED_BATCH if batch else os.SCHED_OTHER
    for r in range(4):
        seen = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert seen["start"] == [launched, launched], (r, seen)
        for phase in ("init", "collectives", "destroy"):
            assert seen[phase] == seen["start"], (r, phase, seen)
        assert seen["inside"] == [launched], (r, seen)


def test_npurun_gives_its_own_thread_its_class_back():
    from runtime import sched
    before = sched.current()
    with sched.spawning(True):
        during = sched.current()
    assert sched.current() == before
    if before == os.SCHED_OTHER:
        assert during == os.SCHED_BATCH


AFFINITY = """
import json, os
import hccl, runtime
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
comm.barrier()
runtime.synchronize()
with open(os.path.join({out!r}, f"rank{comm.rank}.json"), "w") as f:
    json.dump(sorted(os.sched_getaffinity(0)), f)
comm.destroy()
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("knob,fork", [(None, "1"), ("0", "1"), ("1", "1"), ("1", "0")])
def test_ranks_are_bound_to_cores_when_asked(tmp_path, knob, fork):
    """NPUSIM_BIND=1: npurun binds local ranks 0, 1 to the first core and 2, 3 to the second
    (2 cores) and says so, forked or not; unset or 0 leaves every rank the launcher's cores."""
    mask = sorted(os.sched_getaffinity(0))
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(AFFINITY.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        lc.env.pop("NPUSIM_BIND", None)
        lc.env["NPUSIM_FORKSERVER"] = fork
        if knob is not None:
            lc.env["NPUSIM_BIND"] = knob
        res = run_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path),
                         timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    bound = knob == "1"
    assert ("each rank is bound to one core" in res.stderr) is bound, res.stderr
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    if bound:
        assert got == [[mask[r * len(mask) // 4]] for r in range(4)], got
    else:
        assert got == [mask] * 4, got


def test_npurun_gives_its_own_thread_its_cores_back():
    from runtime import sched
    before = os.sched_getaffinity(0)
    with sched.pinned(sorted(before)[-1]):
        during = os.sched_getaffinity(0)
    assert os.sched_getaffinity(0) == before
    assert during == {sorted(before)[-1]}
    with sched.pinned(None):
        assert os.sched_getaffinity(0) == before
