"""The intra-node channel (hccl.transport.shm) and the transport that routes over it (process,
local)."""
import os
import secrets
import stat
import threading

import numpy as np
import pytest

from hccl.transport import Aborted, FingerprintMismatch, PeerTimeout, TransportClosed
from hccl.transport import shm
from hccl.transport.base import DONE
from hccl.transport.local import ShmError
from hccl.transport.process import ProcessTransport
from runtime import sched

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not shm.available(), reason="no futex / no /dev/shm")]

SECRET = secrets.token_bytes(32)
FP = (1, 64, 4, 0, -1)
SLOT = 256                     # capacity 256 - 96 = 160 bytes
CAP = SLOT - shm.SLOT_HDR_BYTES
JOB = "chantest" + secrets.token_hex(3)


def _pair(slots=4, slot_bytes=SLOT):
    a = ProcessTransport(0, 2, SECRET, shm=True, job=JOB, slots=slots, slot_bytes=slot_bytes)
    b = ProcessTransport(1, 2, SECRET, shm=True, job=JOB, slots=slots, slot_bytes=slot_bytes)
    a.connect({1: b.address}, {1: a.node}, {1: b.segment})
    b.connect({0: a.address}, {0: b.node}, {0: a.segment})
    return a, b


@pytest.fixture
def pair():
    a, b = _pair()
    yield a, b
    a.close()
    b.close()
    assert _segments() == []


def _segments():
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"npusim-{JOB}-")]


def _bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_segments_are_private_and_unlinked_once_mapped(pair):
    a, b = pair
    names = sorted(_segments())
    assert names == sorted(t.segment.split(":")[0] for t in (a, b))   # "<name>:<pid>:<fd>"
    for n in names:
        st = os.stat(os.path.join("/dev/shm", n))
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    a.unlink_segment()
    b.unlink_segment()
    assert _segments() == []
    data = _bytes(100)
    assert a.send(1, 7, 1, 0, FP, data) is DONE      # mapped at first use, through /proc
    assert bytes(b.recv(0, 7, 1, 0, FP, 5)) == data.tobytes()


@pytest.mark.parametrize("n", [0, 1, CAP - 1, CAP, CAP + 1, 3 * CAP])
def test_payload_sizes_at_and_around_the_slot_size(pair, n):
    a, b = pair
    data = _bytes(n, seed=n)
    a.send(1, 7, 1, 0, FP, data).wait(5)
    assert bytes(b.recv(0, 7, 1, 0, FP, 5)) == data.tobytes()
    assert a.ring_sends == (1 if n <= CAP else 0)     # larger host payloads use the socket


def test_order_per_tag_and_a_ring_wrapping_around_many_times(pair):
    a, b = pair
    sent = []
    for i in range(50):                                # 4 slots: wraps 12 times
        d = _bytes(i + 1, seed=i)
        sent.append(d)
        a.send(1, 7, 3, 0, FP, d)                      # same tag: FIFO
        assert bytes(b.recv(0, 7, 3, 0, FP, 5)) == d.tobytes()
    for i in range(3):                                 # out of order tags, all still in the ring
        a.send(1, 7, 4, i, FP, sent[i])
    for i in reversed(range(3)):
        assert bytes(b.recv(0, 7, 4, i, FP, 5)) == sent[i].tobytes()
    assert a.ring_sends == 53


def test_a_full_ring_overflows_to_the_socket_and_nothing_is_lost(pair):
    a, b = pair
    for i in range(10):                                # 4 slots, nobody reading yet
        a.send(1, 7, 5, i, FP, _bytes(8, seed=i))
    assert a.ring_sends == 4
    for i in range(10):
        assert bytes(b.recv(0, 7, 5, i, FP, 5)) == _bytes(8, seed=i).tobytes()


def test_a_send_that_finds_the_ring_full_waits_for_a_slot_the_receiver_frees(pair, monkeypatch):
    from hccl.transport import local
    monkeypatch.setattr(local, "ROOM_WAIT", 30.0)     # the receiver, not the bound, ends it
    a, b = pair
    for i in range(4):                                 # 4 slots, all taken
        a.send(1, 7, 5, i, FP, _bytes(8, seed=i))
    done = []
    th = threading.Thread(target=lambda: done.append(a.send(1, 7, 5, 4, FP, _bytes(8, seed=4))))
    th.start()
    assert bytes(b.recv(0, 7, 5, 0, FP, 5)) == _bytes(8, seed=0).tobytes()   # frees a slot
    th.join(20)
    assert done == [DONE] and a.ring_sends == 5        # through the ring, not the socket
    for i in range(1, 5):
        assert bytes(b.recv(0, 7, 5, i, FP, 5)) == _bytes(8, seed=i).tobytes()


def test_fingerprint_mismatch_is_detected(pair):
    a, b = pair
    a.send(1, 7, 6, 0, (2, 64, 4, 0, -1), b"x")
    with pytest.raises(FingerprintMismatch) as e:
        b.recv(0, 7, 6, 0, FP, 5)
    assert e.value.theirs == (2, 64, 4, 0, -1) and e.value.mine == FP


def test_timeout_names_the_peer(pair):
    a, b = pair
    with pytest.raises(PeerTimeout) as e:
        b.recv(0, 7, 8, 0, FP, 0.3)
    assert e.value.peer == 0 and e.value.waited >= 0.3


def _blocked_recv(t, out, started, **kw):
    def run():
        started.set()
        try:
            t.recv(0, kw.get("comm", 7), 9, 0, FP, 30)
            out.append("returned")
        except Exception as e:   # noqa: BLE001 (the test inspects it)
            out.append(e)
    th = threading.Thread(target=run)
    th.start()
    return th


@pytest.mark.parametrize("how", ["local abort", "peer abort", "close"])
def test_abort_or_close_wakes_a_sleeping_waiter(pair, how):
    a, b = pair
    out, started = [], threading.Event()
    th = _blocked_recv(b, out, started)
    started.wait(5)
    while b.channel.inbox.u32[1] == 0 and th.is_alive():   # until it sleeps on the futex
        th.join(0.005)
    if how == "local abort":
        b.abort(7, "stop here")
    elif how == "peer abort":
        a.abort(7, "stop there")
    else:
        b.close()
    th.join(10)
    assert not th.is_alive()
    exc = TransportClosed if how == "close" else Aborted
    assert isinstance(out[0], exc), out


def test_a_message_from_the_peer_wakes_a_sleeping_waiter(pair):
    a, b = pair
    got, started = [], threading.Event()

    def run():
        started.set()
        got.append(bytes(b.recv(0, 7, 10, 0, FP, 30)))
    th = threading.Thread(target=run)
    th.start()
    started.wait(5)
    while b.channel.inbox.u32[1] == 0 and th.is_alive():
        th.join(0.005)
    a.send(1, 7, 10, 0, FP, b"wake")
    th.join(10)
    assert got == [b"wake"]


def test_an_unusable_ring_message_fails_every_comm_on_both_ranks(pair):
    a, b = pair
    a.make_pair(1)                                     # maps b's inbox (first use)
    a.channel.post(1, 99, 7, 11, 0, FP, 0, b"")        # a member's message of no known kind
    with pytest.raises(Aborted) as e:
        b.recv(0, 7, 11, 0, FP, 5)
    assert e.value.peer == 0 and "unknown kind 99" in e.value.reason
    with pytest.raises(Aborted) as e2:                  # the ABORT reached the sender too
        a.recv(1, 12345, 1, 0, FP, 5)
    assert "unknown kind 99" in e2.value.reason


def test_a_malformed_notice_fails_every_comm(pair):
    a, b = pair
    a.make_pair(1)                                     # maps b's inbox (first use)
    a.channel.post(1, 3, 7, 12, 0, FP, 0, b"12 not-a-handle")   # well formed, names nothing
    with pytest.raises(ShmError, match="not a device memory handle"):
        b.recv(0, 7, 12, 0, FP, 5)
    a.channel.post(1, 3, 7, 12, 1, FP, 0, b"twelve bytes")
    with pytest.raises(Aborted, match="malformed notice"):
        b.recv(0, 7, 12, 1, FP, 5)


def test_attach_checks_the_name_and_the_segment():
    ch = shm.Channel(0, 2, JOB, slots=2, slot_bytes=SLOT)
    other = shm.Channel(1, 2, JOB, slots=2, slot_bytes=SLOT)
    try:
        with pytest.raises(shm.ChannelError, match="not rank 1"):
            ch.attach(1, "../../etc/passwd")
        with pytest.raises(shm.ChannelError, match="not rank 1"):
            ch.attach(1, ch.name)                        # rank 0's own name
        with pytest.raises(shm.ChannelError, match="cannot open"):
            ch.attach(1, other.name[:-1] + ("0" if other.name[-1] != "0" else "1"))
        os.chmod(os.path.join("/dev/shm", other.name), 0o644)
        with pytest.raises(shm.ChannelError, match="0600"):
            ch.attach(1, other.name)
        os.chmod(os.path.join("/dev/shm", other.name), 0o600)
        ch.attach(1, other.name)
        assert ch.post(1, 1, 7, 1, 0, FP, 0, b"ok")
    finally:
        ch.close()
        other.close()
    assert _segments() == []


@pytest.mark.parametrize("cores, per_core, spin_us", [(64, 3, 200.0), (1, 3, 50.0), (1, 1, 0.0)])
def test_a_waiters_spin_follows_the_ranks_per_core(monkeypatch, cores, per_core, spin_us):
    # two ranks: the node's ranks fit its cores (200 us), outnumber them up to per_core to one
    # (50 us), or more (no spin: the waiter sleeps at once). (The scheduling class is npurun's
    # launch policy: runtime.sched, tested in tests/procs.)
    monkeypatch.setattr("runtime.sched.cores", lambda: cores)
    monkeypatch.setattr("hccl.transport.process.CROWDED_RANKS_PER_CORE", per_core)
    monkeypatch.delenv("NPUSIM_SHM_SPIN_US", raising=False)
    monkeypatch.delenv("NPUSIM_NODE_CORES", raising=False)
    a, b = _pair()
    try:
        assert a.channel.spin == b.channel.spin == pytest.approx(spin_us * 1e-6)
    finally:
        a.close()
        b.close()


def test_a_spinning_waiter_yields_its_core_to_the_peer(pair, monkeypatch):
    # Two ranks the scheduler put on one core: a waiter that spins without yielding holds the
    # core the peer needs for the whole spin (1 KiB all_reduce 570-600 us instead of ~280).
    a, _ = pair
    ch = a.channel
    ch.spin = 5.0                      # far longer than a yield: only the peer's post ends it
    seen = ch.value()
    yields = []

    me = threading.get_ident()

    def peer_runs():                   # what the scheduler does on sched_yield: the peer posts
        if threading.get_ident() == me:
            yields.append(1)
            if len(yields) == 3:
                ch.ring()

    monkeypatch.setattr(shm.os, "sched_yield", peer_runs)
    ch.wait(seen, 5.0)
    assert len(yields) == 3 and ch.value() != seen


def test_a_rank_bound_to_one_core_spins_by_the_cores_its_node_shares(monkeypatch):
    # npurun binds crowded ranks one core per pair and says how many cores they share: the
    # spin follows the ranks per core of the node, not the rank's own affinity of one core
    monkeypatch.setattr("runtime.sched.cores", lambda: 1)
    monkeypatch.delenv("NPUSIM_SHM_SPIN_US", raising=False)
    monkeypatch.setenv("NPUSIM_NODE_CORES", "64")
    a, b = _pair()
    try:
        assert a.channel.spin == b.channel.spin == pytest.approx(200e-6)
    finally:
        a.close()
        b.close()
    monkeypatch.setenv("NPUSIM_NODE_CORES", "0")
    with pytest.raises(Exception, match="NPUSIM_NODE_CORES"):
        sched.node_cores()
