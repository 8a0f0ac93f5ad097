"""One simulated card shared by the processes of a node: a ledger of who holds its HBM.

Design note. A real NPU's HBM belongs to the card, not to a process: two inference tasks on
device 0 of one server divide it (seed 001), ``npu-smi info`` lists what each holds, and
``aclrtGetMemInfo`` counts them all. Here each process has its own caching pool; the *ledger* of
a device is what makes them one card. It is a small file per (node, device),
``<NPUSIM_CARD_DIR>/node<k>.npu<d>``: a header and one 128-byte *slot* per process that holds the
device, with its pid, process start time, job, rank, capacity and the bytes its pool has
reserved. A pool charges the ledger only when it reserves or releases a segment (the raw
allocator's ``reserve`` / ``release``, runtime/memory/device_memory.py), never per tensor: the
allocation hot path is untouched.

Correct across processes without trusting any CPU's memory model: every read and write of the
ledger happens under an fcntl lock (an open-file-description lock, ``F_OFD_SETLK``, on the
header's first byte), with ``pread`` / ``pwrite``; nothing is mapped. A charge reads every
slot, sums the live holders, refuses when this process's reservation would take the card past
its capacity, and writes its own slot, all under that lock.

A process that dies holding memory gives it back by itself: each holder also keeps an OFD lock on
its own slot, which the kernel drops when the process exits, however it dies (SIGKILL
included). A slot whose lock is free is dead, whatever its bytes say; so there is no pid to
check and no pid reuse to guard against (the pid and its start time, from /proc/<pid>/stat, are
kept to name the holder). A forked child closes the ledger descriptors it inherited
(``os.register_at_fork``), so a DataLoader worker does not keep its dead parent's slot alive.

The last holder removes the ledger. A ledger is valid at any time (dead slots are simply not
counted, a new holder reuses the first dead slot), so removing it is only tidiness, and must not
race with a process opening it at that moment. The holder that leaves (``close``, also at the
interpreter's exit) unlinks the file under the header lock when no live slot is left; a newcomer
takes the same lock before it claims a slot and then checks that its descriptor is still the
file's (``st_nlink`` > 0), else opens again: it never charges an unlinked file that no one else
reads. The default directory, ``/dev/shm/npusim.cards.<uid>``, goes too when it is empty (a
newcomer that loses it meanwhile creates it again). A holder killed with SIGKILL leaves its
ledger until the next holder of that card leaves. Its name is outside the ``npusim-<job id>-*``
pattern of job segments that npurun and CI remove (docs/memory.md); the directory is the user's
own (mode 0700, checked: owner, no symlink).

Which processes share a card: those with the same ``NPUSIM_CARD_DIR`` and node. The node is
npurun's node rank (``NPUSIM_NODE`` = "<job id>/<node rank>"), 0 without npurun: this machine's
cards are node 0's; the ranks of node 1 of a job simulated on the same machine have cards of
their own, as they would on another server. Each process judges the card by its own
``NPUSIM_HBM_BYTES`` (processes that disagree about a card's size see different totals; its
slot records the size it assumed, which npusim-smi shows). ``NPUSIM_CARD_SHARE=0`` gives each
process a card of its own, as before the ledger.

Torch's error. An allocation past the card, or past this process's fraction, raises
``runtime.errors.OutOfMemoryError``; once torch is imported it is an instance of a subclass that
is also ``torch.OutOfMemoryError`` (``out_of_memory``), so code that catches torch's error
(accelerate's batch-size finder, serving loops) sees it, and runtime never imports torch.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import struct
import sys
import threading
import time

from .. import config
from ..errors import NpuError, OutOfMemoryError

MAGIC = b"NPUSIMC1"
HEADER = 64                      # magic, version, device: the header lock is on its byte 0
SLOT = 128
MAX_SLOTS = 1024                 # processes on one card at a time
_OPEN_TRIES = 100                # opens of a ledger its last holder removed meanwhile
LOCK_TIMEOUT = 10.0              # seconds a charge waits for the ledger before raising
_HDR = struct.Struct("<8sii")
# pid, start time (clock ticks after boot), reserved, capacity, rank, local rank, job id
_SLOT = struct.Struct("<qqqqii64s")
_FLOCK = "@hhqqixxxx"            # struct flock on Linux (x86-64, aarch64): 32 bytes
MiB = 1 << 20


class CardLedgerError(NpuError):
    """The card's ledger cannot be used (its directory is not the user's, it stays locked)."""


class CardFullError(MemoryError):
    """Raised by a charge the card cannot take: the pool turns it into its OutOfMemoryError.

    Fields: ``nbytes`` (asked), ``capacity``, ``mine`` (this process's reservation before),
    ``others`` (bytes the other live holders reserve), ``holders`` (their ``Holder`` records)."""

    def __init__(self, nbytes: int, capacity: int, mine: int, others: int, holders: list):
        super().__init__(f"the card holds {_mib(mine + others)} of {_mib(capacity)}, "
                         f"{_mib(others)} of it by other processes ({describe(holders)})")
        self.nbytes, self.capacity, self.mine = nbytes, capacity, mine
        self.others, self.holders = others, holders


class Holder:
    """One live process on a card: ``pid``, ``start`` (clock ticks after boot), ``reserved``
    bytes, ``capacity`` it assumes, ``rank`` / ``local_rank`` (None unknown), ``job``."""

    __slots__ = ("pid", "start", "reserved", "capacity", "rank", "local_rank", "job", "slot")

    def __init__(self, slot, pid, start, reserved, capacity, rank, local_rank, job):
        self.slot, self.pid, self.start, self.reserved = slot, pid, start, reserved
        self.capacity, self.job = capacity, job
        self.rank = None if rank < 0 else rank
        self.local_rank = None if local_rank < 0 else local_rank

    def label(self) -> str:
        """``pid 1234 of job local`` / ``pid 1234 of job abc rank 3``."""
        return f"pid {self.pid} of job {self.job}" + (
            "" if self.rank is None else f" rank {self.rank}")

    def __repr__(self):
        return f"Holder({self.label()}, {_mib(self.reserved)})"


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


def describe(holders: list) -> str:
    """The holders as an error message names them: ``pid 1234 of job local: 700.00 MiB; ...``."""
    live = [h for h in holders if h.reserved]
    if not live:
        return "none hold memory"
    return "; ".join(f"{h.label()}: {_mib(h.reserved)}" for h in live)


# ---------------------------------------------------------------------- where the ledgers are
def ledger_dir() -> str:
    """NPUSIM_CARD_DIR, else ``/dev/shm/npusim.cards.<uid>`` (the temp dir without /dev/shm)."""
    d = config.card_dir()
    if d:
        return d
    base = "/dev/shm" if os.path.isdir("/dev/shm") else _tempdir()
    return os.path.join(base, f"npusim.cards.{os.getuid()}")


def _tempdir() -> str:
    import tempfile
    return tempfile.gettempdir()


def node_rank() -> int:
    """The simulated node this process's cards belong to: npurun's node rank, else 0."""
    node = config.node()
    if not node:
        return 0
    tail = node.rpartition("/")[2]
    return int(tail) if tail.isdigit() else 0


def ledger_path(device_id: int, node: int | None = None, directory: str | None = None) -> str:
    return os.path.join(directory or ledger_dir(),
                        f"node{node_rank() if node is None else node}.npu{device_id}")


def _own_dir(path: str) -> None:
    """Create ``path`` (0700) or check that it is a directory of this user, not a symlink."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CardLedgerError(f"cannot create the card ledger directory {path}: {e}; set "
                              "NPUSIM_CARD_DIR to a directory of yours, or NPUSIM_CARD_SHARE=0 "
                              "for a card of this process's own") from None
    st = os.lstat(path)
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise CardLedgerError(f"{path} is not a directory of uid {os.getuid()} (a symlink, or "
                              "another user's): set NPUSIM_CARD_DIR to a directory of yours, or "
                              "NPUSIM_CARD_SHARE=0 for a card of this process's own")


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks after boot); 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


# ---------------------------------------------------------------------- locks
def _flock(fd: int, cmd: int, kind: int, start: int, length: int = 1) -> bytes:
    return fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0))


def _try_lock(fd: int, start: int) -> bool:
    try:
        _flock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, start)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _unlock(fd: int, start: int) -> None:
    _flock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, start)


def _held(fd: int, start: int) -> bool:
    """True when another open file (another process) holds a lock on byte ``start``."""
    out = _flock(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, start)
    return struct.unpack(_FLOCK, out)[0] != fcntl.F_UNLCK


class _Locked:
    """The ledger's header lock, taken with a deadline (a process stopped while it held it
    must not hang every other one: CardLedgerError after LOCK_TIMEOUT)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def __enter__(self):
        if _try_lock(self.fd, 0):
            return self
        deadline, pause = time.monotonic() + LOCK_TIMEOUT, 20e-6
        while not _try_lock(self.fd, 0):
            if time.monotonic() > deadline:
                raise CardLedgerError(
                    f"the card ledger {self.path} stayed locked for {LOCK_TIMEOUT:g} s: a "
                    "process is stopped while charging it (kill it, or set NPUSIM_CARD_DIR)")
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
        return self

    def __exit__(self, *exc):
        _unlock(self.fd, 0)


def _slot_at(i: int) -> int:
    return HEADER + i * SLOT


def read_slots(fd: int, path: str, skip: int = -1) -> list[Holder]:
    """The live holders of the ledger open at ``fd`` (the caller holds the header lock or reads
    a snapshot); ``skip``: this process's own slot, left out."""
    data = os.pread(fd, HEADER + MAX_SLOTS * SLOT, 0)
    out = []
    for i in range(max(0, (len(data) - HEADER) // SLOT)):
        if i == skip:
            continue
        off = _slot_at(i)
        pid, start, reserved, cap, rank, lrank, job = _SLOT.unpack_from(data, off)
        if pid <= 0 or not _held(fd, off):
            continue                          # never used, closed, or its process is gone
        out.append(Holder(i, pid, start, reserved, cap, rank, lrank,
                          job.rstrip(b"\0").decode("utf-8", "replace")))
    return out


def _open(path: str, device_id: int, create: bool) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_size < HEADER:
            with _Locked(fd, path):
                if os.fstat(fd).st_size < HEADER:
                    os.pwrite(fd, _HDR.pack(MAGIC, 1, device_id).ljust(HEADER, b"\0"), 0)
        elif os.pread(fd, 8, 0) != MAGIC:
            raise CardLedgerError(f"{path} is not an npusim card ledger (remove it)")
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------- this process's slot
_open_cards: "set[Card]" = set()


class Card:
    """This process's place on one device's card: its slot in the ledger, and the charges.

    ``capacity`` is the card's HBM as this process sees it (NPUSIM_HBM_BYTES). With sharing off
    (NPUSIM_CARD_SHARE=0) the card is this process's alone: every charge within the capacity
    succeeds and there are no other holders."""

    def __init__(self, device_id: int, capacity: int):
        self.device_id, self.capacity = device_id, capacity
        self.reserved = 0
        self._mu = threading.Lock()
        self.fd: int | None = None
        self.slot = -1
        self.path = ""
        if not config.card_share():
            return
        d = ledger_dir()
        self.path = ledger_path(device_id, directory=d)
        for _ in range(_OPEN_TRIES):
            _own_dir(d)
            try:
                fd = _open(self.path, device_id, create=True)
            except FileNotFoundError:     # the last holder removed the directory meanwhile
                continue
            try:
                with _Locked(fd, self.path):
                    if os.fstat(fd).st_nlink:     # still the ledger: not removed meanwhile
                        self.slot = self._claim(fd)
            except BaseException:
                os.close(fd)
                raise
            if self.slot >= 0:
                break
            os.close(fd)
        else:
            raise CardLedgerError(f"{self.path} was removed {_OPEN_TRIES} times while this "
                                  "process opened it: set NPUSIM_CARD_DIR to a directory of yours")
        self.fd = fd
        _open_cards.add(self)

    def _claim(self, fd: int) -> int:
        """Take the first free slot (the header lock is held): lock it, write who we are."""
        size = os.fstat(fd).st_size
        n = max(0, (size - HEADER + SLOT - 1) // SLOT)
        for i in range(MAX_SLOTS):
            off = _slot_at(i)
            if i < n and _held(fd, off):
                continue
            if not _try_lock(fd, off):        # held after all (cannot happen under the header lock)
                continue
            job = config.job()
            rec = _SLOT.pack(os.getpid(), start_time(os.getpid()), 0, self.capacity,
                             -1 if job.rank is None else job.rank,
                             -1 if job.local_rank is None else job.local_rank,
                             job.job_id.encode()[:64])
            os.pwrite(fd, rec.ljust(SLOT, b"\0"), off)
            return i
        raise CardLedgerError(f"{self.path}: {MAX_SLOTS} processes already hold device "
                              f"{self.device_id}")

    @property
    def shared(self) -> bool:
        return self.fd is not None

    def _write_reserved(self, value: int) -> None:
        os.pwrite(self.fd, struct.pack("<q", value), _slot_at(self.slot) + 16)

    def charge(self, nbytes: int) -> None:
        """Reserve ``nbytes`` more of the card for this process; CardFullError if it is full."""
        with self._mu:
            if self.fd is None:
                if self.reserved + nbytes > self.capacity:
                    raise CardFullError(nbytes, self.capacity, self.reserved, 0, [])
                self.reserved += nbytes
                return
            with _Locked(self.fd, self.path):
                holders = read_slots(self.fd, self.path, self.slot)
                others = sum(h.reserved for h in holders)
                if self.reserved + nbytes + others > self.capacity:
                    raise CardFullError(nbytes, self.capacity, self.reserved, others, holders)
                self.reserved += nbytes
                self._write_reserved(self.reserved)

    def uncharge(self, nbytes: int) -> None:
        """Give ``nbytes`` of this process's reservation back to the card."""
        with self._mu:
            self.reserved = max(0, self.reserved - nbytes)
            if self.fd is not None:
                with _Locked(self.fd, self.path):
                    self._write_reserved(self.reserved)

    def others(self) -> list[Holder]:
        """The other live processes on this card (each with its reserved bytes)."""
        with self._mu:
            if self.fd is None:
                return []
            with _Locked(self.fd, self.path):
                return read_slots(self.fd, self.path, self.slot)

    def others_reserved(self) -> int:
        """Bytes the other live processes on this card have reserved."""
        return sum(h.reserved for h in self.others())

    def close(self) -> None:
        """Leave the card: clear the slot, drop its lock, close the ledger (reset_device)."""
        with self._mu:
            fd, self.fd = self.fd, None
            self.reserved = 0
            _open_cards.discard(self)
            if fd is None:
                return
            try:
                with _Locked(fd, self.path):
                    os.pwrite(fd, b"\0" * SLOT, _slot_at(self.slot))
                    _unlock(fd, _slot_at(self.slot))
                    last = not read_slots(fd, self.path) and _unlink_if_same(self.path, fd)
            finally:
                os.close(fd)
            if last and not config.card_dir():    # the default directory, when empty
                try:
                    os.rmdir(os.path.dirname(self.path))
                except OSError:
                    pass

    def _forget_after_fork(self) -> None:
        """In a forked child: the slot is the parent's; close the inherited descriptor (the
        parent's locks stay: they belong to the parent's open file) and share nothing."""
        self._mu = threading.Lock()
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _unlink_if_same(path: str, fd: int) -> bool:
    """Remove the ledger ``path`` if it is still the file open at ``fd`` (the caller holds its
    header lock and saw no live slot); whether it did."""
    try:
        st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False


def _close_all() -> None:
    """At the interpreter's exit: leave every card (the last holder removes its ledger)."""
    for c in list(_open_cards):
        try:
            c.close()
        except Exception:       # noqa: BLE001 - exiting: a ledger left behind is harmless
            pass


atexit.register(_close_all)


def _after_fork_in_child() -> None:
    for card in list(_open_cards):
        card._forget_after_fork()
    _open_cards.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------- readers (npusim-smi)
def survey(device_id: int, node: int | None = None, directory: str | None = None) -> list[Holder]:
    """The live holders of a device's card, read by any process (npusim-smi); [] when no
    process ever held it."""
    path = ledger_path(device_id, node, directory)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    try:
        if os.pread(fd, 8, 0) != MAGIC:
            return []
        with _Locked(fd, path):
            return read_slots(fd, path)
    finally:
        os.close(fd)


def nodes(directory: str | None = None) -> list[int]:
    """The node numbers that have a ledger in the directory (0 always)."""
    found = {0}
    try:
        names = os.listdir(directory or ledger_dir())
    except OSError:
        names = []
    for n in names:
        head, _, dev = n.partition(".npu")
        if head.startswith("node") and head[4:].isdigit() and dev.isdigit():
            found.add(int(head[4:]))
    return sorted(found)


# ---------------------------------------------------------------------- torch's error
_torch_oom: type | None = None


def _rebuild_oom(message: str, state: dict):
    err = out_of_memory(message)
    err.__dict__.update(state)
    return err


def _torch_class() -> type | None:
    """``OutOfMemoryError`` that is also ``torch.OutOfMemoryError``, once torch is imported."""
    global _torch_oom
    if _torch_oom is None:
        torch = sys.modules.get("torch")
        base = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        if not isinstance(base, type) or not issubclass(base, BaseException):
            return None

        def __reduce__(self):
            return (_rebuild_oom, (str(self), dict(self.__dict__)))

        _torch_oom = type("OutOfMemoryError", (OutOfMemoryError, base),
                          {"__reduce__": __reduce__, "__module__": "runtime.errors",
                           "__qualname__": "OutOfMemoryError",
                           "__doc__": OutOfMemoryError.__doc__ + " Also torch.OutOfMemoryError."})
    return _torch_oom


def out_of_memory(message: str) -> OutOfMemoryError:
    """A runtime OutOfMemoryError; also a torch.OutOfMemoryError when torch is imported."""
    cls = _torch_class() or OutOfMemoryError
    return cls(message)
