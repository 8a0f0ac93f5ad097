"""NPUSIM_PROFILE_DIR under npurun: every rank writes its trace and npurun merges them."""
import json
import os

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
