"""The shared-memory data path: runtime.ipc, and notices of device memory through the rings of
ProcessTransport between ranks of one node."""
import os
import secrets
import threading

import numpy as np
import pytest

import runtime
from hccl import wire
from hccl.transport import Aborted, PeerTimeout, ProcessTransport, shm
from hccl.transport.base import DONE
from hccl.transport.local import ShmError
from hccl.transport.zmq import ACK_STEP
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


# -- ProcessTransport: notices through the rings ------------------------------------------------
JOB = "shmpath" + secrets.token_hex(3)
NOTICE = int(wire.Kind.SHM_DATA)


@pytest.fixture
def pair(monkeypatch, device):
    """Two transports of one node (ranks as threads of this process), shared memory from 64 KiB."""
    if not shm.available():
        pytest.skip("shared memory runs on x86-64 Linux only (shm.available)")
    monkeypatch.setenv("NPUSIM_SHM_MIN_BYTES", str(64 << 10))
    made = []

    def make(nodes=None, use_shm=True):
        a, b = (ProcessTransport(r, 2, SECRET, shm=use_shm, job=JOB) for r in (0, 1))
        addresses = {0: a.address, 1: b.address}
        segments = {0: a.segment, 1: b.segment}
        nodes = nodes or ({1: a.node}, {0: b.node})
        a.connect(addresses, nodes[0], segments)
        b.connect(addresses, nodes[1], segments)
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
    assert a.pending() == 0 and b.pending() == 0     # acknowledgements are taken, not left
    runtime.free(p)


def test_host_small_and_other_node_payloads_take_no_notice(pair):
    a, b = pair()
    host = np.random.default_rng(3).integers(0, 256, MiB, dtype=np.uint8)
    p, view = _device_bytes(MiB, seed=4)
    a.send(1, 1, 1, 0, FP, host).wait(10)                    # not device memory: the socket
    a.send(1, 1, 1, 1, FP, view[:1000]).wait(10)             # below NPUSIM_SHM_MIN_BYTES: a slot
    assert a.shm_sends == 0 and a.ring_sends == 1
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 0, FP, 10), np.uint8), host)
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 1, FP, 10), np.uint8), view[:1000])
    c, d = pair(({1: "another node"}, {0: "another node"}))
    c.send(1, 1, 1, 0, FP, view).wait(10)
    assert c.shm_sends == 0 and c.ring_sends == 0 and c.local_peers == []
    assert np.array_equal(np.frombuffer(d.recv(0, 1, 1, 0, FP, 10), np.uint8), view)
    runtime.free(p)


def test_no_shared_memory_when_switched_off(pair):
    a, b = pair(use_shm=False)                               # what NPUSIM_SHM=0 builds
    assert a.segment == "" and a.local_peers == []
    p, view = _device_bytes(MiB, seed=5)
    a.send(1, 1, 1, 0, FP, view).wait(10)
    assert a.shm_sends == 0 and a.ring_sends == 0
    assert np.array_equal(np.frombuffer(b.recv(0, 1, 1, 0, FP, 10), np.uint8), view)
    runtime.free(p)


@pytest.mark.parametrize("kind", ["SHM_DATA", "SHM_ACK"])
def test_a_notice_or_acknowledgement_over_the_socket_aborts_every_comm(pair, stranger, kind):
    # notices travel only through the rings; an acknowledgement through the socket only from a
    # rank with a ring here (its ring was full)
    a, b = pair(({1: "same"}, {0: "elsewhere"}))             # b sees a as another node's
    conn = 0xACE
    s = stranger(b.address, identity=wire.routing_id(b"R", 0, conn))
    s.send_multipart(wire.pack(SECRET, wire.Kind[kind], sender=0, dest=1, conn=conn, serial=1,
                               comm_id=1, seq=1, step=ACK_STEP, fp=FP, text="16 x"))
    for wait in (lambda: b.recv(0, 1, 1, 0, FP, 10), lambda: a.recv(1, 7, 1, 0, FP, 10)):
        with pytest.raises(Aborted, match=f"{kind} message from rank 0"):
            wait()                                       # a member's frame is never dropped
    assert b.drops.dropped == 0


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
    assert "gave up" in str(errors[0]) and a.pending() == 0
    runtime.free(p)


def test_a_bad_notice_fails_the_receive_and_is_still_acknowledged(pair):
    a, b = pair()
    a.make_pair(1)                    # pairs are made at first use: map b's inbox for a.channel
    p, view = _device_bytes(4096, seed=8)
    handle, off = ipc.export(view)

    def notice(step, offset, text):
        assert a.channel.post(1, NOTICE, 1, 1, step, FP, offset, text.encode())
    notice(1, 1 << 50, f"16 {handle}")                       # outside the memory
    notice(2, off, f"16 {handle.rsplit(':', 1)[0]}:elsewhere")  # not npusim memory
    for step, match in ((1, "outside"), (2, "not name npusim")):
        with pytest.raises(ShmError, match=match):
            b.recv_into(0, 1, 1, step, FP, 5, lambda v: None)
    for step in (1, 2):                                       # acknowledged all the same
        a.recv(1, 1, 1, step | ACK_STEP, FP, 5)
    notice(3, off, f"16 {handle}")                           # a good one still works
    got = []
    b.recv_into(0, 1, 1, 3, FP, 5, lambda v: got.append(bytes(v)))
    assert got == [view[:16].tobytes()]
    notice(4, off, "sixteen bytes")                          # malformed: a protocol error
    with pytest.raises(Aborted, match="rank 0.*malformed notice b'sixteen bytes'"):
        b.recv_into(0, 1, 1, 4, FP, 5, lambda v: None)
    assert b.drops.dropped == 0
    runtime.free(p)
