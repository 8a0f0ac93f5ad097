"""runtime.profiler's records for the summary: step marks, ranges, call sites, CPU times, memory
counters and peaks; one process's recording summarized."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import runtime
from runtime import profiler
from launcher.profile import summary as profsummary

pytestmark = pytest.mark.timeout(60)


def busy(x, ms):
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass


def test_steps_sites_cpu_ranges_and_memory_are_recorded(device, tmp_path):
    path = tmp_path / "trace_rank0.json"
    s = runtime.Stream()
    x = runtime.zeros(1024, np.float32)
    with runtime.profile(str(path)):
        profiler.step()                                     # mark 0: set-up ends
        for i in range(3):
            with profiler.range("forward"):
                runtime.launch(busy, x, 2, stream=s, name="spin")   # the site: this line
            keep = runtime.zeros(1 << 20, np.uint8)        # 1 MiB more allocated
            s.synchronize()
            profiler.step()
        del keep
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    marks = [e for e in ev if e.get("name") == "step mark"]
    assert [m["args"]["mark"] for m in marks] == [0, 1, 2, 3]
    assert [m["args"]["issued"][str(s.id)] for m in marks] == [0, 1, 2, 3]
    spins = [e for e in ev if e.get("name") == "spin"]
    assert len(spins) == 3 and [e["args"]["task"] for e in spins] == [1, 2, 3]
    assert all(e["args"]["site"].endswith("in test_steps_sites_cpu_ranges_and_memory_are_recorded")
               and "test_profsummary_profiler.py:" in e["args"]["site"] for e in spins)
    assert all(1500 <= e["args"]["cpu_us"] <= e["dur"] + 100 for e in spins)
    assert [e["name"] for e in ev if e.get("cat") == "range"] == ["forward"] * 3
    assert [e["name"] for e in ev if e.get("cat") == "step"] == ["step 1", "step 2", "step 3"]
    dev = runtime.get_device()
    # this device's curve: devices that earlier tests of this process used may change their
    # pools while this trace records (seen after the torch tests), and their curves count too
    counters = [e for e in ev if e.get("ph") == "C"]
    mem = [e for e in counters if e["name"] == f"NPU{dev} memory"]
    assert mem and all(e["name"].startswith("NPU") and e["name"].endswith(" memory")
                       for e in counters)
    alloc = [e["args"]["allocated"] for e in mem]
    assert max(alloc) - min(alloc) >= 1 << 20
    assert all(e["args"]["reserved"] >= e["args"]["allocated"] for e in mem)
    peak = doc["npusim"]["memory_peak"][str(dev)]
    assert peak["allocated"] >= max(alloc) and peak["reserved"] >= peak["allocated"]

    summary = profsummary.summarize([str(path)])
    (r,) = summary["ranks"]
    assert r["steps"] == 3 and summary["steps"]["source"] == "marks"
    assert r["peak_allocated_bytes"] == peak["allocated"]
    assert sum(r["parts_us"].values()) == pytest.approx(r["step_mean_us"], rel=1e-9)
    assert r["parts_us"]["compute"] >= 1500
    (op,) = [o for o in summary["operators"] if o["name"] == "spin"]
    assert op["calls"] == 3 and op["p50_us"] >= 1500


def test_marks_and_ranges_cost_nothing_without_a_recording(device):
    assert not profiler.active()
    profiler.step()
    with profiler.range("idle"):
        pass
