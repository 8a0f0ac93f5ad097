"""Typed abort records and error-file records: kind, rank and text as fields, never parsed prose."""
from __future__ import annotations

import json

import pytest

import hccl.comm  # noqa: F401 - hccl errors surface from stream tasks with their own type
from hccl import abortrec
from hccl.errors import CollectiveMismatchError, HcclTimeoutError, RemoteRankError
from launcher import worker
from runtime.errors import task_error_class


@pytest.mark.timeout(10)
def test_record_round_trip_and_plain_text():
    text = abortrec.record("timeout", 3, "rank 3 timed out in ALLREDUCE waiting for rank 2",
                           waited_for=2)
    rec = abortrec.read(text)
    assert rec == {"kind": "timeout", "rank": 3, "waited_for": 2,
                   "text": "rank 3 timed out in ALLREDUCE waiting for rank 2"}
    assert abortrec.read(text.encode()) == rec
    # a reason that is not a record (a transport protocol error): kind "failed", text as is
    plain = abortrec.read("protocol error: rank 1 cannot use a message", sender=1)
    assert plain == {"kind": "failed", "rank": 1, "text": "protocol error: rank 1 cannot use a message"}
    assert abortrec.read('{"kind": "dead"}', sender=2)["kind"] == "failed"   # not ours
    with pytest.raises(ValueError, match="abort kind 'oops'"):
        abortrec.record("oops", 0, "x")


@pytest.mark.timeout(10)
def test_a_long_text_still_fits_the_transport():
    text = abortrec.record("mismatch", 0, "x" * 10000)
    assert len(text.encode()) < 4000                 # the ABORT message carries 4000 bytes
    assert abortrec.read(text)["kind"] == "mismatch"


@pytest.mark.timeout(10)
def test_error_records_come_from_types_not_text():
    surfaced = task_error_class(HcclTimeoutError)
    err = surfaced.__new__(surfaced)
    Exception.__init__(err, "[rank 0] ALLREDUCE timed out\n  details")
    rec = worker.error_record(err)
    assert (rec["kind"], rec["type"], rec["text"]) == ("timeout", "HcclTimeoutError",
                                                       "[rank 0] ALLREDUCE timed out")
    released = RemoteRankError("[rank 1] aborted: rank 0 timed out", rank=0)
    released.abort = {"kind": "timeout", "rank": 0, "text": "rank 0 timed out", "x": 1}
    rec = worker.error_record(released)
    assert rec["kind"] == "released" and rec["abort"] == {"kind": "timeout", "rank": 0,
                                                          "text": "rank 0 timed out"}
    assert worker.error_record(CollectiveMismatchError("m"))["kind"] == "mismatch"
    # a user's exception that mentions an hccl error is still the user's own error
    assert worker.error_record(ValueError("HcclTimeoutError everywhere"))["kind"] == "error"


@pytest.mark.timeout(10)
def test_error_file_and_console_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("RANK", "3")
    try:
        raise HcclTimeoutError("[rank 3] ALLREDUCE timed out\n  more")
    except HcclTimeoutError as e:
        worker._excepthook(type(e), e, e.__traceback__)
    data = json.loads(path.read_text())
    site = data["error"].pop("site")                 # where the test's code raised it
    assert site.endswith("in test_error_file_and_console_line") and "test_abort_records.py:" in site
    assert data["error"] == {"kind": "timeout", "type": "HcclTimeoutError", "rank": 3,
                             "text": "[rank 3] ALLREDUCE timed out"}
    err = capsys.readouterr().err
    tb = tmp_path / "traceback.log"
    assert err == f"HcclTimeoutError: [rank 3] ALLREDUCE timed out (full traceback: {tb})\n"
    assert "Traceback (most recent call last)" in tb.read_text()
    try:
        raise KeyError("plain")
    except KeyError as e:
        worker._excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err                     # any other error prints in full
    assert "Traceback (most recent call last)" in err and "KeyError: 'plain'" in err
    assert json.loads(path.read_text())["error"]["kind"] == "error"


@pytest.mark.timeout(10)
def test_the_users_own_error_is_kind_error_whole_with_its_site():
    """An argument error of an hccl call, a numpy array where a DeviceArray belongs, a user's
    exception: kind ``error`` (a cause, not a collective's echo), the message whole on one line,
    the site the user's code raised at."""
    import numpy as np

    import runtime
    from hccl.comm import Comm
    runtime.set_device(0)
    try:
        Comm.all_reduce(None, np.arange(12, dtype=np.float32).reshape(3, 4))
    except Exception as e:      # noqa: BLE001 - the record of whatever it raised is the point
        rec = worker.error_record(e)
    assert rec["kind"] == "error" and rec["type"] == "InvalidArgumentError", rec
    assert rec["text"].startswith("send=numpy.ndarray(shape=(3, 4), dtype=float32): the Comm "
                                  "methods infer count and dtype from a DeviceArray"), rec["text"]
    assert "\n" not in rec["text"] and "array([" not in rec["text"]
    assert rec["site"].endswith("in test_the_users_own_error_is_kind_error_whole_with_its_site")
    try:
        raise ValueError("first line\n  second line names the reason")
    except ValueError as e:
        rec = worker.error_record(e)
    assert rec["text"] == "first line second line names the reason"
    assert worker.error_record(runtime.errors.OutOfMemoryError("out of HBM"))["kind"] == "error"
