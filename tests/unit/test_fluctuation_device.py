"""Fluctuations judged by device time (launcher/profile/fluctuation.py): the time a task held its
stream less its worker's run delay. A delay that burns no CPU is the operator's; the scheduler's
share is not. And the profiler records each task's run delay from the worker's schedstat."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from launcher.profile import fluctuation, parts as profparts, summary as profsummary

SITE = "job.py:23 in <module>"
STEPS = np.arange(1, 21)


def _calls(rank, name, us, delay=0.0, cpu_share=0.9, t0=None):
    t = np.full(20, us) * np.linspace(0.98, 1.02, 20)
    return fluctuation.OpCalls(rank, name, "kernel", t.copy(), t * cpu_share, STEPS.copy(),
                               [SITE] * 20, t0, np.full(20, delay))


def test_a_call_that_waits_without_cpu_is_the_operators():
    c = _calls(1, "attention", 6000.0)
    c.time[8] += 60000.0                 # slept 60 ms on the device: no CPU, no run delay
    (f,) = fluctuation.slow_calls(c)
    assert (f.rank, f.step, f.site, f.measure) == (1, 9, SITE, "device")
    assert f.time_us == pytest.approx(66000, rel=0.02) and f.ratio > 10
    # the CPU rule, without run delays, calls that no work (the former blind spot)
    c.delay = None
    assert fluctuation.slow_calls(c) == []


def test_a_short_stall_without_cpu_is_not_flagged_but_the_same_excess_as_work_is():
    # a worker also sleeps while it waits for the GIL: up to 24 ms measured in healthy runs
    c = _calls(0, "norm", 2000.0)
    c.time[7] += 12000.0
    assert fluctuation.slow_calls(c) == []
    c.cpu[7] += 12000.0                  # the same excess, spent computing: work
    (f,) = fluctuation.slow_calls(c)
    assert (f.step, f.measure) == (8, "device")
    c.cpu[7] -= 12000.0
    c.time[7] += fluctuation.STALL_US    # a stall beyond STALL_US is the operator's
    assert [f.step for f in fluctuation.slow_calls(c)] == [8]


def test_a_call_that_waited_for_a_core_is_the_schedulers():
    c = _calls(0, "mlp", 8000.0, delay=100.0)
    c.time[4] += 60000.0
    c.delay[4] += 60000.0                # all of it in the run queue
    assert fluctuation.slow_calls(c) == []
    assert fluctuation.device_time(c)[4] == pytest.approx(c.time[4] - c.delay[4])


def test_neighbours_slower_on_the_device_excuse_a_call_by_device_time():
    t0 = np.arange(60, dtype=float) * 1e4
    ops = [_calls(0, n, us, t0=t0[k::3]) for k, (n, us) in
           enumerate((("embed", 4000.0), ("attention", 6000.0), ("mlp", 8000.0)))]
    for c in ops:                        # the whole rank ran 3x slower around step 7 (a slow core)
        c.time[5:9] *= 3.0
    assert [fluctuation.slow_calls(c, fluctuation.ABS_FLOOR_US, f)
            for c, f in zip(ops, fluctuation.local_factors(ops))] == [[], [], []]


def test_the_rank_rule_judges_device_times():
    ranks = [_calls(0, "mlp", 8000.0, delay=8000.0), _calls(1, "mlp", 8000.0)]
    ranks[0].time += 8000.0              # rank 0 waited for a core as long as it ran
    assert fluctuation.slow_ranks(ranks, 20) == []       # twice the wall time: the scheduler's
    ranks[1].time *= 1.3                 # 30 % longer on the device, same CPU: a latency
    (f,) = fluctuation.slow_ranks(ranks, 20)
    assert (f.rank, f.measure) == (1, "device") and f.ratio == pytest.approx(1.3, rel=0.03)


def _trace(path, rank, sleep_at=None, host_wait=0.0):
    ev = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
           "args": {"name": f"rank {rank}"}}]
    t, task = 1.7e15, 0
    for it in range(21):
        for name, us in (("embed", 4000.0), ("attention", 6000.0), ("mlp", 8000.0)):
            d = us * (1 + 0.01 * ((it * 7 + rank) % 3))
            delay = 0.3 * d                  # waited for a core: in wall time, not on device
            if sleep_at == it and name == "attention":
                d += 60000.0
            task += 1
            ev.append({"name": name, "cat": "kernel", "ph": "X", "pid": rank, "tid": 1,
                       "ts": t, "dur": d, "args": {"site": SITE, "task": task,
                                                   "cpu_us": 0.6 * us, "delay_us": delay}})
            t += d
        t += 500.0 + host_wait               # the host, descheduled this long between tasks
        ev.append({"name": "step mark", "cat": "step mark", "ph": "i", "s": "p", "pid": rank,
                   "tid": 0, "ts": t, "args": {"mark": it, "issued": {"1": task},
                                               "delay_us": it * host_wait}})
        t += 500.0
    path.write_text(json.dumps({"traceEvents": ev}))
    return str(path)


def test_the_summary_flags_the_sleeping_call_and_names_it_as_the_slowest_ranks_cause(tmp_path):
    paths = [_trace(tmp_path / "trace_rank0.json", 0),
             _trace(tmp_path / "trace_rank1.json", 1, sleep_at=9)]
    rt = profparts.load(paths[1])
    assert np.isfinite(rt.delay).all()
    doc = profsummary.summarize(paths)
    assert [(f["what"], f["rank"], f["name"], f["step"], f["site"], f["measure"])
            for f in doc["fluctuations"]] == [("call", 1, "attention", 9, SITE, "device")]
    s = doc["slowest"]
    assert s["rank"] == 1 and s["cause"]["name"] == "attention"
    text = "\n".join(profsummary.render(doc))
    assert "rank 1 step 9: kernel attention took" in text and "on the device" in text
    assert "most in kernel attention" in text


@pytest.mark.timeout(60)
def test_the_profiler_records_the_run_delay_and_leaves_it_out_of_device_time(tmp_path):
    if not os.path.exists("/proc/thread-self/schedstat"):
        pytest.skip("no per-thread schedstat in this kernel")
    import runtime
    from runtime import profiler
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})"
                             "\nprint('spinning', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        # the kernel below must share the core with a program already spinning: its start-up
        # (~20-50 ms of an interpreter's) once overlapped most of the 40 ms and left ~3 ms delay
        assert busy.stdout.readline().strip() == "spinning"
        os.sched_setaffinity(0, {cpu})           # the worker thread, created below, inherits it
        runtime.set_device(0)
        s = runtime.Stream()
        trace = tmp_path / "trace_rank0.json"

        def spin(ms):                            # 40 ms of CPU on a core shared with `busy`
            end = time.thread_time() + ms / 1e3
            while time.thread_time() < end:
                pass

        def sleepy(ms):
            time.sleep(ms / 1e3)
        with profiler.profile(str(trace)):
            runtime.launch(spin, 40, stream=s, name="spin")
            runtime.launch(sleepy, 30, stream=s, name="sleepy")
        s.destroy()
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait(30)
        busy.stdout.close()
        runtime.reset_device(0)
    ev = {e["name"]: e for e in json.loads(trace.read_text())["traceEvents"]
          if e.get("ph") == "X"}
    sp, sl = ev["spin"], ev["sleepy"]
    a = sp["args"]
    assert a["cpu_us"] >= 40000 and a["delay_us"] > 10000, a       # shared the core
    # the rest is CPU time, within a stall (a GIL hand-off, stolen time: docs/profiling.md)
    assert 0.9 * a["cpu_us"] <= sp["dur"] - a["delay_us"] <= a["cpu_us"] + 15000, (sp["dur"], a)
    b = sl["args"]
    assert sl["dur"] >= 30000 and b["cpu_us"] < 5000 and b["delay_us"] < 0.5 * sl["dur"], sl


def test_the_host_time_competes_less_the_host_threads_waits_for_a_core(tmp_path):
    # rank 1's host was descheduled 4 ms a step (its run delay, recorded at the marks) and its
    # attention slept 60 ms once (3 ms a step): the sleep is named, not the host
    paths = [_trace(tmp_path / "trace_rank0.json", 0),
             _trace(tmp_path / "trace_rank1.json", 1, sleep_at=9, host_wait=4000.0)]
    rt = profparts.load(paths[1])
    assert rt.host_delays() == pytest.approx(np.full(20, 4000.0))
    s = profsummary.summarize(paths)["slowest"]
    assert s["rank"] == 1 and s["cause"]["name"] == "attention", s
    # without the marks' run delays the host's 4 ms a step would be named
    for p in paths:
        doc = json.loads(open(p).read())
        for e in doc["traceEvents"]:
            if e.get("name") == "step mark":
                e["args"].pop("delay_us", None)
        open(p, "w").write(json.dumps(doc))
    assert profsummary.summarize(paths)["slowest"]["cause"]["kind"] == "host"


def test_the_floor_shrinks_with_device_time_when_load_stretches_the_steps():
    # the injected job under load: rank 1's mlp does 2.4 ms more a step, the steps took 130 ms
    # of wall time (floor 2.6 ms), each call 3.5 times its device time
    ranks = [_calls(0, "mlp", 8000.0, delay=20000.0), _calls(1, "mlp", 10400.0, delay=26000.0)]
    for c in ranks:
        c.time += c.delay
    floor = fluctuation.floor_for(130000.0)
    assert floor == pytest.approx(2600.0)
    (f,) = fluctuation.slow_ranks(ranks, 20, floor)
    assert (f.rank, f.measure) == (1, "device") and f.ratio == pytest.approx(1.3, rel=0.03)
