"""The shared-memory data path: runtime.ipc, and ZmqTransport between ranks of one node."""
import os
import secrets
import threading

import numpy as np
import pytest

import runtime
from hccl import wire
from hccl.transport import Aborted, PeerTimeout, ZmqTransport
from hccl.transport.base import DONE
from hccl.transport.zmq import ShmError
from runtime import ipc
from runtime.errors import MemoryAccessError

from zmq_fixtures import pyzmq_gc_started, stranger  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(30)

SECRET = secrets.token_bytes(32)
FP = (1, 1024, 4, 0, -1)
MiB = 1 << 20


def _device_bytes(n, seed=0):
    """A device allocation filled with random bytes, and its host view."""
    p = runtime.malloc(n)
    view = runtime.memory.host_view(p, n)
    view[...] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return p, view


# -- runtime.ipc --------------------------------------------------------------------------------
def test_export_names_device_memory_only(device):
    p, view = _device_bytes(4096)
    handle, off = ipc.export(view[100:200])
    assert handle.startswith(f"{os.getpid()}:") and "npusim-" in handle
    assert off == p.addr - runtime.context.current_context().memory.base + 100
    assert ipc.export(np.zeros(4096, np.uint8)) is None          # private host memory
    runtime.free(p)


def test_peer_memory_maps_a_handle_read_only_and_bounds_views(device):
    p, view = _device_bytes(8192, seed=1)
    handle, off = ipc.export(view)
    mem = ipc.PeerMemory(handle)
    try:
        got = np.frombuffer(mem.view(off, 8192), np.uint8)
        assert np.array_equal(got, view)
        view[0] ^= 0xFF                                   # one memory: writes show through
        assert got[0] == view[0]
        with pytest.raises(ValueError):
            got[0] = 1                                    # read-only mapping
        with pytest.raises(MemoryAccessError, match="outside"):
            mem.view(mem.size - 10, 11)
        with pytest.raises(MemoryAccessError, match="outside"):
            mem.view(-1, 4)
        del got
    finally:
        mem.close()
    pid, fd, name = handle.split(":", 2)
    with pytest.raises(MemoryAccessError, match="not name npusim"):
        ipc.PeerMemory(f"{pid}:{fd}:other-file")
    with pytest.raises(MemoryAccessError, match="not device memory"):
        ipc.PeerMemory(f"{pid}:0:{name}")                 # fd 0 is not that memfd
    with pytest.raises(MemoryAccessError, match="cannot open"):
        ipc.PeerMemory(f"{pid}:99999:{name}")
    with pytest.raises(ipc.PeerGoneError, match="has exited"):
        ipc.PeerMemory(f"999999999:{fd}:{name}")          # no such process (any more)
    runtime.free(p)


def test_node_id_is_stable_and_names_the_pid_namespace():
    assert ipc.node_id() == ipc.node_id()
    assert ipc.node_id().endswith(os.readlink("/proc/self/ns/pid"))


# -- ZmqTransport --------------------------------------------------------------------------------
@pytest.fixture
def pair(monkeypatch, device):
    """Two transports of one node (ranks as threads of this process), shared memory from 64 KiB."""
    monkeypatch.setenv("NPUSIM_SHM_MIN_BYTES", str(64 << 10))
    made = []

    def make(nodes=None):
        a, b = ZmqTransport(0, 2, SECRET), ZmqTransport(1, 2, SECRET)
        addresses = {0: a.address, 1: b.address}
        nodes = nodes or ({1: a.node}, {0: b.node})
        a.connect(addresses, nodes[0])
        b.connect(addresses, nodes[1])
        made.extend((a, b))
        return a, b
    yield make
    for t in made:
        t.close(linger=0)


def _consume_later(t, peer, step, out, go):
    """recv_into on a thread: the payload is copied out only once ``go`` is set."""
    def consume(view):
        go.wait(10)
        out.append(np.array(np.frombuffer(view, np.uint8)))
    th = threading.Thread(target=t.recv_into, args=(peer, 1, 1, step, FP, 10, consume))
    th.start()
    return th


def test_a_device_payload_is_read_in_place_and_acknowledged(pair):
    a, b = pair()
    p, view = _device_bytes(MiB, seed=2)
    h = a.send(1, 1, 1, 0, FP, view)
    assert h is not DONE and a.shm_sends == 1
    out, go = [], threading.Event()
    th = _consume_later(b, 0, 0, out, go)
    with pytest.raises(PeerTimeout):
        h.wait(0.2)                          # not acknowledged while the peer reads
    assert not h.done()
    go.set()
    th.join(10)
    h.wait(10)
    assert h.done() and b.shm_recvs == 1
    assert np.array_equal(out[0], view)
    h2 = a.send(1, 1, 1, 1, FP, view[:MiB // 2])     # recv (not recv_into) hands back a copy
    got = b.recv(0, 1, 1, 1, FP, 10)
    h2.wait(10)
    assert not got.readonly and np.array_equal(np.frombuffer(got, np.uint8), view[:MiB // 2])
    runtime.free(p)


def test_host_small_and_other_node_payloads_go_through_the_socket(pair):
    a, b = pair()
    host = np.random.default_rng(3).integers(0, 256, MiB, dtype=np.uint8)
    p, view = _device_bytes(MiB, seed=4)
    a.send(1, 1, 1, 0, FP, host).wait(10)                    # not device memory
    a.send(1, 1, 1, 1, FP, view[:1000]).wait(10)             # below NPUSIM_SHM_MIN_BYTES
    assert a.shm_sends == 0
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 0, FP, 10), np.uint8), host)
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 1, FP, 10), np.uint8), view[:1000])
    c, d = pair(({1: "another node"}, {0: "another node"}))
    c.send(1, 1, 1, 0, FP, view).wait(10)
    assert c.shm_sends == 0
    assert np.array_equal(np.frombuffer(d.recv(0, 1, 1, 0, FP, 10), np.uint8), view)
    runtime.free(p)


def test_no_shared_memory_when_switched_off(pair, monkeypatch):
    monkeypatch.setenv("NPUSIM_SHM", "0")
    a, b = pair()
    p, view = _device_bytes(MiB, seed=5)
    a.send(1, 1, 1, 0, FP, view).wait(10)
    assert a.shm_sends == 0
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 0, FP, 10), np.uint8), view)
    runtime.free(p)


def test_a_notice_from_a_rank_of_another_node_aborts_every_comm_on_both_ranks(pair):
    a, b = pair(({1: "same"}, {0: "elsewhere"}))             # a believes b is local; b does not
    a.node = "same"
    a._shm_peers = frozenset({1})
    p, view = _device_bytes(MiB, seed=6)
    h = a.send(1, 1, 1, 0, FP, view)
    assert a.shm_sends == 1
    for wait in (lambda: b.recv(0, 1, 1, 0, FP, 10), lambda: b.recv(0, 7, 1, 0, FP, 10),
                 lambda: h.wait(10), lambda: a.recv(1, 7, 1, 0, FP, 10)):
        with pytest.raises(Aborted, match="SHM_DATA message from rank 0.*not on this node"):
            wait()                                       # a member's frame is never dropped
    assert b.drops.dropped == 0
    runtime.free(p)


def test_an_abort_wakes_a_sender_waiting_for_its_acknowledgement(pair):
    a, b = pair()
    p, view = _device_bytes(MiB, seed=7)
    h = a.send(1, 1, 1, 0, FP, view)
    errors = []

    def waiter():
        try:
            h.wait(20)
        except Exception as e:
            errors.append(e)
    th = threading.Thread(target=waiter)
    th.start()
    b.abort(1, "rank 1 gave up")                             # the peer aborts the comm
    th.join(10)
    assert not th.is_alive() and isinstance(errors[0], Aborted)
    assert "gave up" in str(errors[0]) and a._acks == {}
    runtime.free(p)


def test_a_bad_notice_fails_the_receive_and_is_still_acknowledged(pair, stranger):
    a, b = pair()
    p, view = _device_bytes(4096, seed=8)
    handle, off = ipc.export(view)
    conn = 0xACE
    s = stranger(b.address, identity=wire.routing_id(b"R", 0, conn))

    def notice(serial, offset, text):
        s.send_multipart(wire.pack(SECRET, wire.Kind.SHM_DATA, sender=0, dest=1, conn=conn,
                                   serial=serial, comm_id=1, seq=1, step=serial, fp=FP,
                                   value=offset, text=text))
    notice(1, 1 << 50, f"16 {handle}")                       # outside the memory
    notice(2, off, f"16 {handle.rsplit(':', 1)[0]}:elsewhere")  # not npusim memory
    for step, match in ((1, "outside"), (2, "not name npusim")):
        with pytest.raises(ShmError, match=match):
            b.recv_into(0, 1, 1, step, FP, 5, lambda v: None)
    notice(3, off, f"16 {handle}")                           # a good one still works
    got = []
    b.recv_into(0, 1, 1, 3, FP, 5, lambda v: got.append(bytes(v)))
    assert got == [view[:16].tobytes()]
    notice(4, off, "sixteen bytes")                          # malformed: a protocol error
    with pytest.raises(Aborted, match="rank 0.*malformed notice 'sixteen bytes'"):
        b.recv_into(0, 1, 1, 4, FP, 5, lambda v: None)
    assert b.drops.dropped == 0
    runtime.free(p)
