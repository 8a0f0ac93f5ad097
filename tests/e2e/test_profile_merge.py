"""Profiling under npurun: every rank writes its trace, npurun merges them and prints where the
time went (a summary of at most ~40 lines that flags nothing in a healthy run), with
summary.json and op_summary.csv beside the traces."""
import csv
import json
import os
import re

import pytest

from tests.leakcheck import LeakCheck, run_npurun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(60)
def test_npurun_merges_the_ranks_traces(tmp_path):
    with LeakCheck() as lc:
        lc.env["NPUSIM_PROFILE_DIR"] = str(tmp_path)
        res = run_npurun("--nproc-per-node", "2", os.path.join(ROOT, "examples", "allreduce.py"),
                         env=lc.env, timeout=50)
    assert res.returncode == 0, res.stderr
    merged = json.loads((tmp_path / "trace_merged.json").read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert sorted(procs.values()) == ["rank 0", "rank 1"]
    colls = [e for e in merged if e.get("ph") == "X" and e.get("cat") == "collective"]
    assert {e["pid"] for e in colls} == set(procs) and all(e["name"] == "HcclAllReduce" for e in colls)
    assert "merged the traces of 2 rank(s)" in res.stderr
    assert "profile summary: 2 rank(s)" in res.stderr


def summary_of(stderr: str) -> list[str]:
    """The summary's lines: from its first line to the line naming the files it wrote."""
    lines = stderr.splitlines()
    first = next(i for i, x in enumerate(lines) if "npurun: profile summary" in x)
    last = next(i for i, x in enumerate(lines) if x.startswith("wrote ") and i > first)
    return lines[first:last + 1]


def check_profiled_job(res, d, world: int, steps: int, kernels: bool) -> list[str]:
    assert res.returncode == 0, res.stderr[-3000:]
    text = summary_of(res.stderr)
    print("\n".join(text))
    assert len(text) <= 40
    assert f"{world} rank(s), {steps - 1} step(s) in common (steps marked by " \
           "runtime.profiler.step())" in text[0]
    rows = {int(x.split()[0]): x for x in text[2:2 + world]}
    assert sorted(rows) == list(range(world))
    doc = json.loads((d / "summary.json").read_text())
    for r in doc["ranks"]:
        assert r["steps"] == steps - 1
        assert sum(r["parts_us"].values()) == pytest.approx(r["step_mean_us"], rel=0.05)
        assert r["peak_allocated_bytes"] > 0 and r["peak_reserved_bytes"] >= \
            r["peak_allocated_bytes"]
        if kernels:
            assert r["parts_us"]["compute"] > 0.2 * r["step_mean_us"]
    assert doc["fluctuations"] == [], doc["fluctuations"]
    assert "fluctuations: none" in "\n".join(text)
    assert re.search(r"slowest rank: \d", "\n".join(text))
    ops = {o["name"]: o for o in doc["operators"]}
    assert ops["HcclAllReduce"]["calls"] >= world * (steps - 1)
    rows = list(csv.DictReader(open(d / "op_summary.csv")))
    assert {int(r["rank"]) for r in rows} == set(range(world))
    merged = json.loads((d / "trace_merged.json").read_text())["traceEvents"]
    counters = {(e["pid"], e["name"]) for e in merged if e.get("ph") == "C"}
    assert {pid for pid, _ in counters} == set(range(world))
    return text


@pytest.mark.timeout(300)
def test_profiled_ddp_example_prints_a_summary_that_flags_nothing(tmp_path):
    d = tmp_path / "prof"
    with LeakCheck() as lc:
        res = run_npurun("--profile", str(d), "--nproc-per-node", "2",
                         os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "12",
                         env=lc.env, cwd=str(tmp_path), timeout=280)
    text = check_profiled_job(res, d, 2, 12, kernels=True)
    assert any(" backward_fc" in x and " kernel " in x for x in text)
    assert [p.name for p in d.glob("trace_pid*.json")] == []    # npurun itself is not traced


@pytest.mark.timeout(300)
def test_profiled_torch_ddp_example_prints_a_summary_that_flags_nothing(tmp_path):
    pytest.importorskip("torch.distributed", reason="torch is not installed: pip install -e "
                                                    "'.[torch]'")
    d = tmp_path / "prof"
    with LeakCheck() as lc:
        res = run_npurun("--profile", str(d), "--nproc-per-node", "2",
                         os.path.join(ROOT, "examples", "train_torch_ddp.py"), "--steps", "12",
                         env=lc.env, cwd=str(tmp_path), timeout=280)
    check_profiled_job(res, d, 2, 12, kernels=False)


INJECTED = """
import os, time
import numpy as np
import runtime, hccl
from runtime import profiler

def spin(x, ms):                      # burns CPU time: work, not a sleep
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass

rank = int(os.environ["RANK"])
runtime.set_device(int(os.environ["LOCAL_RANK"]))
comm = hccl.init_comm()
s = runtime.Stream()
x = runtime.to_device(np.zeros(1024, np.float32))
for it in range(21):
    for name, ms in (("embed", 4), ("attention", 6), ("mlp", 8), ("norm", 2)):
        if name == "mlp" and rank == 1:
            ms *= 1.3                 # rank 1: mlp 30 % slower at every step
        if name == "attention" and rank == 0 and it == 7:
            ms *= 5                   # rank 0: one attention call 5x slower, at step 7
        runtime.launch(spin, x, ms, stream=s, name=name)
    comm.all_reduce(x, stream=s)
    profiler.step()
    s.synchronize()
comm.destroy()
"""


@pytest.mark.timeout(200)
def test_injected_slow_call_and_slow_rank_are_flagged_through_npurun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(INJECTED)
    d = tmp_path / "prof"
    with LeakCheck() as lc:
        res = run_npurun("--profile", str(d), "--nproc-per-node", "2", str(script),
                         env=lc.env, cwd=str(tmp_path), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    print("\n".join(summary_of(res.stderr)))
    flags = json.loads((d / "summary.json").read_text())["fluctuations"]
    got = {(f["what"], f["rank"], f["name"], f["step"]) for f in flags}
    assert got == {("rank", 1, "mlp", None), ("call", 0, "attention", 7)}, flags
    assert all(f["site"].startswith(f"{script}:") for f in flags)
