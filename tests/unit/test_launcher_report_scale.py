"""Reports that stay short at scale (#39): the verdict table, the failure summaries and the
console group ranks as ranges above a few ranks, and stay per rank below."""
from __future__ import annotations

import json
import sys

import pytest

from launcher.procs.output import _Stream
from launcher.diagnosis.report import format_report
from launcher.diagnosis.summary import Culprit, ProcessFailure, format_story, format_summary


def _verdict(world: int) -> dict:
    members = {str(r): {"state": "waiting", "seq": 2, "op": "ALLREDUCE(count=8, FP32, SUM)",
                        "waiting_for": 37 if r == 36 else 36, "since": 1000.0 + r % 3,
                        "detail": None} for r in (36, 38, 39)}
    members["37"] = {"state": "not_entered", "seq": None, "op": None, "waiting_for": None,
                     "since": None, "detail": "never called seq 2; alive, still in user code"}
    others = {str(r): {"state": "exited with code 1"} for r in range(world)
              if r not in (36, 37, 38, 39)}
    others["50"] = {"state": "killed by SIGSEGV"}
    return {"reason": "timeout", "comm": "world.sub[36, 37, 38, 39]",
            "members": [36, 37, 38, 39], "seq": 2, "op": "ALLREDUCE(count=8, FP32, SUM)",
            "culprits": [37], "verdict": "rank 37 never called seq 2", "ranks": members,
            "other_ranks": others}


@pytest.mark.timeout(10)
def test_a_256_rank_verdict_groups_the_ranks_outside_the_communicator():
    text = format_report(_verdict(256), now=1010.0)
    lines = text.splitlines()
    assert len(lines) <= 20, text
    assert "0-35, 40-49, 51-255  (not a member of world.sub[36, 37, 38, 39]: exited with code 1)" \
        in lines
    assert "   50  (not a member of world.sub[36, 37, 38, 39]: killed by SIGSEGV)" in lines
    assert sum(l.lstrip().startswith(("36", "37", "38", "39")) for l in lines) == 4  # members


@pytest.mark.timeout(10)
def test_a_big_communicator_gets_one_row_per_distinct_state():
    v = _verdict(64)
    v["ranks"] = {str(r): {"state": "waiting", "seq": 2, "op": "ALLREDUCE(count=8, FP32, SUM)",
                           "waiting_for": 5, "since": 1000.0 + r, "detail": None}
                  for r in range(64) if r != 5}
    v["ranks"]["5"] = {"state": "not_entered", "seq": None, "op": None, "waiting_for": None,
                       "since": None, "detail": "alive, still in user code"}
    v["other_ranks"], v["culprits"] = {}, [5]
    rows = [l for l in format_report(v, now=1100.0).splitlines() if "ALLREDUCE(count=8" in l
            and "waiting" in l]
    assert len(rows) == 1 and rows[0].startswith("0-4, 6-63  waiting"), rows
    assert "100.0 s" in rows[0]                 # the oldest wait of the group


def _failure(tmp_path, rank: int, kind: str, code: int) -> ProcessFailure:
    path = tmp_path / f"e{rank}.json"
    typ = "RemoteRankError" if kind == "released" else "HcclTimeoutError"
    path.write_text(json.dumps({"message": {"message": f"{typ}: [rank {rank}] x"},
                                "error": {"kind": kind, "type": typ, "rank": rank,
                                          "text": f"[rank {rank}] BARRIER timed out"},
                                "timestamp": 1000.0 + rank}))
    return ProcessFailure(rank=rank, local_rank=rank, pid=100 + rank, exitcode=code,
                          error_file=str(path), observed_at=1000.0 + rank)


@pytest.mark.timeout(10)
def test_the_story_of_a_big_job_is_one_line_per_way_the_ranks_ended(tmp_path):
    fails = [_failure(tmp_path, r, "released" if r % 2 else "timeout", -11 if r == 9 else 1)
             for r in range(128) if r != 37]
    c = Culprit(rank=37, state="not_entered", detail="alive", local_rank=37, pid=1, exitcode=None,
                stopped=True)
    text = format_story("npurun job.py", "timeout", [c], fails, tracebacks="/nowhere/<local_rank>")
    lines = text.splitlines()
    assert len(lines) <= 16, text
    grouped = [l for l in lines if l.startswith(("  ranks ", "  rank 9:"))]
    assert len(grouped) == 3, text
    assert any(l.startswith("  ranks 0, 2, 4,") and "e.g. HcclTimeoutError" in l for l in grouped)
    assert "  rank 9: killed by SIGSEGV: RemoteRankError: [rank 9] BARRIER timed out" in lines


@pytest.mark.timeout(10)
def test_a_small_story_stays_one_line_per_rank(tmp_path):
    fails = [_failure(tmp_path, r, "timeout", 1) for r in (0, 1, 3)]
    c = Culprit(rank=2, state="not_entered", detail="alive", local_rank=2, pid=1, exitcode=None,
                stopped=True)
    text = format_story("npurun job.py", "timeout", [c], fails, tracebacks="/nowhere/<local_rank>")
    assert "  rank 0: exited with code 1: HcclTimeoutError: [rank 0] BARRIER timed out" in text
    assert "one line each" in text


@pytest.mark.timeout(10)
def test_a_big_first_failure_summary_lists_the_rest_as_ranges(tmp_path):
    fails = [_failure(tmp_path, r, "timeout", 1) for r in range(100)]
    text = format_summary("npurun job.py", fails, stopped=list(range(100, 256)))
    assert text.count("exitcode") <= 9, text          # the root cause and 8 others in full
    assert "... 91 more: ranks 9-99: exited with code 1" in text
    assert "Stopped by npurun after the failure: ranks 100-255" in text


@pytest.mark.timeout(10)
def test_a_watch_can_keep_a_line_off_the_console(monkeypatch):
    written, seen = [], []

    class Sink:
        def write(self, s):
            written.append(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Sink())

    def keep_off(prefix, line):
        seen.append((prefix, line))
        return "drop" in line
    s = _Stream(fd=-1, prefix="[rank 3]: ", console="stderr", logfile=None,
                watches=[(b"(full", keep_off)])
    s.feed(b"a (full drop)\nb (full keep)\nc\n")
    s.finish()
    assert "".join(written) == "[rank 3]: b (full keep)\n[rank 3]: c\n"
    assert seen == [("[rank 3]: ", "a (full drop)"), ("[rank 3]: ", "b (full keep)")]
