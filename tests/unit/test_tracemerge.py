"""launcher.profile.tracemerge: per-rank Chrome traces become one trace with a process per rank and
a track per stream; events and timestamps are kept as they are."""
from __future__ import annotations

import json
import os

import pytest

from launcher.profile import tracemerge


def rank_trace(rank, spans, *, label=True, streams=None):
    """A trace shaped like runtime/profiler.py writes it: pid = rank, tid = stream id."""
    streams = streams or {1: f"NPU{rank} default stream", 2: f"NPU{rank} stream 2"}
    ev = []
    if label:
        ev += [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                "args": {"name": f"rank {rank}"}},
               {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                "args": {"sort_index": rank}}]
    ev += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": n}}
           for t, n in streams.items()]
    for tid, name, cat, ts, dur in spans:
        e = {"name": name, "cat": cat, "ph": "X", "pid": rank, "tid": tid, "ts": ts, "dur": dur}
        if cat == "collective":
            e["args"] = {"comm": "world", "seq": 1, "count": 4, "dtype": "FP32", "bytes": 16}
        ev.append(e)
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def processes(doc):
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "process_name"}


def tracks(doc):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "thread_name"}


def spans(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


T0 = 1_700_000_000_000_000.0     # wall-clock microseconds, as the runtime stamps them


@pytest.mark.timeout(10)
def test_one_process_per_rank_one_track_per_stream_events_unchanged(tmp_path):
    r0 = rank_trace(0, [(1, "forward_fc1", "kernel", T0 + 10, 5.5),
                        (2, "HcclAllReduce", "collective", T0 + 12, 30.25)])
    r1 = rank_trace(1, [(1, "forward_fc1", "kernel", T0 + 11, 6.0),
                        (2, "HcclAllReduce", "collective", T0 + 13, 29.0)])
    paths = [write(tmp_path / "trace_rank0.json", r0), write(tmp_path / "trace_rank1.json", r1)]
    out = tmp_path / "merged.json"
    merged = tracemerge.merge(paths, str(out))

    assert json.loads(out.read_text()) == merged
    assert processes(merged) == {0: "rank 0", 1: "rank 1"}
    # the same stream id in two ranks stays two tracks, each with its own name
    assert tracks(merged) == {(0, 1): "NPU0 default stream", (0, 2): "NPU0 stream 2",
                              (1, 1): "NPU1 default stream", (1, 2): "NPU1 stream 2"}
    got = sorted((e["pid"], e["tid"], e["name"], e["cat"], e["ts"], e["dur"])
                 for e in spans(merged))
    assert got == [(0, 1, "forward_fc1", "kernel", T0 + 10, 5.5),
                   (0, 2, "HcclAllReduce", "collective", T0 + 12, 30.25),
                   (1, 1, "forward_fc1", "kernel", T0 + 11, 6.0),
                   (1, 2, "HcclAllReduce", "collective", T0 + 13, 29.0)]
    assert [e["ts"] for e in spans(merged)] == sorted(e["ts"] for e in spans(merged))
    ar = [e for e in spans(merged) if e["name"] == "HcclAllReduce"]
    assert all(e["args"]["comm"] == "world" and e["args"]["bytes"] == 16 for e in ar)
    sort = {e["pid"]: e["args"]["sort_index"] for e in merged["traceEvents"]
            if e.get("name") == "process_sort_index"}
    assert sort == {0: 0, 1: 1}
    # metadata first, so viewers name the tracks before drawing them
    phases = [e["ph"] for e in merged["traceEvents"]]
    assert phases == sorted(phases, key=lambda p: p != "M")


@pytest.mark.timeout(10)
def test_rank_from_file_name_bare_lists_and_duplicate_ranks_never_mix(tmp_path):
    # no process_name label (e.g. written without RANK: pid is an OS pid) -> rank from the name
    unlabeled = rank_trace(48213, [(1, "k", "kernel", T0, 1.0)], label=False)
    p2 = write(tmp_path / "trace_rank2.json", unlabeled)
    # a bare event list is a valid Chrome trace too
    p0 = write(tmp_path / "a.json", rank_trace(0, [(1, "k", "kernel", T0 + 1, 1.0)])["traceEvents"])
    # a second trace claiming rank 0 gets a pid of its own
    p0b = write(tmp_path / "b.json", rank_trace(0, [(1, "k", "kernel", T0 + 2, 1.0)]))
    merged = tracemerge.merge([p2, p0, p0b], str(tmp_path / "m.json"))
    procs = processes(merged)
    assert procs[2] == "rank 2" and procs[0] == "rank 0"
    assert len(procs) == 3
    (extra,) = set(procs) - {0, 2}
    assert extra > 2 and procs[extra] == "rank 0 (b.json)"
    assert sorted(e["pid"] for e in spans(merged)) == sorted([0, 2, extra])
    assert {k[0] for k in tracks(merged)} == {0, 2, extra}


@pytest.mark.timeout(10)
def test_merge_dir_in_rank_order_ignores_other_files_and_is_repeatable(tmp_path):
    for r in (10, 2, 0, 1):
        trace = rank_trace(r, [(1, f"k{r}", "kernel", T0 + r, 1.0)])
        write(tmp_path / f"trace_rank{r}.json", trace)
    (tmp_path / "trace_rank3.json.tmp999").write_text("{partial")   # a write in progress
    (tmp_path / "notes.json").write_text("[]")
    assert [os.path.basename(p) for p in tracemerge.rank_traces(str(tmp_path))] == \
        ["trace_rank0.json", "trace_rank1.json", "trace_rank2.json", "trace_rank10.json"]
    out = tracemerge.merge_dir(str(tmp_path))
    assert out == str(tmp_path / "trace_merged.json")
    first = json.loads(open(out).read())
    assert processes(first) == {0: "rank 0", 1: "rank 1", 2: "rank 2", 10: "rank 10"}
    assert sorted(e["name"] for e in spans(first)) == ["k0", "k1", "k10", "k2"]
    # merging again does not take the merged file as an input
    again = json.loads(open(tracemerge.merge_dir(str(tmp_path))).read())
    assert len(spans(again)) == 4


@pytest.mark.timeout(10)
def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace_rank"):
        tracemerge.merge_dir(str(tmp_path))
    with pytest.raises(ValueError, match="no trace files"):
        tracemerge.merge([], str(tmp_path / "m.json"))
    bad = tmp_path / "trace_rank0.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="trace_rank0.json"):
        tracemerge.merge([str(bad)], str(tmp_path / "m.json"))
    bad.write_text(json.dumps({"traceEvents": 3}))
    with pytest.raises(ValueError, match="not a Chrome trace"):
        tracemerge.merge([str(bad)], str(tmp_path / "m.json"))
    assert not (tmp_path / "m.json").exists()


@pytest.mark.timeout(10)
def test_command_line(tmp_path, capsys):
    for r in (0, 1):
        write(tmp_path / f"trace_rank{r}.json", rank_trace(r, [(1, "k", "kernel", T0 + r, 1.0)]))
    assert tracemerge.main([str(tmp_path)]) == 0
    assert "merged 2 traces (2 events)" in capsys.readouterr().out
    assert (tmp_path / "trace_merged.json").exists()
    assert tracemerge.main([str(tmp_path / "empty_dir_that_does_not_exist")]) == 1


@pytest.mark.timeout(20)
def test_merges_what_the_runtime_profiler_writes(tmp_path, device, monkeypatch):
    """Traces written by runtime.profile under two RANK values merge into two named ranks."""
    import numpy as np

    import runtime
    paths = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        path = str(tmp_path / f"trace_rank{rank}.json")
        s = runtime.Stream()
        with runtime.profile(path):
            a = runtime.zeros(16, np.float32, stream=s)
            runtime.launch(np.add, a, 1.0, a, stream=s, name=f"kernel_of_rank{rank}")
        paths.append(path)
        s.destroy()
    merged = tracemerge.merge(paths, str(tmp_path / "merged.json"))
    assert processes(merged) == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        (k,) = [e for e in spans(merged) if e["name"] == f"kernel_of_rank{rank}"]
        assert k["pid"] == rank and k["cat"] == "kernel" and k["dur"] >= 0
        assert tracks(merged)[(rank, k["tid"])].startswith("NPU0 ")


@pytest.mark.timeout(10)
def test_memory_counters_and_step_marks_go_to_their_rank(tmp_path):
    docs = []
    for r in (0, 1):
        d = rank_trace(r, [(1, "k", "kernel", T0 + 10 + r, 5.0)])
        d["traceEvents"] += [
            {"name": f"NPU{r} memory", "ph": "C", "pid": 99, "tid": 0, "ts": T0 + 1,
             "args": {"allocated": 512 * (r + 1), "reserved": 2 << 20}},
            {"name": "step mark", "cat": "step mark", "ph": "i", "s": "p", "pid": 99, "tid": 0,
             "ts": T0 + 2, "args": {"mark": 0, "issued": {"1": 0}}}]
        docs.append(write(tmp_path / f"trace_rank{r}.json", d))
    merged = tracemerge.merge(docs, str(tmp_path / "m.json"))["traceEvents"]
    counters = {(e["pid"], e["name"]): e["args"] for e in merged if e.get("ph") == "C"}
    assert counters == {(0, "NPU0 memory"): {"allocated": 512, "reserved": 2 << 20},
                        (1, "NPU1 memory"): {"allocated": 1024, "reserved": 2 << 20}}
    assert sorted(e["pid"] for e in merged if e.get("ph") == "i") == [0, 1]
