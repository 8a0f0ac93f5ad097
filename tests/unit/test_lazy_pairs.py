"""Pairs made at first use (hccl.transport.process) and the store's many-client paths
(hccl.store: multi_get, waiters of many keys): transports and store as threads of this process."""
import secrets
import threading
import time

import numpy as np
import pytest

from hccl.store import StoreClient, StoreServer, StoreTimeout
from hccl.transport import shm
from hccl.transport.base import PeerGone
from hccl.transport.process import ProcessTransport
from tests import bounds

pytestmark = pytest.mark.timeout(60)

SECRET = secrets.token_bytes(32)
FP = (1, 64, 4, 0, -1)
JOB = "lazytest" + secrets.token_hex(3)


@pytest.fixture
def world():
    made = []

    def make(size, use_shm=False, nodes=None):
        ts = [ProcessTransport(r, size, SECRET, shm=use_shm, job=JOB) for r in range(size)]
        addresses = {t.rank: t.address for t in ts}
        nodes = nodes or {t.rank: t.node for t in ts}
        segments = {t.rank: t.segment for t in ts}
        for t in ts:
            t.connect(addresses, nodes, segments)
        for t in ts:
            t.unlink_segment()            # as init does after its barrier: mapping goes by /proc
        made.extend(ts)
        return ts
    yield make
    for t in made:
        t.close(linger=0)


@pytest.mark.parametrize("use_shm", [False, True])
def test_pairs_are_made_at_first_use_only(world, use_shm):
    if use_shm and not shm.available():
        pytest.skip("shared memory runs on x86-64 Linux only (shm.available)")
    ts = world(6, use_shm)
    assert all(t.paired == [] for t in ts)
    bound = [ts[0].pair(p) for p in range(6)]                # binding connects nothing
    assert ts[0].paired == [] and len(ts[0].sockets.pairs) == 0
    x = np.arange(100, dtype=np.float32)
    bound[1].send(1, 1, 0, FP, memoryview(x).cast("B")).wait(5)
    got = ts[1].recv(0, 1, 1, 0, FP, 5)
    assert np.array_equal(np.frombuffer(got, np.float32), x)
    assert ts[0].paired == [1] and ts[1].paired == [0]
    assert all(t.paired == [] for t in ts[2:])
    assert ts[0].pair(1) is not bound[1]                       # the real pair, once made
    if use_shm:
        assert ts[0].ring_sends == 1 and ts[0].local_peers == [1, 2, 3, 4, 5]
        assert set(ts[0].channel.peers) == {1}                 # one inbox mapped, not five


def test_an_abort_reaches_peers_never_paired(world):
    ts = world(4)
    ts[0].abort(7, "stop")
    for t in ts[1:]:
        with pytest.raises(Exception, match="stop"):
            t.recv(2 if t.rank != 2 else 3, 7, 1, 0, FP, 10)
    assert sorted(ts[0].sockets.pairs) == [1, 2, 3]          # the sockets it took
    assert not any(p.watched for p in ts[0].sockets.pairs.values())   # no link monitors
    assert ts[0].paired == []                                  # and no pairs for collectives
    ts[0].send(1, 8, 1, 0, FP, b"later")                       # used later: watched from then
    assert ts[0].sockets.pairs[1].watched and ts[0].paired == [1]
    assert bytes(ts[1].recv(0, 8, 1, 0, FP, 5)) == b"later"


def test_a_peer_of_another_node_gone_before_the_first_message_is_named(world):
    """Its address refuses the first connection: named at once, not after a timeout."""
    a, b = world(2, nodes={0: "node-a", 1: "node-b"})
    b.close(linger=0)
    t0 = time.monotonic()
    a.send(1, 1, 1, 0, FP, b"x")
    with pytest.raises(PeerGone, match="rank 1.*refused the connection"):
        a.recv(1, 1, 1, 0, FP, 60)
    assert time.monotonic() - t0 < bounds.DEAD_PEER_ASSERTED


def test_a_peer_that_closed_its_transport_before_being_mapped_is_named(world):
    if not shm.available():
        pytest.skip("shared memory runs on x86-64 Linux only (shm.available)")
    a, b = world(2, use_shm=True)
    b.send(0, 1, 1, 0, FP, b"before").wait(5)   # posted into a's ring before b closes
    b.close(linger=0)
    a.send(1, 1, 1, 0, FP, b"to a closed peer")  # its inbox cannot be mapped: not an error here
    assert bytes(a.recv(1, 1, 1, 0, FP, 5)) == b"before"    # what it posted is still taken
    with pytest.raises(PeerGone, match="rank 1.*inbox cannot be mapped"):
        a.recv(1, 1, 1, 1, FP, 60)


# -- the store with many clients -----------------------------------------------------------------
@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0, SECRET, name="test-store") as srv:
        yield srv


def test_multi_get_waits_for_every_key_and_names_the_missing(server):
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=5) as c:
        c.set("k1", b"one")
        threading.Timer(0.2, lambda: StoreClient("127.0.0.1", server.port, SECRET,
                                                 timeout=5).set("k0", b"zero")).start()
        assert c.multi_get(["k0", "k1", "k0"], timeout=5) == [b"zero", b"one", b"zero"]
        with pytest.raises(StoreTimeout) as e:
            c.multi_get(["k1", "nope", "never"], timeout=0.2)
        assert sorted(e.value.missing) == ["never", "nope"]
        assert c.multi_get([]) == []


def test_a_barrier_of_many_clients_with_a_key_deleted_midway(server):
    """64 clients each wait for all 64 keys; one key is set, deleted and set again while they
    wait: nobody is released before the last key is there, and everybody is after."""
    n = 64
    keys = [f"b/{r}" for r in range(n)]
    done, errors = [], []

    def rank(r):
        try:
            with StoreClient("127.0.0.1", server.port, SECRET, timeout=20) as c:
                if r:
                    c.set(keys[r], b"1")
                c.wait(keys, timeout=20)
                done.append((r, c.check(keys)))
        except Exception as e:      # reported below
            errors.append(e)
    ths = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in ths:
        t.start()
    with StoreClient("127.0.0.1", server.port, SECRET, timeout=20) as c:
        c.wait(keys[1:], timeout=20)
        c.set(keys[1] + "x", b"")           # unrelated
        assert c.delete(keys[1])
        c.set(keys[0], b"1")                # all but keys[1]: nobody may leave
        time.sleep(0.2)                     # what a wrong release would need to show (no sync)
        assert done == [] and server.stats()["waiters"] == n
        c.set(keys[1], b"1")
    for t in ths:
        t.join(20)
    assert errors == [] and sorted(done) == [(r, True) for r in range(n)]
    assert server.stats()["waiters"] == 0
