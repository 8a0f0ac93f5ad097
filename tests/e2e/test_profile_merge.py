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
