"""launcher.profile.summary on synthetic traces of known content: the step split adds up, a slow
call and a slow rank are found (rank, step, call site), a healthy trace flags nothing; the files."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from launcher.profile import fluctuation, parts as profparts, summary as profsummary

pytestmark = pytest.mark.timeout(30)
T0 = 1_700_000_000_000_000.0        # wall-clock microseconds, as the runtime stamps them
SITE = "train.py:12 in step"
KERNELS = (("forward", 8000.0), ("matmul", 10000.0), ("backward", 9000.0), ("update", 3000.0))
# name, wall us (CPU time: 90 %)


def job(tmp_path, world=3, steps=20, *, slow=None, slow_rank=None, slow_core=None, late=None,
        transfer=3000.0, host=2000.0, marks=True, noise=0.03, seed=0):
    """Per-rank trace files of a synthetic data-parallel job, and what each rank did per step.

    Every iteration: the KERNELS one after the other on stream 1, then an AllReduce on stream 2
    that starts when the rank's kernels end and ends ``transfer`` us after the last rank started
    it; then ``host`` us with nothing running, in the middle of which the host marks the step.
    ``slow=(rank, step, factor)`` makes matmul that much slower in that one step (wall and CPU);
    ``slow_rank=(rank, factor)`` on every step; ``slow_core=(rank, step, factor)``: every kernel
    of that rank in that step (a core that ran slower then); ``late=(rank, us)``: the rank's
    host code runs ``us`` longer before its kernels at every step. Returns (paths, truth):
    truth[rank][step] = {"compute", "transfer", "peer_wait", "host", "step"} in us.
    """
    rng = np.random.default_rng(seed)
    events = {r: [] for r in range(world)}
    issued = {r: {1: 0, 2: 0} for r in range(world)}
    truth = {r: {} for r in range(world)}
    t = T0
    for it in range(steps + 1):                 # iteration 0 is set-up (before the first mark)
        arrive, compute = {}, {}
        for r in range(world):
            s = t + (late[1] if late and late[0] == r else 0.0)
            c0 = s
            for name, us in KERNELS:
                d = us * (1 + noise * rng.uniform(-1, 1))
                if name == "matmul" and slow and slow[0] == r and slow[1] == it:
                    d *= slow[2]
                if name == "matmul" and slow_rank and slow_rank[0] == r:
                    d *= slow_rank[1]
                if slow_core and slow_core[0] == r and slow_core[1] == it:
                    d *= slow_core[2]
                issued[r][1] += 1
                events[r].append({"name": name, "cat": "kernel", "ph": "X", "pid": r, "tid": 1,
                                  "ts": s, "dur": d, "args": {"site": SITE, "task": issued[r][1],
                                                              "cpu_us": 0.9 * d}})
                s += d
            arrive[r], compute[r] = s, s - c0
        last = max(arrive.values())
        end = last + transfer
        for r in range(world):
            issued[r][2] += 1
            events[r].append({"name": "HcclAllReduce", "cat": "collective", "ph": "X", "pid": r,
                              "tid": 2, "ts": arrive[r], "dur": end - arrive[r],
                              "args": {"comm": "world", "seq": it + 1, "count": 4, "bytes": 16,
                                       "site": "train.py:20 in step", "task": issued[r][2],
                                       "cpu_us": 100.0}})
        nxt = end + host
        for r in range(world):
            if marks:
                events[r].append({"name": "step mark", "cat": "step mark", "ph": "i", "s": "p",
                                  "pid": r, "tid": 0, "ts": end + host / 2,
                                  "args": {"mark": it, "issued": {str(k): v for k, v in
                                                                  issued[r].items()}}})
            lateness = late[1] if late and late[0] == r else 0.0
            truth[r][it] = {"compute": compute[r], "transfer": transfer,
                            "peer_wait": last - arrive[r], "host": host + lateness,
                            "step": nxt - t}
        t = nxt
    paths = []
    for r in range(world):
        meta = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                 "args": {"name": f"rank {r}"}},
                {"name": "C", "ph": "C", "pid": r, "tid": 0, "ts": T0,
                 "args": {"allocated": 0, "reserved": 0}}]
        mem = [{"name": "NPU0 memory", "ph": "C", "pid": r, "tid": 0, "ts": T0 + i,
                "args": {"allocated": a, "reserved": 2 << 20}}
               for i, a in enumerate((1 << 20, (3 + r) << 20, 1 << 20))]
        p = tmp_path / f"trace_rank{r}.json"
        p.write_text(json.dumps({"traceEvents": meta + mem + events[r]}))
        paths.append(str(p))
    return paths, truth


def test_the_split_adds_up_to_the_step_and_matches_what_happened(tmp_path):
    paths, truth = job(tmp_path, late=(1, 4000.0))
    doc = profsummary.summarize(paths)
    assert doc["steps"] == {"source": "marks", "common": 20}
    for r in doc["ranks"]:
        assert r["steps"] == 20 and len(r["step_us"]) == 20
        parts = r["parts_us"]
        # the parts sum to the step time (by construction: to float rounding)
        assert sum(parts.values()) == pytest.approx(r["step_mean_us"], rel=1e-9)
        # ... and each part is what the synthetic job did, within 5 %
        want = {k: np.mean([truth[r["rank"]][s][k] for s in range(1, 21)])
                for k in ("compute", "transfer", "peer_wait", "host", "step")}
        assert r["step_mean_us"] == pytest.approx(want["step"], rel=0.01)
        for k in ("compute", "transfer", "host"):
            assert parts[k] == pytest.approx(want[k], rel=0.05), (r["rank"], k)
        assert parts["peer_wait"] == pytest.approx(want["peer_wait"], rel=0.05, abs=50)
        assert parts["copy"] == 0
    # rank 1 starts 4 ms late: the others wait about that long, rank 1 itself hardly
    waits = [r["parts_us"]["peer_wait"] for r in doc["ranks"]]
    assert waits[1] < 1000 and waits[0] > 3000 and waits[2] > 3000
    assert doc["slowest"]["rank"] == 1
    assert doc["slowest"]["cause"]["name"] == "host time between tasks"
    assert doc["slowest"]["excess_us"] == pytest.approx(4000, rel=0.25)


def test_a_kernel_5x_slower_at_one_step_of_one_rank_is_the_flagged_call(tmp_path):
    paths, _ = job(tmp_path, slow=(2, 7, 5.0))
    doc = profsummary.summarize(paths)
    (f,) = doc["fluctuations"]
    assert (f["what"], f["rank"], f["step"], f["name"], f["site"]) == \
        ("call", 2, 7, "matmul", SITE)
    assert f["ratio"] == pytest.approx(5.0, rel=0.1)
    text = "\n".join(profsummary.render(doc))
    assert f"rank 2 step 7: kernel matmul took" in text and SITE in text


def test_a_rank_whose_kernel_is_20_percent_slower_every_step_is_the_slow_rank(tmp_path):
    paths, _ = job(tmp_path, slow_rank=(1, 1.2))
    doc = profsummary.summarize(paths)
    s = doc["slowest"]
    assert s["rank"] == 1 and (s["cause"]["kind"], s["cause"]["name"]) == ("kernel", "matmul")
    assert s["cause"]["excess_us_per_step"] == pytest.approx(2000, rel=0.2)
    assert s["excess_us"] == pytest.approx(2000, rel=0.2)
    (f,) = doc["fluctuations"]
    assert (f["what"], f["rank"], f["name"], f["site"]) == ("rank", 1, "matmul", SITE)
    assert f["steps"] == [1, 20] and f["ratio"] == pytest.approx(1.2, rel=0.05)
    text = "\n".join(profsummary.render(doc))
    assert "slowest rank: 1" in text and "most in kernel matmul" in text


def test_a_healthy_job_flags_nothing(tmp_path):
    for seed in range(5):
        paths, _ = job(tmp_path, noise=0.1, seed=seed)
        assert profsummary.summarize(paths)["fluctuations"] == [], seed


@pytest.mark.parametrize("factor", [2.6, 3.0])
def test_a_core_slower_for_a_step_flags_no_operator_but_an_operator_slow_alone_is_flagged(
        tmp_path, factor):
    # every kernel of rank 1 runs factor x slower in step 7, wall and CPU time: the core, not
    # an operator; the same factor on matmul alone, beside normal neighbours, is flagged
    paths, _ = job(tmp_path, slow_core=(1, 7, factor))
    assert profsummary.summarize(paths)["fluctuations"] == []
    paths, _ = job(tmp_path, slow=(1, 7, factor))
    (f,) = profsummary.summarize(paths)["fluctuations"]
    assert (f["what"], f["rank"], f["name"], f["step"]) == ("call", 1, "matmul", 7)
    assert f["ratio"] == pytest.approx(factor, rel=0.1)
    # judged without the neighbours, the slow core's step is flagged: what the factors fix
    paths, _ = job(tmp_path, slow_core=(1, 7, factor))
    doc = profsummary.summarize(paths)
    traces = [profparts.load(p) for p in paths]
    profparts.analyze(traces)
    calls = profsummary._op_calls(traces[1], 20)
    plain = [f for c in calls.values() for f in fluctuation.slow_calls(c)]
    assert {f.op for f in plain} >= {"matmul", "forward", "backward"} and doc["fluctuations"] == []


def test_local_factors_are_the_neighbours_median_of_other_operators():
    t0 = np.arange(40, dtype=float) * 10.0
    a = fluctuation.OpCalls(0, "a", "kernel", np.full(20, 100.0), np.full(20, 90.0),
                            np.arange(20), [None] * 20, t0[0::2])
    b = fluctuation.OpCalls(0, "b", "kernel", np.full(20, 200.0), np.full(20, 180.0),
                            np.arange(20), [None] * 20, t0[1::2])
    b.time[8:12] *= 3.0                     # b slow around a's calls 8..11
    b.cpu[8:12] *= 3.0
    fa, fb = fluctuation.local_factors([a, b])
    assert fa[0][0] == 1.0 and fb[0][0] == 1.0
    assert fa[0][10] == pytest.approx(3.0) and fa[1][10] == pytest.approx(3.0)
    assert (fb[0] == 1.0).all()            # a ran normally throughout: b's slowness is its own
    # too few calls of other operators (or none judged): 1
    (only,) = fluctuation.local_factors([a])
    assert (only[0] == 1.0).all() and (only[1] == 1.0).all()


def test_descheduled_neighbours_do_not_hide_a_call_that_did_5x_its_work():
    # measured with a busy loop beside 2 ranks on 2 cores: around attention's 5x call, the
    # other operators took 2.3x their wall medians (descheduled) at 1.0x their CPU medians
    t0 = np.arange(60, dtype=float) * 1e4
    steps = np.arange(1, 21)
    ops = [fluctuation.OpCalls(0, name, "kernel", np.full(20, us * 1.6), np.full(20, us), steps,
                               [SITE] * 20, t0[k::3])
           for k, (name, us) in enumerate((("embed", 4000.0), ("attention", 6000.0),
                                           ("mlp", 8000.0)))]
    for c in (ops[0], ops[2]):
        c.time[5:9] *= 2.3                  # descheduled around step 7: wall time only
    att = ops[1]
    att.cpu[6] *= 5.0
    att.time[6] = att.cpu[6] * 1.0          # 30 ms: it ran at once
    facs = fluctuation.local_factors(ops)
    assert facs[1][0][6] == pytest.approx(2.3) and facs[1][1][6] == pytest.approx(1.0)
    (f,) = fluctuation.slow_calls(att, fluctuation.ABS_FLOOR_US, facs[1])
    assert (f.op, f.step) == ("attention", 7)
    # without CPU times the wall factor is all there is, and it excuses the call
    att.cpu = np.full(20, np.nan)
    assert fluctuation.slow_calls(att, fluctuation.ABS_FLOOR_US, facs[1]) == []


def test_a_call_slow_in_wall_time_only_is_descheduling_not_the_operator():
    t = np.full(20, 10000.0)
    t[5] = 60000.0
    cpu = np.full(20, 9000.0)                       # the CPU time did not move
    c = fluctuation.OpCalls(0, "k", "kernel", t, cpu, np.arange(1, 21), [SITE] * 20)
    assert fluctuation.slow_calls(c) == []
    cpu[5] = 54000.0
    (f,) = fluctuation.slow_calls(c)
    assert f.step == 6 and f.ratio == pytest.approx(6.0)
    # without CPU times the wall time decides; below the floor nothing is flagged
    c.cpu = np.full(20, np.nan)
    assert len(fluctuation.slow_calls(c)) == 1
    assert fluctuation.slow_calls(c, floor_us=60000.0) == []


def test_a_rank_doing_more_work_is_slow_whatever_the_scheduler_did_to_its_wall_times():
    # as measured with a busy loop beside 2 ranks on 2 cores: rank 1's mlp does 30 % more CPU
    # work, but rank 0's mlp was descheduled more, so rank 1 has the *lower* wall median
    rng = np.random.default_rng(0)
    steps = np.arange(1, 21)
    cpu0, cpu1 = 8000.0 * rng.uniform(0.99, 1.01, 20), 10400.0 * rng.uniform(0.99, 1.01, 20)
    wall0, wall1 = cpu0 * 2.0, cpu1 * 1.5
    ranks = [fluctuation.OpCalls(0, "mlp", "kernel", wall0, cpu0, steps, [SITE] * 20),
             fluctuation.OpCalls(1, "mlp", "kernel", wall1, cpu1, steps, [SITE] * 20)]
    (f,) = fluctuation.slow_ranks(ranks, 20)
    assert (f.rank, f.measure) == (1, "cpu") and f.ratio == pytest.approx(1.3, rel=0.02)
    assert f.time_us == pytest.approx(10400, rel=0.02)
    # the same ratio on an operator whose extra work per step is under the floor: nothing
    small = [fluctuation.OpCalls(r.rank, "mlp", "kernel", r.time / 10, r.cpu / 10, steps,
                                 [SITE] * 20) for r in ranks]
    assert fluctuation.slow_ranks(small, 20) == []
    # without CPU times the wall times decide: within 3 % of each other, nothing; a rank whose
    # wall median is 30 % higher is flagged in wall time
    for r in ranks:
        r.cpu = np.full(20, np.nan)
    assert fluctuation.slow_ranks(ranks, 20) == []
    ranks[1].time = ranks[0].time * 1.3
    (f,) = fluctuation.slow_ranks(ranks, 20)
    assert (f.rank, f.measure) == (1, "wall") and f.ratio == pytest.approx(1.3, rel=0.02)


def test_the_rule_needs_enough_calls_and_a_real_excess():
    t = np.full(7, 1000.0)
    t[3] = 9000.0
    c = fluctuation.OpCalls(0, "k", "kernel", t, t * 0.9, np.arange(7), [None] * 7)
    assert fluctuation.slow_calls(c) == []                  # 7 < MIN_CALLS
    t = np.full(20, 100.0)
    t[3] = 900.0                                            # 9x, but 0.8 ms < the 1 ms floor
    c = fluctuation.OpCalls(0, "k", "kernel", t, t, np.arange(20), [None] * 20)
    assert fluctuation.slow_calls(c) == []


def test_without_marks_the_whole_run_is_one_step(tmp_path):
    paths, truth = job(tmp_path, steps=5, marks=False)
    doc = profsummary.summarize(paths)
    assert doc["steps"] == {"source": "run", "common": 1}
    r = doc["ranks"][0]
    assert sum(r["parts_us"].values()) == pytest.approx(r["step_mean_us"], rel=1e-9)
    # first kernel start to last collective end: 6 iterations less the last host gap
    assert r["step_mean_us"] == pytest.approx(sum(v["step"] for v in truth[0].values()) - 2000,
                                              rel=1e-6)
    assert "no step marks" in profsummary.render(doc)[0]


def test_overlap_counts_once_by_precedence(tmp_path):
    """A kernel on one stream under a collective on another: compute wins, then transfer."""
    ev = [{"name": "step mark", "ph": "i", "pid": 0, "tid": 0, "ts": T0,
           "args": {"issued": {"1": 0, "2": 0}}},
          {"name": "k", "cat": "kernel", "ph": "X", "pid": 0, "tid": 1, "ts": T0 + 100,
           "dur": 400, "args": {"task": 1}},
          {"name": "c", "cat": "copy", "ph": "X", "pid": 0, "tid": 2, "ts": T0 + 300,
           "dur": 500, "args": {"task": 1}},
          {"name": "step mark", "ph": "i", "pid": 0, "tid": 0, "ts": T0 + 1000,
           "args": {"issued": {"1": 1, "2": 1}}}]
    p = tmp_path / "trace_rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    rt = profparts.load(str(p))
    profparts.analyze([rt])
    assert rt.steps == 1 and rt.ends.tolist() == [T0, T0 + 1000]
    compute, transfer, copy, wait, host = rt.parts[0]
    assert (compute, copy, host, transfer, wait) == (400, 300, 300, 0, 0)


def test_tasks_belong_to_the_step_that_enqueued_them_not_the_one_they_run_in(tmp_path):
    """The host marks step 1 before its kernel has run: the kernel still counts for step 1."""
    ev = [{"name": "step mark", "ph": "i", "pid": 0, "tid": 0, "ts": T0,
           "args": {"issued": {"1": 0}}},
          {"name": "step mark", "ph": "i", "pid": 0, "tid": 0, "ts": T0 + 10,
           "args": {"issued": {"1": 1}}},
          {"name": "step mark", "ph": "i", "pid": 0, "tid": 0, "ts": T0 + 20,
           "args": {"issued": {"1": 2}}},
          {"name": "k", "cat": "kernel", "ph": "X", "pid": 0, "tid": 1, "ts": T0 + 5,
           "dur": 995, "args": {"task": 1}},
          {"name": "k", "cat": "kernel", "ph": "X", "pid": 0, "tid": 1, "ts": T0 + 1000,
           "dur": 1000, "args": {"task": 2}}]
    p = tmp_path / "trace_rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    rt = profparts.load(str(p))
    profparts.analyze([rt])
    assert rt.step.tolist() == [1, 2]
    assert rt.ends.tolist() == [T0, T0 + 1000, T0 + 2000]
    assert rt.parts[:, profparts.COMPUTE].tolist() == [995, 1000]


def test_files_table_sorting_and_length(tmp_path):
    paths, _ = job(tmp_path, slow=(2, 7, 5.0))
    lines = profsummary.summarize_dir(str(tmp_path), sort="max", top=5)
    assert len(lines) <= 40
    table = lines[lines.index(next(x for x in lines if x.startswith("top "))) + 2:][:3]
    assert table[0].split()[0] == "matmul"          # its max is the 5x call
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["version"] == 1 and doc["fluctuations"][0]["rank"] == 2
    assert {r["rank"]: r["peak_allocated_bytes"] for r in doc["ranks"]} == \
        {0: 3 << 20, 1: 4 << 20, 2: 5 << 20}
    assert doc["ranks"][0]["peak_reserved_bytes"] == 2 << 20
    rows = list(csv.DictReader(open(tmp_path / "op_summary.csv")))
    assert tuple(rows[0]) == profsummary.CSV_FIELDS
    mm = [r for r in rows if r["name"] == "matmul"]
    assert [int(r["rank"]) for r in mm] == [0, 1, 2] and all(r["calls"] == "21" for r in mm)
    assert mm[0]["site"] == SITE
    with pytest.raises(ValueError, match="sort="):
        profsummary.render(doc, sort="nope")


def test_cli(tmp_path, capsys):
    job(tmp_path)
    assert profsummary.main([str(tmp_path), "--sort", "p99", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "top 2 operators by p99 time" in out and "fluctuations: none" in out
    assert profsummary.main([str(tmp_path / "nowhere")]) == 1
    assert "no trace_rank<N>.json files" in capsys.readouterr().err


def test_a_rank_slower_at_everything_is_the_slow_rank_but_no_operator_is_flagged(tmp_path):
    paths, _ = job(tmp_path, slow_rank=(1, 1.25))
    for p in paths[1:2]:                    # rank 1: every kernel 25 % slower (a busier core)
        doc = json.loads(open(p).read())
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"] != "matmul":
                e["dur"] *= 1.25
                e["args"]["cpu_us"] *= 1.25
        open(p, "w").write(json.dumps(doc))
    doc = profsummary.summarize(paths)
    assert doc["slowest"]["rank"] == 1 and doc["fluctuations"] == []


def test_collectives_are_not_judged_call_by_call():
    t = np.full(20, 1000.0)
    t[4] = 20000.0
    c = fluctuation.OpCalls(0, "HcclAllReduce", "collective", t, t, np.arange(20), [None] * 20)
    assert fluctuation.slow_calls(c) == []


def test_collectives_are_not_judged_rank_by_rank():
    """A healthy world-2 run on 2 cores had one rank's HcclAllReduce at 1.3-3.4x the other's:
    a collective's transfer time says when the OS ran both ranks, not what one rank does. The
    same ratio on a kernel is flagged; the collective leaves the kernel's factor alone."""
    steps = np.arange(12)

    def calls(kind, name, slow):
        return [fluctuation.OpCalls(r, name, kind, np.full(12, 5000.0 * (slow if r else 1)),
                                    np.full(12, 5000.0 * (slow if r else 1)), steps,
                                    [None] * 12) for r in range(2)]
    coll = calls("collective", "HcclAllReduce", 2.6)
    kern = calls("kernel", "backward_fc", 2.6)
    assert fluctuation.slow_ranks(coll, 12) == []
    assert [(f.rank, f.op) for f in fluctuation.slow_ranks(kern, 12)] == [(1, "backward_fc")]
    even = calls("kernel", "forward_fc", 1.0)
    assert fluctuation.rank_factors([coll, even]) == {0: 1.0, 1: 1.0}
