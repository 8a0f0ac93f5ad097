"""npusim's library leaves the scheduling class of the user's threads alone (4 ranks on 2 cores);
npurun's watcher moves crowded ranks between SCHED_BATCH / one core and the default class / every
core as other programs come and go (launcher/agent/schedwatch.py).

With the watcher off, npurun starts the ranks in the default class; NPUSIM_SCHED_BATCH=1 starts
them in SCHED_BATCH and npurun says so, also for ranks forked by the fork server. Either way the
main thread (which runs a collective when it synchronizes) and a thread of the user's own keep
the class they started with through init, collectives (checked while one runs) and
``comm.destroy()``.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.leakcheck import LeakCheck, run_npurun, start_npurun, wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH here")

SCRIPT = """
import json, os, threading
import numpy as np
import hccl, runtime
from hccl import executor

inside = []                                    # the class while a collective runs
def spy(real):                                 # a small call may run whole in ``begin``
    def step(*args, **kwargs):
        inside.append(os.sched_getscheduler(0))
        return real(*args, **kwargs)
    return step
executor.Program.run = spy(executor.Program.run)
executor.Program.begin = spy(executor.Program.begin)

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
        if knob is not None:    # 0: the watcher keeps to binding, never the class
            lc.env["NPUSIM_SCHED_BATCH"] = knob
        else:                   # the library alone: the watcher would move every thread
            lc.env["NPUSIM_SCHED_WATCH"] = "0"
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
    (2 cores) and says so, forked or not; 0 (or unset with the watcher off) leaves every rank the
    launcher's cores."""
    mask = sorted(os.sched_getaffinity(0))
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(AFFINITY.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        lc.env.pop("NPUSIM_BIND", None)
        lc.env["NPUSIM_FORKSERVER"] = fork
        if knob is not None:    # 0: the watcher keeps to the class, never binds
            lc.env["NPUSIM_BIND"] = knob
        else:
            lc.env["NPUSIM_SCHED_WATCH"] = "0"
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


# -- the watcher (launcher/agent/schedwatch.py) ------------------------------------------------

RANK = """
import os, sys, threading
hold = threading.Event()
def user():
    if os.environ.get("OWN") == "1":     # a thread that chose its own class and cores
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    sys.stdout.write(f"{threading.get_native_id()}\\n")
    sys.stdout.flush()
    hold.wait(120)
t = threading.Thread(target=user, daemon=True)
t.start()
sys.stdin.read()                          # idle until the test closes stdin
"""


def _hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(30)


def _run_ns(pid: int) -> int:
    """ns on a CPU of ``pid``'s main thread (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError):
        return 0


def _state(pid: int) -> set:
    """{(class, cores)} of every thread of ``pid``."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add((os.sched_getscheduler(int(tid)), frozenset(os.sched_getaffinity(int(tid)))))
        except OSError:
            pass
    return out


@pytest.mark.timeout(120)
def test_watcher_leaves_batch_while_a_busy_loop_runs():
    """4 idle "ranks" (children of this test, two threads each) go to SCHED_BATCH and their core
    while nothing runs, to the default class on the cores the busy loop leaves free
    (``free_cores`` of its use) within a bounded time after a busy loop starts, and back after
    it stops; a thread that chose its own class and cores keeps them throughout. The probe is the busy loop's own CPU use (the machine is shared: its other
    programs would decide for it); ``CpuProbe``, the default, is tested through npurun below."""
    from launcher.agent import schedwatch
    mask = frozenset(os.sched_getaffinity(0))
    cores = sorted(mask)
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        pytest.skip("this test runs outside the default class")
    hogs: list[subprocess.Popen] = []
    last = {}

    def probe(_pids):
        """Cores the busy loops used since the previous call."""
        now = time.monotonic()
        ns = sum(_run_ns(h.pid) for h in hogs if h.poll() is None)
        prev, last["t"] = last.get("t"), (now, ns, len(hogs))
        if prev is None or prev[2] != len(hogs):
            return None
        return max(0, ns - prev[1]) / 1e9 / (now - prev[0])

    ranks = [subprocess.Popen([sys.executable, "-c", RANK], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OWN": "1" if r == 0 else "0"})
             for r in range(4)]
    # a busy loop gets ~2 cores / load average of CPU at worst: far above 0.02 cores in 0.1 s
    pol = schedwatch.Policy(4, len(cores), watch_batch=True, watch_bind=True, threshold=0.02)
    watcher = None
    try:
        own = int(ranks[0].stdout.readline())          # rank 0's own thread is set up
        for p in ranks[1:]:
            p.stdout.readline()
        watcher = schedwatch.Watcher(pol, mask, probe=probe, interval=0.1)
        watcher.follow([(r, p.pid) for r, p in enumerate(ranks)])

        def placed(quiet):
            if quiet != watcher.quiet:
                return False
            for r, p in enumerate(ranks):
                want = ((os.SCHED_BATCH, frozenset({cores[r * len(cores) // 4]})) if quiet
                        else (os.SCHED_OTHER, watcher.cores))
                if _state(p.pid) - {(os.SCHED_IDLE, frozenset({cores[-1]}))} != {want}:
                    return False
            return True

        t0 = time.monotonic()
        wait_for(lambda: placed(True), 20, what="the ranks in SCHED_BATCH on their cores")
        quiet_after = time.monotonic() - t0
        hogs.append(_hog())
        t0 = time.monotonic()
        wait_for(lambda: placed(False), 20, what="the ranks back in SCHED_OTHER on free cores")
        left_after = time.monotonic() - t0
        # the busy loop's use leaves this many cores (no idle shares from this probe: the
        # watcher takes the last ones of the mask)
        k = schedwatch.free_cores(len(cores), 4, watcher.last_load)
        assert watcher.cores == frozenset(cores[len(cores) - k:]), (watcher.cores, k)
        _kill(hogs.pop())
        t0 = time.monotonic()
        wait_for(lambda: placed(True), 20, what="the ranks in SCHED_BATCH again")
        back_after = time.monotonic() - t0
        assert watcher.switches >= 3, watcher.switches
        # rank 0's own thread kept the class and the core it chose
        assert os.sched_getscheduler(own) == os.SCHED_IDLE
        assert os.sched_getaffinity(own) == {cores[-1]}
        # bounded: a few samples of 0.1 s (quiet needs 3 in a row), with slack for a busy machine
        assert left_after < 5.0 and quiet_after < 10.0 and back_after < 10.0, (
            quiet_after, left_after, back_after)
    finally:
        if watcher is not None:
            watcher.close()
        for h in hogs:
            _kill(h)
        for p in ranks:
            p.stdin.close()
            p.wait(30)
            p.stdout.close()


def test_policy_watches_crowded_ranks_only_where_no_knob_fixes_it(monkeypatch):
    from launcher.agent import schedwatch
    from runtime import sched
    for k in ("NPUSIM_SCHED_BATCH", "NPUSIM_BIND", "NPUSIM_SCHED_WATCH",
              "NPUSIM_SCHED_WATCH_CORES"):
        monkeypatch.delenv(k, raising=False)
    n = sched.cores()
    pol = schedwatch.policy(n + 1)
    assert (pol.watch_batch, pol.watch_bind, pol.batch, pol.bind) == (True, True, False, False)
    assert "while other programs use less than 0.3 of these cores" in pol.announce()
    assert not schedwatch.policy(n).watching and schedwatch.policy(n).announce() is None
    most = schedwatch.WATCH_RANKS_PER_CORE * n        # beyond: npurun's samples cost more
    assert schedwatch.policy(most).watching
    big = schedwatch.policy(most + 1)
    assert not big.watching and not big.batch and not big.bind and big.announce() is None
    monkeypatch.setenv("NPUSIM_SCHED_BATCH", "0")
    pol = schedwatch.policy(n + 1)
    assert (pol.watch_batch, pol.watch_bind) == (False, True)
    monkeypatch.setenv("NPUSIM_BIND", "1")
    pol = schedwatch.policy(n + 1)
    assert (pol.watch_batch, pol.watch_bind, pol.bind) == (False, False, True)
    assert "NPUSIM_BIND=1" in pol.announce()
    monkeypatch.delenv("NPUSIM_SCHED_BATCH")
    monkeypatch.delenv("NPUSIM_BIND")
    monkeypatch.setenv("NPUSIM_SCHED_WATCH", "0")
    assert not schedwatch.policy(n + 1).watching and schedwatch.policy(n + 1).announce() is None


def _others(seconds: float) -> float:
    """The most other programs used of this process's cores in any 0.2 s of ``seconds``."""
    from launcher.agent.schedwatch import CpuProbe
    probe, worst = CpuProbe(os.sched_getaffinity(0)), 0.0
    probe((os.getpid(),))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        worst = max(worst, probe((os.getpid(),)) or 0.0)
    return worst


def _watched(env: dict, cores: str, fork: str | None = None) -> None:
    """npurun's environment for its watcher alone, with threshold ``cores``."""
    for k in ("NPUSIM_SCHED_BATCH", "NPUSIM_BIND", "NPUSIM_SCHED_WATCH"):
        env.pop(k, None)
    env["NPUSIM_SCHED_WATCH_CORES"] = cores
    if fork is not None:
        env["NPUSIM_FORKSERVER"] = fork


WAITING = """
import os, time
with open(os.path.join({out!r}, f"pid{os.environ['LOCAL_RANK']}"), "w") as f:
    f.write(str(os.getpid()))
end = time.monotonic() + 120
while not os.path.exists(os.path.join({out!r}, "done")) and time.monotonic() < end:
    time.sleep(0.05)
"""


@pytest.mark.timeout(180)
def test_npurun_watcher_follows_a_busy_loop(tmp_path):
    """Through npurun, measured as it measures (/proc/stat): 4 idle ranks on 2 cores go to
    SCHED_BATCH while nothing else runs, leave it within ~1 s after a busy loop starts and come
    back after it stops. Needs a machine whose other programs stay below the threshold."""
    if len(os.sched_getaffinity(0)) >= 4:
        pytest.skip("needs fewer than 4 cores (4 ranks must be crowded)")
    background = _others(1.0)
    if background > 0.1:
        pytest.skip(f"other programs use {background:.2f} cores of this machine: no quiet phase "
                    "to see (the watcher test above covers the moves)")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(WAITING.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        _watched(lc.env, "0.3")
        proc = start_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path))
        hog = None
        try:
            files = [tmp_path / f"pid{r}" for r in range(4)]
            wait_for(lambda: all(f.exists() and f.read_text() for f in files), 60,
                     what="the ranks' pids")
            pids = [int(f.read_text()) for f in files]

            def classes():
                return {c for pid in pids for c, _ in _state(pid)}
            wait_for(lambda: classes() == {os.SCHED_BATCH}, 30, what="SCHED_BATCH (quiet)")
            hog = _hog()
            t0 = time.monotonic()
            wait_for(lambda: classes() == {os.SCHED_OTHER}, 10, what="SCHED_OTHER (busy loop)")
            left_after = time.monotonic() - t0
            _kill(hog)
            hog = None
            wait_for(lambda: classes() == {os.SCHED_BATCH}, 30, what="SCHED_BATCH again")
            (tmp_path / "done").write_text("")
            out, err = proc.communicate(timeout=60)
        finally:
            if hog is not None:
                _kill(hog)
            if proc.poll() is None:
                (tmp_path / "done").write_text("")
                proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "while other programs use less than 0.3 of these cores" in err, err
    assert left_after < 3.0, left_after


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fork", ["1", "0"])
def test_npurun_watcher_places_ranks_while_under_its_threshold(tmp_path, fork):
    """Through npurun, with a threshold no machine reaches (so also on a shared one): 4 ranks
    on 2 cores, forked or fresh interpreters, end up in SCHED_BATCH with local ranks 0, 1 on
    the first core and 2, 3 on the second, every thread, within a few samples."""
    mask = sorted(os.sched_getaffinity(0))
    if len(mask) >= 4:
        pytest.skip("needs fewer than 4 cores (4 ranks must be crowded)")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(WAITING.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        _watched(lc.env, "1000", fork)
        proc = start_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path))
        try:
            files = [tmp_path / f"pid{r}" for r in range(4)]
            wait_for(lambda: all(f.exists() and f.read_text() for f in files), 60,
                     what="the ranks' pids")
            pids = [int(f.read_text()) for f in files]
            want = [{(os.SCHED_BATCH, frozenset({mask[r * len(mask) // 4]}))} for r in range(4)]
            wait_for(lambda: [_state(p) for p in pids] == want, 30,
                     what="every rank's threads in SCHED_BATCH on its core")
        finally:
            (tmp_path / "done").write_text("")
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "while other programs use less than 1000 of these cores" in err, err


def test_watcher_first_decides_the_state_ranks_start_in():
    """``Watcher.first``: quiet when the other programs' use over npurun's start-up is below
    half the threshold (the helpers it names counted as the job's), else the default state;
    either way it waits at least FIRST_WINDOW and then starts the sampling thread."""
    from launcher.agent import schedwatch
    mask = frozenset(os.sched_getaffinity(0))
    pol = schedwatch.Policy(4, len(mask), watch_batch=True, watch_bind=True, threshold=0.3)
    for load, quiet in ((0.1, True), (0.2, False), (None, False)):
        calls = []

        def probe(pids, born=()):
            calls.append((pids, born))
            return None if len(calls) == 1 else load
        w = schedwatch.Watcher(pol, mask, probe=probe, interval=30)
        try:
            t0 = time.monotonic()
            assert w.first([4242]) is quiet and w.quiet is quiet
            assert time.monotonic() - t0 >= schedwatch.FIRST_WINDOW * 0.9
            assert calls == [((os.getpid(),), ()),
                             (tuple(sorted({os.getpid(), 4242})), (4242,))], calls
            assert w.switches == int(quiet) and w._thread.is_alive()
        finally:
            w.close()


def test_a_process_started_since_the_last_sample_counts_as_the_jobs():
    """``CpuProbe``: a new pid voids the sample unless the caller says it started it since
    the previous one (then all its run time is the job's)."""
    from launcher.agent.schedwatch import CpuProbe
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        me = os.getpid()
        pids = tuple(sorted({me, child.pid}))
        probe = CpuProbe(os.sched_getaffinity(0))
        assert probe((me,)) is None                   # the baseline
        assert probe(pids) is None                    # a process the probe did not see start
        probe = CpuProbe(os.sched_getaffinity(0))
        probe((me,))
        assert probe(pids, (child.pid,)) is not None
    finally:
        child.stdin.close()
        child.wait(30)


FIRST = """
import json, os
with open(os.path.join({out!r}, f"first{os.environ['LOCAL_RANK']}"), "w") as f:
    json.dump([os.sched_getscheduler(0), sorted(os.sched_getaffinity(0))], f)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fork", ["1", "0"])
def test_crowded_ranks_on_a_quiet_machine_start_in_batch_on_their_cores(tmp_path, fork):
    """Through npurun, with a threshold no machine reaches: 4 ranks on 2 cores are in
    SCHED_BATCH on their core at their script's first line, forked or fresh interpreters
    (npurun decided before forking them: ``Watcher.first``)."""
    mask = sorted(os.sched_getaffinity(0))
    if len(mask) >= 4:
        pytest.skip("needs fewer than 4 cores (4 ranks must be crowded)")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(FIRST.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        _watched(lc.env, "1000", fork)
        res = run_npurun("--nproc-per-node", "4", str(script), env=lc.env, cwd=str(tmp_path),
                         timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in range(4):
        seen = json.loads((tmp_path / f"first{r}").read_text())
        assert seen == [os.SCHED_BATCH, [mask[r * len(mask) // 4]]], (r, seen)


LATE = """
import sys, threading
sys.stdin.readline()                      # the test says when: after the ranks are placed
threading.Thread(target=lambda: (print(threading.get_native_id(), flush=True),
                                 sys.stdin.read()), daemon=True).start()
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
def test_a_thread_a_rank_makes_later_moves_with_it():
    """A thread a rank starts after the watcher placed it (a stream worker made at first use)
    inherits the rank's state, is the watcher's, and moves at the next switch with the rest."""
    from launcher.agent import schedwatch
    mask = frozenset(os.sched_getaffinity(0))
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        pytest.skip("this test runs outside the default class")
    load = {"now": 0.0}
    pol = schedwatch.Policy(4, len(mask), watch_batch=True, watch_bind=True, threshold=0.3)
    rank = subprocess.Popen([sys.executable, "-c", LATE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    watcher = schedwatch.Watcher(pol, mask, probe=lambda pids: load["now"], interval=0.05)
    try:
        watcher.follow([(3, rank.pid)])
        quiet = (os.SCHED_BATCH, frozenset({max(mask)}))
        wait_for(lambda: _state(rank.pid) == {quiet}, 20, what="the rank quiet on its core")
        rank.stdin.write("go\n")
        rank.stdin.flush()
        late = int(rank.stdout.readline())
        wait_for(lambda: late in watcher._seen.get(rank.pid, ()), 20, what="the late thread seen")
        assert late not in watcher._users[rank.pid]
        load["now"] = 1.0 * len(mask)                  # every core busy: one left to the ranks
        wait_for(lambda: not watcher.quiet, 20, what="the busy state")
        busy = (os.SCHED_OTHER, watcher.cores)
        wait_for(lambda: _state(rank.pid) == {busy}, 20, what="every thread, the late one too")
    finally:
        watcher.close()
        rank.stdin.close()
        rank.wait(30)
        rank.stdout.close()
