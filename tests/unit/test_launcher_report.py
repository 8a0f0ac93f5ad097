"""The failure summary, error-file reading, console line prefixing and error pickling."""
from __future__ import annotations

import json
import pickle
import signal
import sys

import pytest

from launcher.errors import (ProcessExitedError, ProcessRaisedError, RendezvousTimeoutError,
                             SpawnTimeoutError, describe_exit, shell_exit_code)
from launcher.procs.output import _Stream
from launcher.diagnosis.summary import ProcessFailure, format_summary, root_cause

TB = 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\nKeyError: 1\n'


def error_file(tmp_path, name, ts):
    path = tmp_path / name
    path.write_text(json.dumps({"message": {"message": "KeyError: 1", "extraInfo": {
        "py_callstack": TB, "timestamp": str(int(ts))}}, "rank": 2, "timestamp": ts}))
    return str(path)


@pytest.mark.timeout(10)
def test_root_cause_is_the_earliest_failure_and_has_its_traceback(tmp_path):
    raised = ProcessFailure(rank=2, local_rank=0, pid=11, exitcode=1,
                            error_file=error_file(tmp_path, "e2.json", 1000.0), observed_at=1000.5)
    killed = ProcessFailure(rank=0, local_rank=0, pid=10, exitcode=-signal.SIGKILL,
                            error_file=str(tmp_path / "none.json"), observed_at=1000.2)
    assert root_cause([killed, raised]) is raised
    assert raised.traceback == TB and raised.message == "KeyError: 1"
    assert killed.signal == "SIGKILL" and killed.shell_exitcode == 137
    assert "Signal 9 (SIGKILL) received by PID 10" in killed.message
    text = format_summary("npurun train.py", [killed, raised], stopped=[1, 3])
    head, root = text.split("Root Cause (first observed failure):")
    assert "npurun train.py FAILED" in head
    assert "rank      : 0 (local_rank: 0)" in head and "-9 (SIGKILL, exit 137)" in head
    assert "rank      : 2 (local_rank: 0)" in root and "exitcode  : 1 (pid: 11)" in root
    assert "KeyError: 1" in root and 'File "t.py", line 3' in root
    assert "Stopped by npurun after the failure: ranks 1, 3" in root
    assert "npurun exits with 1 (rank 2: exited with code 1)" in root


@pytest.mark.timeout(10)
def test_a_peer_that_only_echoes_the_failure_is_not_the_root_cause(tmp_path):
    """Its peers may see a death (an abort, a vanished shared-memory peer) before npurun does."""
    path = tmp_path / "echo.json"
    path.write_text(json.dumps({"message": {"message": "TaskError[RemoteRankError]: rank 1's "
                                "process has exited", "extraInfo": {"py_callstack": TB}},
                                "error": {"kind": "released", "type": "RemoteRankError",
                                          "rank": 0, "text": "rank 1's process has exited"},
                                "timestamp": 999.0}))
    echo = ProcessFailure(rank=0, local_rank=0, pid=10, exitcode=1, error_file=str(path),
                          observed_at=1000.0)
    killed = ProcessFailure(rank=1, local_rank=1, pid=11, exitcode=-signal.SIGKILL,
                            error_file=str(tmp_path / "none.json"), observed_at=1000.1)
    assert echo.timestamp < killed.timestamp
    assert root_cause([echo, killed]) is killed
    assert root_cause([echo]) is echo                  # only echoes: the earliest one


@pytest.mark.timeout(10)
def test_summary_without_other_failures(tmp_path):
    f = ProcessFailure(rank=0, local_rank=0, pid=5, exitcode=7, error_file="",
                       observed_at=1.0)
    text = format_summary("npurun x", [f])
    assert "<NO_OTHER_FAILURES>" in text and "exitcode  : 7 (pid: 5)" in text
    assert "without a Python exception" in text


@pytest.mark.timeout(10)
def test_exit_code_helpers():
    assert shell_exit_code(-15) == 143 and shell_exit_code(3) == 3
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(2) == "exited with code 2"
    assert describe_exit(None) == "alive" and describe_exit(-77) == "killed by signal 77"


@pytest.mark.timeout(10)
def test_console_lines_are_prefixed_whole(monkeypatch):
    written = []

    class Sink:
        def write(self, s):
            written.append(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Sink())
    s = _Stream(fd=-1, prefix="[rank 3]: ", console="stdout", logfile=None)
    s.feed(b"hel")
    s.feed(b"lo\nwor")
    s.feed(b"ld\nlast")
    s.finish()
    assert "".join(written) == "[rank 3]: hello\n[rank 3]: world\n[rank 3]: last\n"
    assert written[0] == "[rank 3]: hello\n"  # nothing written before the line was complete


@pytest.mark.timeout(10)
def test_errors_pickle_with_their_fields():
    for err in (ProcessRaisedError(1, 1, TB, "KeyError: 1"), ProcessExitedError(0, -9),
                RendezvousTimeoutError([1, 2], 3, 5.0, "hint"),
                SpawnTimeoutError(2.0, [0], {0: "stack"})):
        clone = pickle.loads(pickle.dumps(err))
        assert type(clone) is type(err) and str(clone) == str(err)
    assert "nodes 1, 2 of 3 never arrived within 5 s" in str(RendezvousTimeoutError([1, 2], 3, 5))


@pytest.mark.timeout(10)
def test_story_summary_blames_the_culprit_not_the_first_to_time_out(tmp_path):
    """Rank 3 timed out first; the verdict names rank 2 (stopped by npurun, no failure of its
    own): the summary's root cause and exit line are rank 2, rank 3 is one line, released."""
    from launcher.diagnosis.summary import Culprit, format_story, story_exit_code
    path = tmp_path / "e3.json"
    path.write_text(json.dumps({"message": {"message": "TaskError[HcclTimeoutError]: [rank 3] "
                                "ALLREDUCE timed out\n  more", "extraInfo": {"py_callstack": TB}},
                                "error": {"kind": "timeout", "type": "HcclTimeoutError",
                                          "rank": 3, "text": "[rank 3] ALLREDUCE timed out"},
                                "timestamp": 10.0}))
    timed_out = ProcessFailure(rank=3, local_rank=3, pid=13, exitcode=1, error_file=str(path),
                               observed_at=10.5)
    culprit = Culprit(rank=2, state="not_entered", detail="never called seq 2; alive, still in "
                      "user code", local_rank=2, pid=12, exitcode=-15, stopped=True)
    text = format_story("npurun t.py", "timeout", [culprit], [timed_out],
                        tracebacks="/logs/r/attempt_0/<local_rank>/traceback.log")
    root, released = text.split("Released by the culprit")
    assert "rank      : 2 (local_rank: 2)" in root and "rank      : 3" not in root
    assert "stopped by npurun after the verdict (pid: 12)" in root
    assert "rank 3: exited with code 1: HcclTimeoutError: [rank 3] ALLREDUCE timed out\n" in released
    assert "Traceback" not in text                      # victims are one line each
    assert "npurun exits with 1 (culprit rank 2: not_entered)" in text
    assert story_exit_code([culprit]) == 1
    dead = Culprit(rank=1, state="dead", detail="killed by SIGKILL", local_rank=1, pid=11,
                   exitcode=-9, failure=ProcessFailure(rank=1, local_rank=1, pid=11, exitcode=-9,
                                                       error_file="", observed_at=1.0))
    assert story_exit_code([dead]) == 137
    assert "npurun exits with 137 (culprit rank 1: dead, killed by SIGKILL)" in format_story(
        "npurun t.py", "dead_rank", [dead], [timed_out], tracebacks="x")


@pytest.mark.timeout(10)
def test_story_points_only_to_traceback_files_that_exist(tmp_path):
    """A rank killed by a signal writes no traceback.log: the summary names the files written
    (by local rank) and leaves the line out when there is none."""
    from launcher.diagnosis.summary import Culprit, format_story
    pattern = str(tmp_path / "attempt_0" / "<local_rank>" / "traceback.log")
    killed = ProcessFailure(rank=1, local_rank=1, pid=11, exitcode=-9, error_file="",
                            observed_at=1.0)
    dead = Culprit(rank=1, state="dead", detail="killed by SIGKILL", local_rank=1, pid=11,
                   exitcode=-9, failure=killed)
    released = [ProcessFailure(rank=r, local_rank=r, pid=10 + r, exitcode=1, error_file="",
                               observed_at=2.0) for r in (0, 2)]
    text = format_story("npurun t.py", "dead", [dead], [killed, *released], tracebacks=pattern)
    assert "Full tracebacks" not in text and "<local_rank>" not in text
    for r in (0, 2):
        (tmp_path / "attempt_0" / str(r)).mkdir(parents=True)
        (tmp_path / "attempt_0" / str(r) / "traceback.log").write_text(TB)
    text = format_story("npurun t.py", "dead", [dead], [killed, *released], tracebacks=pattern)
    assert f"Full tracebacks: {pattern} (local ranks 0, 2)\n" in text


@pytest.mark.timeout(10)
def test_one_line_is_shortened_at_a_word():
    from launcher.diagnosis.summary import _one_line
    text = "RemoteRankError: " + " ".join(["word"] * 80)
    line = _one_line(text, limit=100)
    assert len(line) <= 100 and line.endswith(" word...") and _one_line("short\nmore") == "short"
