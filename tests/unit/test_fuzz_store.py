"""Fuzzing a live store server over loopback: strangers' garbage and replays are dropped without
an answer, every authenticated request gets exactly one answer (OK, TIMEOUT or ERROR naming the
reason), and a real client works afterwards. No crash, no stall, no unbounded allocation."""
import secrets

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccl import wire
from hccl.store import StoreClient, StoreError, StoreServer
from hccl.wire import Kind

from zmq_fixtures import stranger  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

SECRET = secrets.token_bytes(32)
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SENDER, CONN = 7, 0xC0FFEE
REPLY_WAIT_MS = 10_000        # a deadline, not an expectation: replies come in milliseconds


@pytest.fixture(scope="module")
def server():
    with StoreServer("127.0.0.1", 0, SECRET, name="fuzz-store", max_message=1 << 16) as srv:
        yield srv


class _Member:
    """A raw DEALER with a member's identity: sends signed requests, reads their replies."""

    def __init__(self, port):
        self.ctx = zmq.Context()
        self.conn = secrets.randbits(63) or 1
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.routing_id = wire.routing_id(b"C", SENDER, self.conn)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.serial = 0

    def request(self, kind, text="", value=0, payloads=()):
        self.serial += 1
        frames = wire.pack(SECRET, kind, sender=SENDER, dest=wire.STORE_ID, conn=self.conn,
                           serial=self.serial, value=value, text=text, payloads=payloads)
        self.sock.send_multipart(frames)
        return frames

    def reply(self):
        assert self.sock.poll(REPLY_WAIT_MS), "the store did not answer"
        return wire.unpack(self.sock.recv_multipart(), SECRET, dest=SENDER)

    def probe(self):
        """A fresh CHECK: its reply must be the next one (nothing else was answered)."""
        self.request(Kind.CHECK, "nothing-here")
        h = self.reply()
        assert (h.kind, h.seq, h.value) == (Kind.OK, self.serial, 0)

    def close(self):
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture(scope="module")
def member(server):
    m = _Member(server.port)
    yield m
    m.close()


def _real_client_works(server, waiters=0):
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=10) as c:
        n = c.add("real-counter", 1)
        assert c.get("real-counter") == str(n).encode()
    st_ = server.stats()
    assert server._thread.is_alive() and st_["waiters"] == waiters


@FAST
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_strangers_random_frames_are_dropped_unanswered(server, member, stranger, frames):
    s = stranger(server.address)
    before = server.drops.dropped
    s.send_multipart(frames)
    assert server.drops.wait_for(before + 1, 10)
    member.probe()


@FAST
@given(kind=st.integers(0, 255), text=st.text(max_size=30),
       value=st.integers(-(1 << 63), (1 << 63) - 1),
       payloads=st.lists(st.binary(max_size=40), max_size=3))
def test_every_signed_request_gets_exactly_one_answer(server, member, kind, text, value, payloads):
    if kind in (Kind.GET, Kind.WAIT):
        value = value % 30                      # a short wait, so a missing key answers TIMEOUT
    body = wire._FIXED.pack(wire.MAGIC, wire.VERSION, kind, SENDER, wire.STORE_ID, member.conn,
                            member.serial + 1, len(payloads), len(text.encode()),
                            sum(map(len, payloads)), 0, 0, 0, 0, 0, 0, 0, 0, value)
    body += text.encode()
    member.serial += 1
    member.sock.send_multipart([body + wire._mac(SECRET, body), *payloads])
    h = member.reply()
    assert h.seq == member.serial and h.kind in (Kind.OK, Kind.TIMEOUT, Kind.ERROR)
    if kind not in range(Kind.SET, Kind.COMPARE_SET + 1):
        assert h.kind == Kind.ERROR
        assert "not a store request kind" in h.text or f"unknown message kind {kind}" in h.text
    elif "\0" in text and kind not in (Kind.WAIT, Kind.CHECK, Kind.GET):   # GET: multi_get
        assert h.kind == Kind.ERROR and "takes one key" in h.text
    member.probe()


@FAST
@given(version=st.integers(0, 255).filter(lambda v: v != wire.VERSION),
       extra=st.lists(st.binary(max_size=10), min_size=0, max_size=2))
def test_unusable_signed_request_is_answered_with_the_reason(server, member, version, extra):
    body = wire._FIXED.pack(wire.MAGIC, version, Kind.SET, SENDER, wire.STORE_ID, member.conn,
                            member.serial + 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) + b"k"
    member.serial += 1
    member.sock.send_multipart([body + wire._mac(SECRET, body), b"v", *extra])
    h = member.reply()
    assert h.kind == Kind.ERROR and h.seq == member.serial
    assert f"wire version {version}" in h.text
    member.probe()


@FAST
@given(st.integers(0, 5), st.sampled_from(["replay", "flip_mac", "other_identity"]))
def test_replayed_or_tampered_request_is_dropped_unanswered(server, member, stranger, back, how):
    member.request(Kind.ADD, "replayed", value=1)
    first = member.reply()
    assert first.kind == Kind.OK
    old = wire.pack(SECRET, Kind.ADD, sender=SENDER, dest=wire.STORE_ID, conn=member.conn,
                    serial=max(1, member.serial - back), value=1, text="replayed")
    before = server.drops.dropped
    if how == "replay":
        member.sock.send_multipart(old)                       # a replayed serial
    elif how == "flip_mac":
        member.sock.send_multipart([old[0][:-1] + bytes([old[0][-1] ^ 1])])
    else:                                                     # a captured request, another socket
        stranger(server.address).send_multipart(
            wire.pack(SECRET, Kind.ADD, sender=SENDER, dest=wire.STORE_ID, conn=member.conn,
                      serial=member.serial + 100, value=1, text="replayed"))
    assert server.drops.wait_for(before + 1, 10)
    member.probe()
    member.request(Kind.ADD, "replayed", value=0)
    assert member.reply().value == first.value               # the replay added nothing


def test_oversized_frame_drops_the_connection_not_the_server(server, stranger):
    assert server._sock.getsockopt(zmq.MAXMSGSIZE) == 1 << 16
    s = stranger(server.address)
    s.send_multipart([b"x" * ((1 << 16) + 1)])       # libzmq refuses it before allocating it
    big = wire.pack(SECRET, Kind.SET, sender=SENDER, dest=wire.STORE_ID, conn=1, serial=1,
                    text="big", payloads=[b"v" * ((1 << 16) + 1)])
    s.send_multipart(big)
    _real_client_works(server)
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=10) as c:
        assert c.check(["big"]) is False


def test_huge_wait_request_neither_overflows_nor_blocks_the_server(server, member):
    member.request(Kind.GET, "never-set", value=(1 << 63) - 1)   # park for ~292 million years
    member.probe()                                               # it is parked, not answered
    _real_client_works(server, waiters=1)
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=10) as c:
        c.set("never-set", b"now")
    h = member.reply()
    assert h.kind == Kind.OK and bytes(h.payloads[0]) == b"now"


def test_client_raises_on_a_request_the_server_refuses(server):
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=10) as c:
        with pytest.raises(StoreError, match="not a store request kind"):
            c._request(Kind.ABORT, ["k"])
        with pytest.raises(StoreError, match="takes one key"):
            c._request(Kind.ADD, ["a", "b"], value=1)
        c.set("after", b"1")
        assert c.get("after") == b"1"
    _real_client_works(server)
