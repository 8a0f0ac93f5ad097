"""Typed abort records: why a communicator was aborted, as fields, never as prose to parse.

An abort travels as text (the transport's ABORT message, the launcher's abort key in the job's
store). That text is the JSON of ``{"kind", "rank", "text"}`` (plus optional fields):

- ``kind``: a ``hccl.failure.Failure`` word: ``timeout`` (rank timed out waiting for a peer),
  ``mismatch`` (rank saw a different collective at the same seq), ``failed`` (rank's collective
  failed otherwise; also a reason that was not a record, e.g. a transport protocol error: its
  text as is), ``dead`` (rank's process died), ``deadlock`` (the launcher found a wait-for
  cycle), ``stopped`` (npurun stops the job, naming the culprit);
- ``rank``: the rank the abort is about (world rank), or None;
- ``text``: one line for a user, never containing internal markers.

``read`` accepts any text: plain text becomes kind ``failed`` with that text, so every reader
sees the same three fields whoever wrote the abort.
"""
from __future__ import annotations

import json

from .failure import Failure

KINDS = tuple(k.value for k in Failure)
_TAG = "npusim-abort"
_MAX_TEXT = 1500


def record(kind: Failure | str, rank: int | None, text: str, **extra) -> str:
    """The abort text for ``kind`` about ``rank`` (JSON); ``extra`` fields must be JSON-able."""
    if str(kind) not in KINDS:
        raise ValueError(f"abort kind {kind!r} is not one of {', '.join(KINDS)}")
    kind = str(kind)
    # the transport carries at most 4000 bytes of reason: a cut record would not parse
    return json.dumps({_TAG: 1, "kind": kind, "rank": rank, "text": str(text)[:_MAX_TEXT],
                       **extra})


def read(reason: str | bytes | None, sender: int | None = None) -> dict:
    """The record of an abort text: ``{"kind", "rank", "text", ...}``.

    Text that is not a record (or is truncated) becomes ``{"kind": "failed", "rank": sender,
    "text": reason}``.
    """
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    reason = reason or ""
    try:
        data = json.loads(reason)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get(_TAG) == 1 and data.get("kind") in KINDS:
        data = dict(data)
        data.pop(_TAG)
        data.setdefault("rank", sender)
        data["text"] = str(data.get("text") or "")
        return data
    return {"kind": Failure.FAILED.value, "rank": sender, "text": reason or "no reason given"}
