"""Typed abort records: why a communicator was aborted, as fields, never as prose to parse.

An abort travels as text (the transport's ABORT message, the launcher's abort key in the job's
store). That text is the JSON of ``{"kind", "rank", "text"}`` (plus optional fields):

- ``kind``: ``timeout`` (rank timed out waiting for a peer), ``mismatch`` (rank saw a different
  collective at the same seq), ``failed`` (rank's collective failed otherwise), ``dead`` (the
  launcher saw rank's process die), ``deadlock`` (the launcher found a wait-for cycle), or
  ``error`` (a reason that was not a record, e.g. a transport protocol error: its text as is);
- ``rank``: the rank the abort is about (world rank), or None;
- ``text``: one line for a user, never containing internal markers.

``read`` accepts any text: plain text becomes kind ``error`` with that text, so every reader
sees the same three fields whoever wrote the abort.
"""
from __future__ import annotations

import json

KINDS = ("timeout", "mismatch", "failed", "dead", "deadlock", "stopped", "error")
_TAG = "npusim-abort"
_MAX_TEXT = 1500


def record(kind: str, rank: int | None, text: str, **extra) -> str:
    """The abort text for ``kind`` about ``rank`` (JSON); ``extra`` fields must be JSON-able."""
    if kind not in KINDS:
        raise ValueError(f"abort kind {kind!r} is not one of {', '.join(KINDS)}")
    # the transport carries at most 4000 bytes of reason: a cut record would not parse
    return json.dumps({_TAG: 1, "kind": kind, "rank": rank, "text": str(text)[:_MAX_TEXT],
                       **extra})


def read(reason: str | bytes | None, sender: int | None = None) -> dict:
    """The record of an abort text: ``{"kind", "rank", "text", ...}``.

    Text that is not a record (or is truncated) becomes ``{"kind": "error", "rank": sender,
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
    return {"kind": "error", "rank": sender, "text": reason or "no reason given"}
