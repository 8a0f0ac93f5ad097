"""hccl.bench end to end through npurun: the peers' iteration policy (--target-s) and -c 1."""
from __future__ import annotations

import json

import pytest

from tests.leakcheck import LeakCheck, run_npurun


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce", "all_to_all"])
def test_bench_fills_the_target_time_and_checks_every_size(tmp_path, op):
    out = tmp_path / "rows.json"
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", "-m", "hccl.bench", "-o", op, "--sizes",
                         "1K,96K", "--timing", "median", "--target-s", "0.05", "-w", "3",
                         "-c", "1", "--json", str(out), env=lc.env, cwd=str(tmp_path),
                         timeout=100)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 2
    for r in rows:
        assert r["wrong"] == 0 and r["coll"] == op and r["world"] == 3
        assert 5 <= r["iters"] <= 20000 and r["time_us"] > 0 and r["wall_us"] > 0
    assert "iters to fill 0.05 s" in res.stdout
