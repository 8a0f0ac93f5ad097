"""Raw memory of one simulated NPU: a sparse memfd mapped once per process.

Design note. The device's HBM is one anonymous shared-memory file (``memfd_create``) sized to
twice the capacity and never written until used, so an idle 16 GiB device costs no host RAM:
pages are committed when touched and returned with ``MADV_REMOVE`` when the caching pool releases
a segment. The file is a memfd rather than a named /dev/shm segment so that it can never be left
behind: the kernel frees it when the last process holding it exits, whatever killed that process.
Another process of the same node can still map it (``/proc/<pid>/fd/<fd>``, see ``ipc_handle``),
which is what a shared-memory data path between ranks needs.

Every reservation is charged to the device's *card* (``runtime/memory/card.py``), which the other
processes of the node that use the device share: ``reserve`` raises ``card.CardFullError`` (a
MemoryError, which the pool reports as its OutOfMemoryError) when they leave no room.

Device pointers are addresses in a per-device address space starting at ``(device_id + 1) << 40``,
so a pointer names its device and 0 is never valid. The address space is twice the capacity so
that releasing and reserving segments of mixed sizes cannot fragment it into failure before the
capacity (which the pool enforces) is reached.
"""
from __future__ import annotations

import bisect
import mmap
import os
import threading

import numpy as np

from .. import config
from .card import Card

PAGE = 4096
_MIN_SPAN = 64 << 20


def device_base(device_id: int) -> int:
    """First address of ``device_id``'s address space."""
    return (device_id + 1) << 40


class DeviceMemory:
    """Address-space reservations over one memfd; the pool's raw allocator."""

    def __init__(self, device_id: int, capacity: int):
        self.device_id = device_id
        self.capacity = capacity
        self.base = device_base(device_id)
        span = max(2 * capacity, _MIN_SPAN)
        self.span = (span + PAGE - 1) // PAGE * PAGE
        self.name = f"npusim-{config.job().job_id}-dev{device_id}"   # a memfd label only
        self._fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        os.ftruncate(self._fd, self.span)
        self._mm = mmap.mmap(self._fd, self.span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self._mm, dtype=np.uint8)
        # free address ranges as parallel sorted lists of offsets and lengths
        self._free_off = [0]
        self._free_len = [self.span]
        self._lock = threading.Lock()
        # this process's place on the device's card, which other processes of the node share
        # (runtime/memory/card.py): every segment is charged there
        try:
            self.card = Card(device_id, capacity)
        except BaseException:
            self.close()
            raise

    def reserve(self, nbytes: int) -> int:
        """Take ``nbytes`` (rounded to pages) of address space, charged to the card; raises
        card.CardFullError (a MemoryError) when the card's other holders leave no room, and
        MemoryError if no address range fits."""
        n = (nbytes + PAGE - 1) // PAGE * PAGE
        self.card.charge(n)
        try:
            return self._take(n)
        except BaseException:
            self.card.uncharge(n)
            raise

    def _take(self, n: int) -> int:
        with self._lock:
            for i, length in enumerate(self._free_len):
                if length >= n:
                    off = self._free_off[i]
                    if length == n:
                        del self._free_off[i], self._free_len[i]
                    else:
                        self._free_off[i] = off + n
                        self._free_len[i] = length - n
                    return self.base + off
        raise MemoryError(f"device {self.device_id}: no {n} bytes of address space left")

    def release(self, addr: int, nbytes: int) -> None:
        """Return a reservation: its pages go back to the host at once."""
        off = addr - self.base
        n = (nbytes + PAGE - 1) // PAGE * PAGE
        self._mm.madvise(mmap.MADV_REMOVE, off, n)
        self.card.uncharge(n)
        with self._lock:
            i = bisect.bisect_left(self._free_off, off)
            self._free_off.insert(i, off)
            self._free_len.insert(i, n)
            # merge with the right, then the left neighbour
            if i + 1 < len(self._free_off) and off + n == self._free_off[i + 1]:
                self._free_len[i] += self._free_len.pop(i + 1)
                self._free_off.pop(i + 1)
            if i > 0 and self._free_off[i - 1] + self._free_len[i - 1] == off:
                self._free_len[i - 1] += self._free_len.pop(i)
                self._free_off.pop(i)

    def view(self, addr: int, nbytes: int) -> np.ndarray:
        """A writable uint8 numpy view of ``nbytes`` at ``addr`` (no checks: callers validate)."""
        off = addr - self.base
        return self.array[off:off + nbytes]

    def ipc_handle(self) -> str:
        """A path another process of this node can open and mmap to reach this device's memory."""
        return f"/proc/{os.getpid()}/fd/{self._fd}"

    @property
    def handle(self) -> str:
        """This memory's name for ``ipc.PeerMemory`` in another process of the node."""
        return f"{os.getpid()}:{self._fd}:{self.name}"

    def close(self) -> None:
        card = self.__dict__.pop("card", None)
        if card is not None:
            card.close()
        self.array = None
        try:
            self._mm.close()
        except BufferError:  # a numpy view is still alive somewhere; the kernel frees it at exit
            pass
        os.close(self._fd)
