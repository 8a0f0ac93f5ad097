"""Device memory shared between the processes of one node (the shared-memory data path).

Design note. Each device's memory is one memfd mapped once per process (``device_memory``).
``export`` tells whether a host buffer lies in such a mapping and names it: a *handle*
``"<pid>:<fd>:<memfd name>"`` and an offset. Another process of the same node ``attach``-es the
handle: it opens ``/proc/<pid>/fd/<fd>`` (same user: the kernel allows it without ptrace rights
beyond reading), checks that the link names the same memfd (a recycled pid or fd cannot alias
another file) and maps it read-only, once; ``PeerMemory.view`` then returns bounded views.
This is how hccl moves large payloads between ranks of a node with one copy instead of a trip
through sockets.

``node_id`` identifies "the same node" for that purpose (a node is what npurun calls
one). Under npurun it is the node npurun started the rank on (``NPUSIM_NODE``: the job id and
``--node-rank``, in the worker environment) together with the kernel's boot id and this process's
PID namespace: two npurun nodes on one machine (network namespaces sharing the PID namespace, or
two npurun on loopback) are two nodes, whose data crosses the network path so that a slow or
cut link between them acts on it, even though each could open the other's ``/proc/<pid>``.
Without a launcher (root-info ranks started by hand) it is the boot id and PID namespace alone:
the ranks that can attach each other's handles. The boot id and PID namespace stay part of it
under npurun too, so two containers on one host never take each other's ``/proc/<pid>`` for
their own. Everything that depends on "the same node" (shared memory, liveness by pid, links
without heartbeats) follows from this id, which every rank publishes at communicator init.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading

import numpy as np

from .. import config
from ..current import contexts_by_device
from ..errors import MemoryAccessError

_node_id: str | None = None
NODE_ENV = "NPUSIM_NODE"     # set by npurun for its workers: "<job id>/<node rank>"


class PeerGoneError(MemoryAccessError):
    """The process that owns the memory has exited: its memory cannot be attached any more."""


def launcher_node() -> str | None:
    """The node npurun started this process on (``NPUSIM_NODE``), or None without npurun.

    Raises ValueError naming the variable when its value could not travel in the init record
    (a line of text: no whitespace, at most 200 characters)."""
    return config.node()


def node_id() -> str:
    """An id shared exactly by the processes of one node (see the module note): the ranks that
    npurun started as one node, or without npurun those that can attach each other's handles."""
    global _node_id
    if _node_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            ns = os.readlink("/proc/self/ns/pid")
        except OSError:                     # no procfs: nothing can be attached
            boot, ns = f"no-procfs-{os.getpid()}", ""
        node = launcher_node()
        _node_id = f"{boot}/{ns}" if node is None else f"{boot}/{ns}/npurun:{node}"
    return _node_id


def export(buf: np.ndarray) -> tuple[str, int] | None:
    """``(handle, offset)`` of the device mapping that holds all of ``buf``, else None."""
    lo = buf.__array_interface__["data"][0]
    hi = lo + buf.nbytes
    for ctx in list(contexts_by_device.values()):
        mem = ctx.memory
        arr = mem.array
        if arr is None:
            continue
        base = arr.__array_interface__["data"][0]
        if base <= lo and hi <= base + mem.span:
            return mem.handle, lo - base
    return None


def _exited(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (which has no file descriptors left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


class PeerMemory:
    """Another process's device mapping, mapped read-only into this one."""

    def __init__(self, handle: str):
        try:
            pid_s, fd_s, name = handle.split(":", 2)
            pid, fd = int(pid_s), int(fd_s)
        except ValueError:
            raise MemoryAccessError(f"{handle!r} is not a device memory handle") from None
        if not name.startswith("npusim-") or "/" in name:
            raise MemoryAccessError(f"{handle!r} does not name npusim device memory")
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
            fdesc = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ESRCH or _exited(pid):
                raise PeerGoneError(f"process {pid} has exited; its device memory {name} is "
                                    "gone") from None
            raise MemoryAccessError(
                f"cannot open device memory {name} of process {pid} ({path}): {e.strerror}. "
                "The shared-memory path needs the ranks of a node to run as one user in one "
                "PID namespace; set NPUSIM_SHM=0 to send everything over sockets") from None
        try:
            if not target.startswith(f"/memfd:{name}"):
                raise MemoryAccessError(f"{path} is {target!r}, not device memory {name}: the "
                                        "process is gone")
            self.size = os.fstat(fdesc).st_size
            self._mm = mmap.mmap(fdesc, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fdesc)
        self.handle = handle
        self._mv = memoryview(self._mm)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """``nbytes`` read-only bytes at ``offset``; MemoryAccessError outside the mapping."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise MemoryAccessError(f"[{offset}, {offset + nbytes}) is outside device memory "
                                    f"{self.handle} ({self.size} bytes)")
        return self._mv[offset:offset + nbytes]

    def close(self) -> None:
        """Unmap (views still alive keep the mapping until they go)."""
        self._mv.release()
        try:
            self._mm.close()
        except BufferError:
            pass


class PeerMemories:
    """The peer mappings of one user (a transport): attached on first use, closed together."""

    def __init__(self):
        self._maps: dict[str, PeerMemory] = {}
        self._lock = threading.Lock()

    def view(self, handle: str, offset: int, nbytes: int) -> memoryview:
        m = self._maps.get(handle)
        if m is None:
            with self._lock:
                m = self._maps.get(handle)
                if m is None:
                    m = self._maps[handle] = PeerMemory(handle)
        return m.view(offset, nbytes)

    def __len__(self) -> int:
        return len(self._maps)

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
        for m in maps:
            m.close()
