"""hccl.wire: framing round trip, and every malformation, forgery and replay rejected."""
import hashlib
import hmac
import logging
import pickle
import struct

import numpy as np
import zmq
import pytest

from hccl import wire
from hccl.wire import BadFrame, Kind

pytestmark = pytest.mark.timeout(10)

KEY = b"k" * 32


def msg(**kw):
    args = dict(sender=3, dest=5, conn=0x1234_5678_9ABC_DEF0, serial=7, comm_id=11, seq=12,
                step=13, fp=(1, 1024, 4, 0, -1), value=-99, text="ключ/key",
                payloads=[b"abc", np.arange(4, dtype=np.float32)])
    args.update(kw)
    return wire.pack(KEY, Kind.DATA, **args)


def resign(header: bytes, key: bytes = KEY) -> bytes:
    """Re-MAC a hand-edited header so only the edited field is wrong."""
    body = header[:-wire.MAC_SIZE]
    return body + hmac.new(key, body, hashlib.sha256).digest()


def test_round_trip_every_field():
    frames = msg()
    assert isinstance(frames[0], bytes) and len(frames) == 3
    h = wire.unpack(frames, KEY)
    assert (h.kind, h.sender, h.dest, h.conn, h.serial) == (Kind.DATA, 3, 5, 0x123456789ABCDEF0, 7)
    assert (h.comm_id, h.seq, h.step, h.fp, h.value) == (11, 12, 13, (1, 1024, 4, 0, -1), -99)
    assert h.text == "ключ/key"
    assert bytes(h.payloads[0]) == b"abc"
    assert np.array_equal(np.frombuffer(h.payloads[1], np.float32), np.arange(4))


def test_round_trip_extremes_and_no_payload():
    big = (1 << 64) - 1
    h = wire.unpack(wire.pack(KEY, Kind.ABORT, sender=0xFFFFFFFF, dest=0, conn=big, serial=big,
                              comm_id=big, seq=big, step=0xFFFFFFFF,
                              fp=(-(1 << 63), (1 << 63) - 1, 0, 0, 0), value=(1 << 63) - 1,
                              text="x" * wire.MAX_TEXT), KEY, dest=0)
    assert h.payloads == () and h.conn == big and h.step == 0xFFFFFFFF and len(h.text) == 65535
    assert h.fp[0] == -(1 << 63)


def test_zero_length_payload_frame():
    h = wire.unpack(msg(payloads=[b""]), KEY)
    assert len(h.payloads) == 1 and bytes(h.payloads[0]) == b""


def test_zmq_frames_are_accepted():
    frames = [zmq.Frame(f if isinstance(f, bytes) else bytes(memoryview(f).cast("B")))
              for f in msg()]
    h = wire.unpack(frames, KEY)
    assert h.text == "ключ/key" and bytes(h.payloads[0]) == b"abc"


@pytest.mark.parametrize("field", [dict(sender=-1), dict(sender=1 << 32), dict(step=-1),
                                   dict(comm_id=1 << 64), dict(fp=(1, 2, 3)),
                                   dict(fp=(1 << 63, 0, 0, 0, 0)), dict(text="x" * 65536)])
def test_pack_rejects_out_of_range(field):
    with pytest.raises(ValueError):
        msg(**field)


@pytest.mark.parametrize("secret", [b"", None, "text"])
def test_pack_and_unpack_need_a_secret(secret):
    with pytest.raises(ValueError, match="secret"):
        wire.pack(secret, Kind.DATA, sender=0, dest=0, conn=1, serial=1)
    with pytest.raises(ValueError, match="secret"):
        wire.unpack(msg(), secret)


def test_wrong_key_rejected():
    with pytest.raises(BadFrame, match="MAC"):
        wire.unpack(msg(), b"another job's secret")


def test_every_single_bit_flip_in_the_header_is_rejected():
    frames = msg()
    hdr = frames[0]
    for i in range(len(hdr)):
        for bit in (0x01, 0x80):
            bad = bytearray(hdr)
            bad[i] ^= bit
            with pytest.raises(BadFrame):
                wire.unpack([bytes(bad), *frames[1:]], KEY)


@pytest.mark.parametrize("cut", [lambda h: h[:-1], lambda h: h[:-wire.MAC_SIZE],
                                 lambda h: h[:50], lambda h: b""])
def test_truncated_header_rejected(cut):
    frames = msg()
    with pytest.raises(BadFrame):
        wire.unpack([cut(frames[0]), *frames[1:]], KEY)


def test_oversized_header_rejected():
    with pytest.raises(BadFrame, match="header frame is"):
        wire.unpack([b"\0" * (wire.MAX_HEADER + 1)], KEY)


def test_garbage_rejected():
    for frames in ([], [b""], [b"garbage"], [b"\0" * wire.MIN_HEADER], [object()], [12345]):
        with pytest.raises(BadFrame):
            wire.unpack(frames, KEY)


@pytest.mark.parametrize("offset,value,match", [(0, b"XXXX", "magic"), (4, b"\x09", "version"),
                                                (5, b"\x63", "kind")])
def test_fixed_fields_checked_even_with_a_valid_mac(offset, value, match):
    frames = msg()
    hdr = bytearray(frames[0])
    hdr[offset:offset + len(value)] = value
    with pytest.raises(BadFrame, match=match):
        wire.unpack([resign(bytes(hdr)), *frames[1:]], KEY)


def test_text_length_mismatch_rejected():
    frames = msg()
    hdr = bytearray(frames[0])
    struct.pack_into("!H", hdr, 32, 3)   # text_len slot (after nframes)
    with pytest.raises(BadFrame, match="text"):
        wire.unpack([resign(bytes(hdr)), *frames[1:]], KEY)


def test_non_utf8_text_rejected_even_with_a_valid_mac():
    frames = msg(text="ab")
    hdr = bytearray(frames[0])
    hdr[wire.FIXED_SIZE:wire.FIXED_SIZE + 2] = b"\xff\xfe"
    with pytest.raises(BadFrame, match="utf-8"):
        wire.unpack([resign(bytes(hdr)), *frames[1:]], KEY)


def test_payload_frames_must_match_the_header():
    hdr, p0, p1 = msg()
    with pytest.raises(BadFrame, match="payload frames"):
        wire.unpack([hdr, p0], KEY)                       # a frame missing
    with pytest.raises(BadFrame, match="payload frames"):
        wire.unpack([hdr, p0, p1, b""], KEY)              # one too many
    with pytest.raises(BadFrame, match="payload is"):
        wire.unpack([hdr, p0, bytes(p1)[:-1]], KEY)       # truncated payload
    with pytest.raises(BadFrame, match="payload is"):
        wire.unpack([hdr, p0 + b"!", p1], KEY)            # extended payload
    with pytest.raises(BadFrame):
        wire.unpack([hdr, p0, 42], KEY)                   # not bytes-like


def test_misaddressed_message_rejected():
    with pytest.raises(BadFrame, match="addressed to 5"):
        wire.unpack(msg(), KEY, dest=4)
    assert wire.unpack(msg(), KEY, dest=5).dest == 5


def test_replay_rejected():
    guard = wire.ReplayGuard()
    first = msg(serial=1)
    wire.unpack(first, KEY, guard=guard)
    with pytest.raises(BadFrame, match="replayed"):
        wire.unpack(first, KEY, guard=guard)
    wire.unpack(msg(serial=5), KEY, guard=guard)          # gaps are fine
    with pytest.raises(BadFrame, match="replayed"):
        wire.unpack(msg(serial=3), KEY, guard=guard)      # older than the last one
    wire.unpack(msg(serial=1, conn=99), KEY, guard=guard)  # another connection counts apart
    wire.unpack(msg(serial=1, sender=4), KEY, guard=guard)


def test_forgery_does_not_poison_the_replay_guard():
    guard = wire.ReplayGuard()
    forged = msg(serial=1000)
    with pytest.raises(BadFrame, match="MAC"):
        wire.unpack(forged, b"wrong", guard=guard)
    wire.unpack(msg(serial=1), KEY, guard=guard)          # still accepted


def test_replay_guard_is_bounded():
    guard = wire.ReplayGuard(capacity=4)
    for c in range(10):
        guard.accept(0, c, 1)
    assert len(guard._last) == 4
    with pytest.raises(BadFrame):
        guard.accept(0, 9, 1)


def test_routing_ids_never_start_with_zero_and_conn_ids_are_random():
    ids = {wire.new_conn_id() for _ in range(100)}
    assert len(ids) == 100 and 0 not in ids
    rid = wire.routing_id(b"R", 0, 0)
    assert rid[0] != 0 and len(rid) == 13


def test_drop_log_is_rate_limited(caplog):
    d = wire.DropLog(logging.getLogger("npusim-test.droplog"), burst=3, period=60)
    with caplog.at_level(logging.WARNING, logger="npusim-test.droplog"):
        for i in range(100):
            d("where", f"bad {i}")
    assert d.dropped == 100
    assert len(caplog.records) == 3 and "bad 0" in caplog.records[0].getMessage()


def test_bad_frame_pickles():
    e = pickle.loads(pickle.dumps(BadFrame("bad MAC")))
    assert isinstance(e, ValueError) and str(e) == "bad MAC"


def test_cached_mac_equals_hmac_sha256_for_every_key_length():
    import hmac as _hmac
    import os as _os
    for key in (b"k", _os.urandom(32), _os.urandom(64), _os.urandom(65), _os.urandom(300)):
        for body in (b"", b"abc", _os.urandom(1000)):
            assert wire._mac(key, body) == _hmac.digest(key, body, "sha256")
