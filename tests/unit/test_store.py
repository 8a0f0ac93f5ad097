"""hccl.store over real ZeroMQ sockets, server and clients as threads of this process."""
import logging
import os
import pickle
import resource
import secrets
import socket
import struct
import threading
import time

import pytest
import zmq

from hccl import wire
from hccl.store import StoreClient, StoreError, StoreServer, StoreTimeout
from hccl.wire import Kind

pytestmark = pytest.mark.timeout(20)

SECRET = secrets.token_bytes(32)


from zmq_fixtures import _our_threads, no_leftovers, pyzmq_gc_started, stranger, warnings_of  # noqa: F401 (fixtures)


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0, SECRET, name="test-store") as srv:
        yield srv


@pytest.fixture
def clients(server):
    made = []

    def make(timeout=5.0, secret=SECRET):
        c = StoreClient("127.0.0.1", server.port, secret, timeout=timeout)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


@pytest.fixture
def client(clients):
    return clients()


# -- the operations ------------------------------------------------------------------------------
def test_set_get_overwrite_and_binary_values(client, server):
    assert server.port > 0 and server.address == f"tcp://127.0.0.1:{server.port}"
    client.set("a", b"1")
    assert client.get("a") == b"1"
    client.set("a", b"\x00\xff" * 3)
    assert client.get("a") == b"\x00\xff" * 3
    client.set("empty", b"")
    assert client.get("empty") == b""
    client.set("text", "héllo")
    assert client.get("text") == "héllo".encode()
    blob = os.urandom(4 << 20)
    client.set("blob", blob)
    assert client.get("blob") == blob
    client.set("ключ/π", bytearray(b"uni"))
    assert client.get("ключ/π") == b"uni"


def test_add_counts_and_reads_as_decimal(client):
    assert client.add("n", 5) == 5
    assert client.add("n", -7) == -2
    assert client.add("n", 0) == -2
    assert client.get("n") == b"-2"
    client.set("m", b"40")
    assert client.add("m", 2) == 42
    client.set("s", b"not a number")
    with pytest.raises(StoreError, match="not an integer"):
        client.add("s", 1)
    client.set("big", str((1 << 63) - 1).encode())
    with pytest.raises(StoreError, match="overflows"):
        client.add("big", 1)


def test_check_delete(client):
    assert client.check([]) is True
    assert client.check(["x"]) is False
    client.set("x", b"")
    client.set("y", b"1")
    assert client.check(["x", "y"]) is True
    assert client.check(["x", "y", "z"]) is False
    assert client.delete("x") is True
    assert client.delete("x") is False
    assert client.check(["x"]) is False


def test_compare_set_follows_tcpstore(client):
    assert client.compare_set("k", b"", b"v1") == b"v1"          # missing + empty expected: set
    assert client.compare_set("k", b"nope", b"v2") == b"v1"      # mismatch: current value
    assert client.compare_set("k", b"v1", b"v3") == b"v3"        # match: swapped
    assert client.get("k") == b"v3"
    assert client.compare_set("missing", b"e", b"d") == b"e"     # missing + expected: untouched
    assert client.check(["missing"]) is False


def test_bad_keys_and_values_rejected_at_the_call(client):
    with pytest.raises(ValueError, match="NUL"):
        client.set("a\0b", b"")
    with pytest.raises(ValueError):
        client.get(123)
    with pytest.raises(ValueError, match="MiB"):
        client.set("huge", b"\0" * (64 << 20))
    with pytest.raises(ValueError):
        client.get("a", timeout=-1)
    with pytest.raises(ValueError):
        StoreClient("127.0.0.1", 1, SECRET, timeout=0)


# -- blocking and timeouts -----------------------------------------------------------------------
def test_blocking_get_is_woken_by_set(clients):
    waiter, setter = clients(), clients()
    got, started = [], threading.Event()

    def wait_for_key():
        started.set()
        got.append((waiter.get("late", timeout=10), time.monotonic()))
    t = threading.Thread(target=wait_for_key)
    t.start()
    started.wait()
    assert not waiter.check(["late"])
    t_set = time.monotonic()
    setter.set("late", b"here")
    t.join(5)
    assert got and got[0][0] == b"here" and got[0][1] - t_set < 1.0


def test_wait_is_woken_when_the_last_key_arrives_and_add_counts_as_set(clients):
    waiter, setter = clients(), clients()
    done = threading.Event()
    errors = []

    def run():
        try:
            waiter.wait(["a", "b", "n"], timeout=10)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)
        done.set()
    t = threading.Thread(target=run)
    t.start()
    setter.set("a", b"1")
    setter.add("n", 1)
    assert not done.is_set() or errors
    setter.set("b", b"2")
    assert done.wait(5) and not errors
    t.join()


def test_deleted_key_keeps_the_waiter_waiting(clients):
    waiter, setter = clients(), clients()
    setter.set("a", b"1")
    setter.delete("a")
    with pytest.raises(StoreTimeout) as ei:
        waiter.wait(["a"], timeout=0.2)
    assert ei.value.missing == ["a"]


def test_get_timeout_names_the_missing_key(client):
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout) as ei:
        client.get("never", timeout=0.3)
    waited = time.monotonic() - t0
    assert 0.29 <= waited < 10          # at least the timeout; the upper bound is load slack
    assert ei.value.missing == ["never"] and "never" in str(ei.value)
    assert isinstance(ei.value, TimeoutError)


def test_wait_timeout_lists_only_the_missing_keys(client):
    client.set("there", b"")
    with pytest.raises(StoreTimeout) as ei:
        client.wait(["there", "gone1", "gone2"], timeout=0.2)
    assert ei.value.missing == ["gone1", "gone2"]
    e = pickle.loads(pickle.dumps(ei.value))
    assert e.missing == ["gone1", "gone2"] and str(e) == str(ei.value)


def test_zero_timeout_answers_at_once(client):
    t0 = time.monotonic()
    with pytest.raises(StoreTimeout):
        client.get("nope", timeout=0)
    assert time.monotonic() - t0 < 4     # answered, not held for the client's 5 s default
    client.set("yes", b"1")
    assert client.get("yes", timeout=0) == b"1"


def test_default_timeout_applies(clients):
    c = clients(timeout=0.2)
    with pytest.raises(StoreTimeout):
        c.get("nope")


def test_no_server_times_out_with_a_hint():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with StoreClient("127.0.0.1", port, SECRET, timeout=0.2) as c:
        with pytest.raises(StoreTimeout, match="no reply"):
            c.set("a", b"1")


# -- threads and concurrency ---------------------------------------------------------------------
def test_concurrent_clients_and_threads_sharing_one_client(clients):
    shared = clients()
    own = [clients() for _ in range(4)]
    barrier = threading.Barrier(8)

    def work(c):
        barrier.wait()
        for _ in range(50):
            c.add("counter", 1)
    threads = [threading.Thread(target=work, args=(c,)) for c in own + [shared] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert shared.get("counter") == b"400"


def test_a_thread_blocked_in_get_does_not_block_other_threads_of_the_same_client(client):
    got = []
    t = threading.Thread(target=lambda: got.append(client.get("k", timeout=10)))
    t.start()
    client.set("k", b"v")            # same client, another thread: must not wait behind get
    t.join(5)
    assert got == [b"v"]


def test_close_interrupts_a_blocked_request(client):
    errors, started = [], threading.Event()

    def run():
        started.set()
        try:
            client.get("never", timeout=30)
        except Exception as e:
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    started.wait()
    client.check(["x"])              # the server is up, the get is in flight (or about to be)
    client.close()
    t.join(5)
    assert not t.is_alive() and isinstance(errors[0], StoreError)
    with pytest.raises(StoreError, match="closed"):
        client.set("a", b"")


def test_closing_the_server_answers_parked_waiters():
    srv = StoreServer("127.0.0.1", 0, SECRET).start()
    errors, started = [], threading.Event()
    with StoreClient("127.0.0.1", srv.port, SECRET, timeout=30) as c:
        def run():
            started.set()
            try:
                c.wait(["never"])
            except Exception as e:
                errors.append(e)
        t = threading.Thread(target=run)
        t.start()
        started.wait()
        assert _eventually(lambda: srv.stats()["waiters"] == 1)
        srv.close()
        t.join(5)
        assert not t.is_alive()
    assert isinstance(errors[0], StoreError) and "closed" in str(errors[0])


def test_idle_server_with_parked_waiters_burns_no_cpu(clients, server):
    waiter = clients()
    done = threading.Event()
    t = threading.Thread(target=lambda: (pytest.raises(StoreTimeout, waiter.get, "x", 0.6),
                                         done.set()))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t.start()
    assert done.wait(5)
    after = resource.getrusage(resource.RUSAGE_SELF)
    t.join()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.3, f"{cpu:.3f} s of CPU while idle for 0.6 s (a spinning wait burns 0.6 s)"


def test_port_in_use_is_a_clear_error(server):
    with pytest.raises(OSError, match="cannot bind"):
        StoreServer("127.0.0.1", server.port, SECRET)


def test_server_needs_a_secret():
    with pytest.raises(ValueError):
        StoreServer("127.0.0.1", 0)


# -- strangers -----------------------------------------------------------------------------------
def _eventually(predicate, timeout=5.0):
    """Poll a server statistic (no event exists for "a request reached the server")."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _answers_quickly(client, key="probe"):
    n = client.add(key, 1)                 # a stalled server would raise StoreTimeout (5 s)
    assert client.get(key) == str(n).encode()


def _request(kind, key, serial, *, sender=7, conn=0xABCD, secret=SECRET, value=0, payloads=()):
    return wire.pack(secret, kind, sender=sender, dest=wire.STORE_ID, conn=conn, serial=serial,
                     value=value, text=key, payloads=payloads)


def test_garbage_is_dropped_and_logged(server, client, stranger, warnings_of):
    s = stranger(f"tcp://127.0.0.1:{server.port}")
    records = warnings_of("hccl.store")
    s.send(b"garbage")
    s.send_multipart([b"", b"REQ-style"])
    s.send_multipart([b"\0" * wire.MIN_HEADER, b"payload"])
    s.send(b"")
    assert server.drops.wait_for(4, 5)
    assert server.stats()["dropped"] >= 4 and server.stats()["waiters"] == 0
    assert any("dropped a message" in r.getMessage() for r in records)
    _answers_quickly(client)


def test_wrong_key_is_dropped_and_gets_no_answer(server, clients):
    before = server.drops.dropped
    intruder = clients(timeout=0.3, secret=b"not the job secret")
    with pytest.raises(StoreTimeout, match="secret"):
        intruder.set("a", b"evil")
    assert server.drops.wait_for(before + 1, 5)
    good = clients()
    assert good.check(["a"]) is False
    _answers_quickly(good)


def test_truncated_and_mismatched_frames_are_dropped(server, client, stranger):
    ident = wire.routing_id(b"C", 7, 0xABCD)
    s = stranger(f"tcp://127.0.0.1:{server.port}", identity=ident)
    frames = _request(Kind.SET, "t", 1, payloads=[b"value"])
    s.send_multipart([frames[0][:-1], frames[1]])            # header cut short
    s.send_multipart(_request(Kind.SET, "t", 2, payloads=[b"x"], sender=8))  # identity mismatch
    assert server.drops.wait_for(2, 5)
    # a signed header whose payload lost frames or bytes is a member's: refused, not dropped
    for serial, payloads, why in ((3, [], "0 payload frames, header announces 1"),
                                  (4, [b"valu"], "payload is 4 bytes, header announces 5")):
        signed = _request(Kind.SET, "t", serial, payloads=[b"value"])[0]
        s.send_multipart([signed, *payloads])
        assert s.poll(5000)
        reply = wire.unpack(s.recv_multipart(), SECRET, dest=7)
        assert reply.kind == Kind.ERROR and reply.seq == serial and why in reply.text
    assert server.stats()["dropped"] == 2
    assert client.check(["t"]) is False
    _answers_quickly(client)


def test_replayed_request_is_dropped(server, client, stranger):
    ident = wire.routing_id(b"C", 7, 0xABCD)
    s = stranger(f"tcp://127.0.0.1:{server.port}", identity=ident)
    captured = _request(Kind.ADD, "ctr", 1, value=10)
    s.send_multipart(captured)                   # the original
    reply = wire.unpack(s.recv_multipart(), SECRET, dest=7)
    assert reply.kind == Kind.OK and reply.value == 10 and reply.seq == 1
    before = server.drops.dropped
    s.send_multipart(captured)                   # the replay
    assert server.drops.wait_for(before + 1, 5)
    assert client.get("ctr") == b"10"
    assert s.poll(100) == 0                      # and no reply to it


def test_huge_frame_announcement_drops_the_connection(server, client):
    s = _zmtp_dealer(server.port)
    try:
        s.sendall(b"\x02" + struct.pack("!Q", 1 << 40))   # "a 1 TiB frame follows"
        assert s.recv(16) == b""                           # libzmq hangs up, allocates nothing
    finally:
        s.close()
    s = _zmtp_dealer(server.port)
    try:
        s.sendall(b"\x02" + struct.pack("!Q", (64 << 20) + 1))
        assert s.recv(16) == b""
    finally:
        s.close()
    _answers_quickly(client)


def test_raw_tcp_garbage_and_half_open_connections_do_not_stall(server, client):
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    try:
        socks[0].sendall(os.urandom(4096))
        socks[1].sendall(b"\xff" + b"\0" * 8)          # a greeting that never completes
        _answers_quickly(client)
    finally:
        for s in socks:
            s.close()


def test_flood_of_garbage_does_not_slow_legit_clients_or_flood_the_log(server, client, stranger,
                                                                      warnings_of):
    records = warnings_of("hccl.store")
    s = stranger(f"tcp://127.0.0.1:{server.port}")
    before = server.drops.dropped
    for i in range(3000):
        s.send_multipart([os.urandom(wire.MIN_HEADER), b"x"])
    _answers_quickly(client)
    assert server.drops.wait_for(before + 3000, 10)
    assert len([r for r in records if r.name == "hccl.store"]) <= 12


def _zmtp_dealer(port: int) -> socket.socket:
    """A raw TCP connection that completes a ZMTP 3.0 NULL handshake as a DEALER."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32)
    _recv_exact(s, 64)                                          # the server's greeting
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack("!I", 6) + b"DEALER"
    s.sendall(bytes([0x04, len(body)]) + body)
    flags, size = _recv_exact(s, 2)                             # the server's READY
    _recv_exact(s, size)
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf
