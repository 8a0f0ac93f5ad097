"""The stress harness's short profile: a dozen fresh npurun jobs at worlds 3 and 4, shared memory
on and off, each starting a collective right after init; no hang, no wrong result, no leak.

Plus the harness's own logic without processes: the case matrix straddles every threshold, every
collective is planned, and a job's output is classified as the table counts it.
"""
import json
import subprocess
import sys

import pytest

from benchmarks import ROOT, stress
from tests.leakcheck import LeakCheck

JOBS = 12     # the suite's share; the full harness: docs/reliability.md


def _totals(stdout: str) -> dict:
    """The table's 'all' row as {column: value}; {} when the harness printed no table."""
    rows = {line.split()[0]: line.split() for line in stdout.splitlines() if line.split()[:1]
            in (["world"], ["all"])}
    if set(rows) != {"world", "all"}:
        return {}
    return dict(zip(rows["world"][-6:], map(float, rows["all"][-6:])))


@pytest.mark.timeout(900)
def test_short_stress_has_no_hang_and_no_wrong_result(tmp_path):
    # HCCL_EXEC_TIMEOUT 30 s: a loaded machine is slow, but never 30 s without progress in a wait;
    # a real hang still ends its job at 30 s (a rank stuck outside a wait: the 360 s wall clock).
    with LeakCheck(grace=10) as leaks:
        p = subprocess.run([sys.executable, "-m", "benchmarks.stress", "--short", "--jobs", str(JOBS),
                            "--worlds", "3,4", "--exec-timeout", "30", "--log-dir", str(tmp_path)],
                           env=leaks.env, cwd=ROOT, capture_output=True, text=True, timeout=850)
    logs = "".join(f"\n--- {f.name}\n{f.read_text()[-4000:]}" for f in sorted(tmp_path.iterdir()))
    totals = _totals(p.stdout)
    assert totals, p.stdout + p.stderr[-3000:]
    assert totals["jobs"] == JOBS and totals["cases"] >= 3 * JOBS, p.stdout + p.stderr[-3000:]
    assert (totals["hangs"], totals["wrong"]) == (0, 0), p.stdout + logs
    assert totals["errors"] == 0 and p.returncode == 0, p.stdout + logs


@pytest.mark.parametrize("world", [2, 3, 5])
def test_case_matrix_straddles_every_threshold(world):
    matrix = stress.case_matrix(world, short=True)
    for op in stress.OPS:
        sizes = {stress._nbytes(s) for s in matrix if s.startswith(op + ":")}
        if op == "barrier":
            assert sizes == {0}
            continue
        for t in (stress.ONE_SHOT, stress.SHM_MIN, stress.SLICE_SMALL, stress.STAR):
            assert {t - 8, t, t + 8} <= sizes, (op, t, sorted(sizes))
    allreduce = [s.split(":") for s in matrix if s.startswith("all_reduce:")]
    assert {f for *_, f in allreduce} == {"i", "o"}
    # a ring chunk (count / world) at the shared-memory threshold too
    assert any(int(c) * stress.ITEMSIZE[d] == world * stress.SHM_MIN for _, d, c, _, _ in allreduce)


def test_plan_starts_most_jobs_with_a_shared_memory_sized_collective():
    jobs = stress.plan(40, [3, 4], ["on", "off"], 3, short=True)
    assert len(jobs) == 40 and {j[0] for j in jobs} == {3, 4}
    assert {j[3]["NPUSIM_SHM"] for j in jobs} == {"0", "1"}
    assert {j[2] for j in jobs} == {p for p, _ in stress.PROFILES}
    firsts = [stress._nbytes(j[4][0]) for j in jobs]
    assert sum(f >= stress.SHM_MIN for f in firsts) == 32
    assert all(len(j[4]) == 3 for j in jobs)
    assert len({s.split(":")[0] for j in jobs for s in j[4]}) == len(stress.OPS)


def _out(*reports):
    return "\n".join(f"[rank {r['rank']}]: STRESS-RESULT {json.dumps(r)}" for r in reports)


def test_classify_counts_hangs_wrong_results_and_errors():
    ok = [{"rank": r, "checked": 3, "wrong": []} for r in range(3)]
    assert stress.classify(_out(*ok), 0, False, 3) == "ok"
    assert stress.classify(_out(*ok), 0, True, 3) == "hang"           # killed by the wall clock
    assert stress.classify(_out(*ok[:2]), 1, False, 3) == "error"     # a rank never reported
    timeout = dict(ok[1], error={"type": "TaskError[HcclTimeoutError]", "timeout": True})
    assert stress.classify(_out(ok[0], timeout, ok[2]), 1, False, 3) == "hang"
    other = dict(ok[1], error={"type": "RemoteRankError", "timeout": False})
    assert stress.classify(_out(ok[0], other, ok[2]), 1, False, 3) == "error"
    wrong = dict(ok[2], wrong=[{"case": 0, "elements": 5}])
    assert stress.classify(_out(ok[0], ok[1], wrong), 1, True, 3) == "wrong"


def _reference(arrays, redop, dt):
    """The reduction computed another way: in int64, then wrapped to the dtype (as the device)."""
    import numpy as np
    wide = np.stack(arrays).astype(np.int64)
    fn = {"SUM": np.sum, "PROD": np.prod, "MAX": np.max, "MIN": np.min}[redop]
    return fn(wide, axis=0).astype(dt)


@pytest.mark.parametrize("index", range(4))  # the case index picks SUM, PROD, MAX, MIN
@pytest.mark.parametrize("spec", ["reduce_scatter:int8:5:0:o", "all_to_all:uint16:3:1:o",
                                  "all_reduce:int64:4:0:i", "reduce:int32:6:2:o",
                                  "all_reduce:int8:300:0:o", "sendrecv:int8:7:0:o",
                                  "broadcast:int32:2:1:o", "all_gather:uint16:4:0:o"])
def test_expected_results_follow_the_collective_definitions(spec, index):
    import numpy as np
    world, salt = 3, 11
    op, dtype, count, root, _, redop = stress._parse(spec, index)
    dt = np.dtype(dtype)
    n = count * world if op in ("reduce_scatter", "all_to_all") else count
    ins = [stress._inputs(r, n, dt, salt) for r in range(world)]
    assert len({a.tobytes() for a in ins}) == world  # ranks' inputs differ, so a mix-up shows
    for rank in range(world):
        got = stress._expected(world, rank, spec, index, salt)
        if op == "reduce_scatter":
            want = _reference(ins, redop, dt)[rank * count:(rank + 1) * count]
        elif op == "all_to_all":
            want = np.concatenate([ins[r][rank * count:(rank + 1) * count] for r in range(3)])
        elif op == "all_reduce" or (op == "reduce" and rank == root):
            want = _reference(ins, redop, dt)
        elif op == "reduce":
            want = None
        elif op == "sendrecv":
            want = ins[(rank - 1) % world]
        elif op == "all_gather":
            want = np.concatenate(ins)
        else:
            want = ins[root]
        if want is None:
            assert got is None
        else:
            assert got.dtype == dt
            np.testing.assert_array_equal(got, want)
