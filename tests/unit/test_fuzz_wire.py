"""Fuzzing the wire decoder: whatever arrives, ``unpack`` returns a verified Header or raises
BadFrame (UnusableFrame, naming the sender, for a signed message it cannot use), never anything
else, and allocates nothing beyond the frames it was given."""
import secrets
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccl import wire
from hccl.wire import Kind

pytestmark = pytest.mark.timeout(120)

SECRET = secrets.token_bytes(32)
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u8, u16 = st.integers(0, 0xFF), st.integers(0, 0xFFFF)
u32, u64 = st.integers(0, 0xFFFFFFFF), st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
payload_frames = st.lists(st.binary(max_size=64), max_size=4)


def _valid(**kw):
    args = dict(sender=3, dest=5, conn=0x1234, serial=9, comm_id=77, seq=4, step=2,
                fp=(0, 8, 4, 0, -1), value=-5, text="k\0ey", payloads=[b"abc", b"de"])
    args.update(kw)
    return wire.pack(SECRET, Kind.DATA, **args)


def _outcome(frames, *, secret=SECRET, dest=None, guard=None):
    """"ok" / "bad" / "unusable" for ``unpack``; any other exception fails the test."""
    try:
        wire.unpack(frames, secret, dest=dest, guard=guard)
    except wire.UnusableFrame:
        return "unusable"
    except wire.BadFrame:
        return "bad"
    return "ok"


@FAST
@given(st.lists(st.binary(max_size=wire.MAX_HEADER + 8), max_size=5))
def test_random_bytes_are_bad_frames(frames):
    assert _outcome(frames) == "bad"


@FAST
@given(st.lists(st.one_of(st.integers(), st.none(), st.floats(), st.text(max_size=8),
                          st.just(1 << 40)), min_size=1, max_size=3))
def test_objects_that_are_not_frames_are_bad_frames_without_allocating(frames):
    # bytes(1 << 40) would try to allocate a TiB: the decoder must not call it
    assert _outcome(frames) == "bad"


@FAST
@given(st.data())
def test_truncated_or_bit_flipped_header_is_bad(data):
    frames = _valid()
    header = frames[0]
    cut = data.draw(st.integers(0, len(header) - 1))
    assert _outcome([header[:cut], *frames[1:]]) == "bad"
    pos = data.draw(st.integers(0, len(header) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(header)
    flipped[pos] ^= 1 << bit
    assert _outcome([bytes(flipped), *frames[1:]]) == "bad"
    assert _outcome([header + data.draw(st.binary(min_size=1, max_size=8)), *frames[1:]]) == "bad"


@FAST
@given(st.binary(min_size=1, max_size=64), payload_frames)
def test_wrong_key_is_bad(key, payloads):
    if key == SECRET:
        return
    frames = _valid(payloads=payloads)
    assert _outcome(frames, secret=key) == "bad"
    assert _outcome(frames) == "ok"


@FAST
@given(st.data())
def test_payload_frames_lost_added_or_resized_are_a_members_error(data):
    payloads = data.draw(st.lists(st.binary(min_size=1, max_size=32), min_size=1, max_size=4))
    frames = _valid(payloads=payloads)
    changed = list(frames[1:])
    i = data.draw(st.integers(0, len(changed) - 1))
    what = data.draw(st.sampled_from(["drop", "add", "grow", "shrink"]))
    if what == "drop":
        del changed[i]
    elif what == "add":
        changed.insert(i, data.draw(st.binary(max_size=8)))
    elif what == "grow":
        changed[i] = changed[i] + b"x"
    else:
        changed[i] = changed[i][:-1]
    with pytest.raises(wire.UnusableFrame) as ei:
        wire.unpack([frames[0], *changed], SECRET)
    assert ei.value.sender == 3 and ei.value.conn == 0x1234 and ei.value.serial == 9


@settings(max_examples=200, deadline=None)
@given(version=u8, kind=u8, sender=u32, dest=u32, conn=u64, serial=u64, nframes=u16,
       comm_id=u64, seq=u64, step=u32, fp=st.tuples(i64, i64, i64, i64, i64), value=i64,
       text=st.one_of(st.text(max_size=40).map(lambda t: t.encode()), st.binary(max_size=40)),
       payloads=payload_frames, payload_len=st.one_of(st.none(), u64),
       dest_filter=st.one_of(st.none(), u32))
def test_any_header_signed_with_the_right_key(version, kind, sender, dest, conn, serial, nframes,
                                              comm_id, seq, step, fp, value, text, payloads,
                                              payload_len, dest_filter):
    """Every field random, re-signed: the decoder predicts exactly which check refuses it."""
    total = sum(map(len, payloads)) if payload_len is None else payload_len
    if payload_len is None and nframes > 3:
        nframes = len(payloads)          # half the examples announce the true frame count
    body = wire._FIXED.pack(wire.MAGIC, version, kind, sender, dest, conn, serial, nframes,
                            len(text), total, comm_id, seq, step, *fp, value) + text
    frames = [body + wire._mac(SECRET, body), *payloads]
    try:
        text.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    if dest_filter is not None and dest_filter != dest:
        want = "bad"
    elif (version != wire.VERSION or kind not in {int(k) for k in Kind} or nframes != len(payloads)
          or total != sum(map(len, payloads)) or not utf8):
        want = "unusable"
    else:
        want = "ok"
    try:
        h = wire.unpack(frames, SECRET, dest=dest_filter)
        got = "ok"
    except wire.UnusableFrame as e:
        got = "unusable"
        assert (e.sender, e.conn, e.serial) == (sender, conn, serial)
    except wire.BadFrame:
        got = "bad"
    assert got == want
    if got == "ok":
        assert (h.kind, h.sender, h.dest, h.conn, h.serial) == (kind, sender, dest, conn, serial)
        assert (h.comm_id, h.seq, h.step, h.fp, h.value) == (comm_id, seq, step, fp, value)
        assert h.text == text.decode() and list(h.payloads) == payloads


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 20)), max_size=60))
def test_replay_guard_accepts_only_newer_serials_and_stays_bounded(events):
    guard = wire.ReplayGuard(capacity=8)
    last = {}
    order = []
    for sender, conn, serial in events:
        k = (sender, conn)
        # what the guard still remembers: the 8 most recently accepted connections
        known = last.get(k, 0) if k in order[-8:] else 0
        try:
            guard.accept(sender, conn, serial)
            accepted = True
        except wire.BadFrame as e:
            accepted = False
            assert "replayed" in str(e)
        assert accepted == (serial > known)
        if accepted:
            last[k] = serial
            if k in order:
                order.remove(k)
            order.append(k)
        assert len(guard._last) <= 8


@FAST
@given(st.integers(1, 40), st.data())
def test_replayed_message_is_refused_through_unpack(n, data):
    guard = wire.ReplayGuard()
    sent = [_valid(serial=s) for s in range(1, n + 1)]
    for frames in sent:
        assert _outcome(frames, guard=guard) == "ok"
    again = data.draw(st.sampled_from(sent))
    assert _outcome(again, guard=guard) == "bad"


def test_oversized_header_is_refused_before_parsing():
    huge = wire.MAGIC + b"\0" * (wire.MAX_HEADER + 1)
    assert _outcome([huge]) == "bad"
    # a fixed part announcing more text than the frame holds
    body = wire._FIXED.pack(wire.MAGIC, wire.VERSION, Kind.DATA, 1, 2, 3, 4, 0, 0xFFFF, 0,
                            0, 0, 0, 0, 0, 0, 0, 0, 0)
    assert _outcome([body + wire._mac(SECRET, body)]) == "bad"
    assert struct.calcsize(wire._FIXED.format) == wire.FIXED_SIZE
