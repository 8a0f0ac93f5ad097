"""The examples, end to end through the real ``npurun`` CLI: data-parallel training with --check
and --profile (gradient all-reduce overlapping backward), multi-stream overlap, and allreduce."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.leakcheck import LeakCheck, run_npurun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)


@pytest.mark.timeout(90)
def test_train_ddp_check_passes_on_three_ranks(tmp_path):
    """Odd world size: the 1/3 gradient scaling is inexact, the check still holds to 1e-6."""
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", example("train_ddp.py"), "--steps", "6",
                         "--batch", "192", "--hidden", "64", "--bucket-mb", "0.02", "--check",
                         env=lc.env, cwd=str(tmp_path), timeout=80)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    m = re.search(r"\[rank 0\]: CHECK PASS: 3 replicas bitwise identical; "
                  r"max\|ddp - single\| / max\|single\| = (\S+) \(limit 1e-06\)", out)
    assert m, out
    assert float(m.group(1)) <= 1e-6
    assert re.search(r"\d+ gradient buckets", out) and "3 ranks x 64 samples" in out
    assert re.search(r"final loss \d+\.\d+, held-out accuracy [\d.]+%", out), out
    assert re.search(r"waiting for communication [\d.]+ s \([\d.]+%\)", out), out
    # progress goes to rank 0's stderr as plain lines (not a tty under npurun)
    assert "[rank 0]: step 6/6  loss" in res.stderr, res.stderr
    assert "[rank 1]: step" not in res.stderr


def _tracks(trace: dict) -> tuple[dict, dict]:
    """(pid, tid) -> track name, and (pid, tid) -> list of X events."""
    names, spans = {}, {}
    for e in trace["traceEvents"]:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[key] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.setdefault(key, []).append(e)
    return names, spans


def _overlaps(trace: dict, pid: int) -> int:
    """Pairs (AllReduce on the comm track, backward kernel on the compute track) that overlap."""
    names, spans = _tracks(trace)
    mine = {k: v for k, v in spans.items() if k[0] == pid}
    comm = [k for k, v in mine.items() if any(e["name"] == "HcclAllReduce" for e in v)]
    compute = [k for k, v in mine.items() if any(e["name"].startswith("backward_fc") for e in v)]
    assert len(comm) == 1 and len(compute) == 1 and comm != compute, (comm, compute)
    assert names[comm[0]].startswith("NPU") and names[compute[0]].startswith("NPU")
    ars = [e for e in mine[comm[0]] if e["name"] == "HcclAllReduce"]
    assert all(e["cat"] == "collective" for e in ars)
    bwd = [e for e in mine[compute[0]] if e["name"].startswith("backward_")]
    return sum(1 for a in ars for b in bwd
               if a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"])


@pytest.mark.timeout(90)
def test_train_ddp_profile_shows_allreduce_overlapping_backward(tmp_path):
    prof = tmp_path / "prof"
    steps = 6
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "2", example("train_ddp.py"), "--steps", str(steps),
                         "--batch", "256", "--hidden", "256", "--bucket-mb", "1",
                         "--profile", str(prof), env=lc.env, cwd=str(tmp_path),
                         timeout=80)
    assert res.returncode == 0, res.stdout + res.stderr
    buckets = int(re.search(r"(\d+) gradient buckets", res.stdout).group(1))
    assert buckets >= 3
    traces = {r: json.loads((prof / f"trace_rank{r}.json").read_text()) for r in (0, 1)}
    for r, trace in traces.items():
        _, spans = _tracks(trace)
        ars = [e for v in spans.values() for e in v if e["name"] == "HcclAllReduce"]
        assert len(ars) == buckets * steps    # one all_reduce per bucket per step
        assert {e["pid"] for e in ars} == {r}
        assert _overlaps(trace, r) >= 1, f"rank {r}: no AllReduce overlaps a backward kernel"
    merged_path = prof / "trace_merged.json"
    if merged_path.exists():                  # written by the example (and by npurun)
        merged = json.loads(merged_path.read_text())
        procs = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "process_name"}
        assert procs == {0: "rank 0", 1: "rank 1"}
        for r in (0, 1):
            assert _overlaps(merged, r) >= 1


@pytest.mark.timeout(60)
def test_multistream_overlap_prints_times_and_speedup(tmp_path):
    with LeakCheck() as lc:
        res = subprocess.run([sys.executable, example("multistream_overlap.py"), "--chunks", "6",
                              "--chunk-mb", "1", "--repeat", "2"], env=lc.env, cwd=str(tmp_path),
                             capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stdout + res.stderr
    serial = re.search(r"one stream .*:\s+([\d.]+) ms", res.stdout)
    overlap = re.search(r"copy stream \+ compute stream with events:\s+([\d.]+) ms", res.stdout)
    speedup = re.search(r"speed-up: ([\d.]+)x \(best of 2 runs each; results identical\)",
                        res.stdout)
    assert serial and overlap and speedup, res.stdout
    s, o = float(serial.group(1)), float(overlap.group(1))
    assert s > 0 and o > 0
    # the times print rounded to 0.1 ms and the speed-up to 0.01
    low, high = (s - 0.05) / (o + 0.05) - 0.005, (s + 0.05) / (o - 0.05) + 0.005
    assert low <= float(speedup.group(1)) <= high


@pytest.mark.timeout(60)
def test_allreduce_example_every_rank_prints_the_sum(tmp_path):
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", example("allreduce.py"), env=lc.env,
                         cwd=str(tmp_path), timeout=50)
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(3):   # rank r sends [r, r+1, r+2, r+3]: sums are 3 + 3k
        assert f"[rank {r}]: rank {r}/3: all_reduce(SUM) = [3.0, 6.0, 9.0, 12.0]" in res.stdout
