"""Point-to-point of the "hccl" torch backend: every (direction, peer) is its own lane.

Design note. torch programs post isend / irecv in any order and wait later: a ring exchange
posts its irecv before its isend on every rank, pipeline parallelism receives activations
while it sends gradients, and ``batch_isend_irecv`` lists receives first. If these ran in call
order on one stream, a receive posted first would block the send queued behind it on both
ranks: a deadlock. So each direction to each peer gets a *lane*: its own runtime stream (the
hccl operations run in order within it, matched by hccl's per-peer sequence numbers) and its own
completer thread (its Works complete in order within it). Lanes never wait for each other or
for the group's collectives, as NCCL's per-peer point-to-point streams; ``batch_isend_irecv``
therefore completes in any posting order without a group call. hccl's own ``send`` / ``recv``
on a user's stream keep their stream-order semantics: only this backend spreads them out.

Receive from any source (``dist.recv(t)`` without ``src``) waits on a short-lived thread until
some peer's next message to this rank has arrived (``Comm.wait_any_sender``), then receives it
on that peer's lane; ``work._source_rank()`` names the peer. Mixing it with a named-source
receive from the same peer while it waits may pair them out of order (MPI matches in posting
order; here the first arrival wins).
"""
from __future__ import annotations

import threading

import runtime
from runtime.errors import NpuError
from runtime.torch.exitgate import GATE

from .work import Completer, Work


class Lanes:
    """The point-to-point lanes of one process group, made on first use."""

    def __init__(self, name: str):
        self._name = name
        self._lanes: dict[tuple[str, int], tuple] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, peer: int) -> tuple:
        """(stream, completer) of direction ``kind`` ("send" / "recv") to group rank ``peer``."""
        key = (kind, peer)
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = (runtime.Stream(name=f"torch {self._name} {kind} {peer}"),
                                           Completer(f"{self._name}-{kind}{peer}"))
            return lane

    def close(self) -> None:
        """Finish what the lanes hold, then stop their threads and streams."""
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for stream, completer in lanes:
            completer.close()
            try:
                stream.synchronize()
                stream.destroy()
            except NpuError:
                pass          # the error was (or will be) delivered to its Work


def recv_anysource(pg, tensors, site: str) -> Work:
    """``pg.recv`` from whichever peer's message arrives first; the Work names it."""
    work = Work("recv", list(tensors))
    device = runtime.get_device()
    box = [work, tensors]       # the thread's references to torch objects, dropped in the gate

    def run():
        runtime.set_device(device)    # the device is per thread, as in CUDA
        error = None
        try:
            src = pg.comm.wait_any_sender()
        except BaseException as e:  # noqa: BLE001 - every failure goes to the waiter
            src, error = -1, e
        if not GATE.enter():          # the interpreter exits (runtime/torch/exitgate.py)
            GATE.keep(box)
            return
        try:
            w, ts = box
            box.clear()
            try:
                if error is None:
                    w.source = src
                    pg.recv(ts, src, site=site).synchronize()   # the data is in, also on npu
            except BaseException as e:  # noqa: BLE001
                error = e
            try:
                w.complete(error)
            finally:
                w = ts = None
        finally:
            GATE.leave()
    threading.Thread(target=run, name=f"hccl-torch-anysource-{pg.comm.name}", daemon=True).start()
    return work
