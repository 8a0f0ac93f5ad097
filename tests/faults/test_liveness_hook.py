"""The liveness pieces on their own: a process identity (pid reuse, zombie, stopped) and the one
hook every wait uses (``Transport.dead_peer``): the wait raises ``PeerGone`` after the grace,
still takes what arrived meanwhile, and aborts the communicator naming the dead rank."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hccl import abortrec
from hccl.transport import base, liveness
from hccl.transport.base import Aborted, MailboxPair, PeerGone, Transport

FP = (1, 4, 0, 0, 0)


def test_identity_names_this_process():
    pid, start = liveness.identity().split(":")
    assert int(pid) == os.getpid() and int(start) > 0
    assert liveness.PeerProcess(liveness.identity()).gone() is None


@pytest.mark.timeout(30)
def test_exited_zombie_stopped_and_reused_pids():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peer = liveness.PeerProcess(f"{p.pid}:{liveness._stat(p.pid)[1]}")
        assert peer.gone() is None
        os.kill(p.pid, signal.SIGSTOP)       # stopped is alive
        deadline = time.monotonic() + 10
        while liveness._stat(p.pid)[0] != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness._stat(p.pid)[0] == "T" and peer.gone() is None
        os.kill(p.pid, signal.SIGKILL)       # a zombie (not reaped yet) is gone
        while liveness._stat(p.pid)[0] not in ("Z", "X") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "has exited" in peer.gone()
        # the same pid with another start time is another process
        other = liveness.PeerProcess(f"{os.getpid()}:{liveness._stat(os.getpid())[1] + 1}")
        assert "another process" in other.gone()
    finally:
        p.kill()
        p.wait()
    assert f"pid {p.pid}" in peer.gone()     # reaped: no /proc entry
    with pytest.raises(ValueError, match="pid"):
        liveness.PeerProcess("12x:3")


class _Peer(MailboxPair):
    """Rank 1 as the fake sees it: receives from the mailboxes (what ``deliver`` filed)."""

    __slots__ = ("t", "peer")

    def __init__(self, t, peer):
        self.t, self.peer = t, peer


class Fake(Transport):
    """Two-rank transport whose peer 1 dies when told; records the abort broadcast."""

    def __init__(self):
        super().__init__(0, 2)
        self.dead = None
        self.broadcasts = []
        self._peer = _Peer(self, 1)

    def pair(self, peer):
        return self._peer

    def dead_peer(self, peer):
        return self.dead if peer == 1 else None

    def broadcast_abort(self, comm_id, reason):
        self.broadcasts.append((comm_id, reason))


@pytest.mark.timeout(30)
def test_wait_on_a_dead_peer_raises_peer_gone_and_aborts_naming_it(monkeypatch):
    monkeypatch.setenv("NPUSIM_LIVENESS_INTERVAL", "0.05")
    monkeypatch.setattr(base, "DEAD_PEER_GRACE", 0.2)
    t = Fake()
    t.dead = "its process (pid 7) has exited"
    t0 = time.monotonic()
    with pytest.raises(PeerGone) as ei:
        t.recv(1, 5, 1, 0, FP, timeout=30)
    assert ei.value.peer == 1 and "pid 7" in ei.value.detail
    assert 0.2 <= time.monotonic() - t0 < 20
    [(comm_id, reason)] = t.broadcasts
    assert comm_id == 5 and abortrec.read(reason) == {
        "kind": "dead", "rank": 1, "seen_by": 0,
        "text": "rank 1 is gone: its process (pid 7) has exited (seen by rank 0)"}
    with pytest.raises(Aborted, match="rank 1 is gone"):   # the comm stays aborted here too
        t.recv(1, 5, 2, 0, FP, timeout=1)


@pytest.mark.timeout(30)
def test_what_a_dead_peer_sent_before_dying_is_still_taken(monkeypatch):
    monkeypatch.setenv("NPUSIM_LIVENESS_INTERVAL", "0.05")
    monkeypatch.setattr(base, "DEAD_PEER_GRACE", 5.0)
    t = Fake()
    t.dead = "gone"
    import threading
    threading.Timer(0.3, t.deliver, (1, 5, 1, 0, FP, memoryview(b"abcd"))).start()
    assert bytes(t.recv(1, 5, 1, 0, FP, timeout=30)) == b"abcd"
    assert t.broadcasts == []


@pytest.mark.timeout(30)
def test_a_live_peer_is_only_a_timeout(monkeypatch):
    monkeypatch.setenv("NPUSIM_LIVENESS_INTERVAL", "0.05")
    t = Fake()
    with pytest.raises(base.PeerTimeout):
        t.recv(1, 5, 1, 0, FP, timeout=0.3)
    assert t.broadcasts == []
