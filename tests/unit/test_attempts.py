"""launcher.agent.attempts: the end-of-job table of a restarted job, and where the attempts
resumed."""
from __future__ import annotations

from launcher.agent.attempts import AttemptRecord, failure_class, format_attempts


def test_table_names_culprits_classes_and_where_the_next_resumed():
    a0 = AttemptRecord(0, "failed", [2], "dead_rank", "rank 2 is dead (killed by SIGKILL)",
                       failed_at=100.0)
    a1 = AttemptRecord(1, "failed", [0], "error", "exited with code 3", failed_at=200.0)
    a1.saw_line("[rank 0]: resumed from step 40", now=112.5)
    a2 = AttemptRecord(2, "succeeded")
    a2.saw_line("resumed from step 60", now=203.25)
    a2.saw_line("resumed from step 80", now=204.0)        # the first line counts
    assert format_attempts([a0, a1, a2], 3).splitlines() == [
        "npurun: attempts of this job (3, --max-restarts 3):",
        "  attempt 0: failed: culprit rank(s) 2 (dead_rank): rank 2 is dead (killed by SIGKILL); "
        "the next attempt resumed from step 40, 12.5 s after the failure",
        "  attempt 1: failed: culprit rank(s) 0 (error): exited with code 3; the next attempt "
        "resumed from step 60, 3.2 s after the failure",
        "  attempt 2: succeeded",
    ]


def test_an_attempt_that_did_not_resume_is_said_so():
    a0 = AttemptRecord(0, "failed", [], "stopped", "", failed_at=1.0)
    a1 = AttemptRecord(1, "failed", [1, 3], "deadlock", "", failed_at=2.0)
    text = format_attempts([a0, a1], 1)
    assert "attempt 0: failed: culprit rank(s) none found (stopped); the next attempt did not " \
           "print 'resumed from step N'" in text
    assert text.endswith("attempt 1: failed: culprit rank(s) 1, 3 (deadlock)")


def test_resumed_line_found_in_redirected_logs(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "1").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("MLP ...\n")
    (tmp_path / "1" / "stderr.log").write_text("x\nresumed from step 17\n")
    r = AttemptRecord(1)
    r.scan_logs(str(tmp_path))
    assert r.resumed_step == 17 and r.resumed_at is None
    missing = AttemptRecord(2)
    missing.scan_logs(str(tmp_path / "nowhere"))
    assert missing.resumed_step is None


def test_failure_class():
    assert failure_class("timeout", -9) == "timeout"
    assert failure_class(None, -9) == "dead"
    assert failure_class("", 3) == "error"


def test_a_long_verdict_line_is_kept_whole():
    """The attempts line carries the verdict's whole first line (it was cut at 160 characters,
    mid-word: "(victims, not; ...")."""
    from launcher.agent.supervisor import _first_line
    verdict = ("rank 1 is dead (killed by SIGKILL; its last seq is unknown: its last published "
               "state (seq 86 enqueued, 81 completed) is older than the others' progress (seq "
               "101 completed)); rank(s) [0, 2] only waited for it (victims, not causes)")
    a0 = AttemptRecord(0, "failed", [1], "dead", _first_line(verdict + "\nmore"), failed_at=1.0)
    a1 = AttemptRecord(1, "succeeded")
    line = format_attempts([a0, a1], 1).splitlines()[1]
    assert f": {verdict}; the next attempt did not print" in line
