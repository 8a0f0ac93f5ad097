"""The intra-node channel: per-pair rings of slots in shared memory, polled by the waiting thread.

Design note. Each rank creates one segment, its *inbox*, at communicator init:
``/dev/shm/npusim-<job>-hccl-r<rank>-<random>`` (mode 0600, ``O_EXCL``), and publishes the name
through the authenticated store; the ranks of its node map it read-write. Layout:

- a control block: the *bell* (u32, the futex word every waiter of this rank sleeps on), the
  number of sleeping waiters (u32), magic, rank, ring count, slots per ring, slot size;
- one ring per sending rank: ``head`` (u64, written only by the sender), ``tail`` (u64, written
  only by this rank), each in its own cache line, then ``slots`` slots of ``slot_bytes``: a fixed
  header (kind, payload length, comm_id, seq, step, value, fingerprint) and the payload inline.

Ordering. The channel runs only on x86-64 (``available`` checks the CPU at run time; every
other machine sends through the sockets, see docs/algorithms.md): CPython gives no atomic or
ordered access to shared memory, so the argument below uses the x86-64 memory model (TSO: stores
become visible in program order, loads are not reordered with older loads, a locked instruction
is a full barrier) and holds nowhere else. Arm (aarch64) may show a reader the new head before
the slot's bytes, so it never gets here.

A sender copies header and payload into slot ``head % slots``, then advances ``head`` (stores
in order: a reader that sees the new head sees the slot; it loads the head before the slot, in
order too), under its per-peer lock, whose release is a locked instruction (CPython's Lock is a
semaphore updated with an atomic instruction): *barrier 1*. Then it rings the receiver's bell:
an increment (a plain read and write: two senders may race and write the same value), then
``_FENCE`` (acquire and release of a Lock, a locked instruction: *barrier 2*), then a look at
the bell's sleeper count and, if anyone sleeps, a FUTEX_WAKE (a system call costs 1-6 us, so it
is made only when needed). A waiter reads the bell (``seen``), drains its ring, and before it
sleeps counts itself as a sleeper (under a Lock: a barrier) and calls FUTEX_WAIT, which sleeps
only if the bell still holds ``seen`` (the kernel compares under its own barrier).

Why no wake-up is lost. Take a message whose head became visible only after the waiter's
drain. Its sender loaded the bell after barrier 1, so after the head was visible. Had that load
returned a value the bell held before ``seen``, it (and the head) would precede the waiter's
read of ``seen`` and the drain would have seen the head; so it returned ``seen`` or a later
value, and the sender writes that plus one: not ``seen`` (save for three or more senders racing
so that the bell's value recurs, or 2**32 rings between two looks). By barrier 2 the sender
looks at the sleeper count after that write. Either the waiter counted itself before that look
(then it is woken), or after it: then its barrier orders the kernel's compare after the new
bell, and it does not sleep. A sleep is also bounded by a slice, because the wait
re-checks close, abort and liveness; a wake-up lost to a bug in this argument would cost that,
never a hang. The slice is ``SLICE`` (10 ms) while the bell moves, and doubles after every
sleep that ends with the bell unmoved, up to ``SLICE_MAX``: a long wait wakes a few times a
second, not a hundred (at world 256 on two cores, 255 ranks waking every 10 ms to find nothing
used more CPU than the machine has: 13 ms of CPU per waiting rank per second, under 3 with
this). The wake keeps the GIL: it never blocks. A full ring or a payload larger than a
slot is refused (``post`` returns False): the caller decides (``local.LocalPair`` waits a
bounded time for a slot, ``wait_room``, then sends it another way).

A waiter reads the bell, looks for what it waits for, and if it is not there spins on the bell
for ``spin`` seconds, yielding the core at every turn (``sched_yield``, ~1 us here when nothing
else wants the core): the scheduler sometimes starts both ranks of a pair on one core and leaves
them there, and a spin that does not yield then holds the core its peer needs (1 KiB all_reduce
at world 2: 570-600 us instead of 270-305 us, both ranks forced onto one core). With more ranks
on the node than cores the spin is shorter, and 0 with more than three ranks per core (it would
hold back the ranks it waits for; the waiter yields once; hccl.transport.process), then it
sleeps in FUTEX_WAIT on the bell's old value: any post or ``ring`` after the read changes the
bell, so the kernel refuses to sleep or wakes it.

Prepared messages (gloo's bound pairs). A collective call sends and receives the same messages
at every issue, the sequence number aside. ``writer`` binds one such send (peer, header, payload)
and ``reader`` one such receive (peer, expected header, consumer) once; ``RingWriter.post`` and
``RingReader.take`` then do what ``post`` and ``take`` do for that message, with the same locks
and stores in the same order (so the argument above holds unchanged): the header is one
prepared byte string and the sequence number one store, and a reduction reads the slot through
a typed array made once per slot (``Channel.slot_arrays``) instead of a view made per message.

Nothing in a slot is executable or unpickled: fixed-size integers and raw bytes. A segment is
opened only by the name the store gave (checked against the job's naming), must belong to this
user, have mode 0600 and the size its control block announces.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import re
import secrets
import stat
import struct
import sys
import threading
import time
import weakref

import numpy as np

MAGIC = 0x4E50_5553_4849_4D31          # "NPUSHIM1"
_CTRL = struct.Struct("=IIQIIII")       # bell, sleepers, magic, rank, rings, slots, slot_bytes
CTRL_BYTES = 64
RING_HDR = 128                          # head at +0, tail at +64 (separate cache lines)
ROOM_NAP = 50e-6        # s a sender waiting for a free slot sleeps between two looks (wait_room)
SLOT_HDR = struct.Struct("=IIQQQq5q")   # kind, nbytes, comm_id, seq, step, value, fp
SLOT_HDR_BYTES = 96
_SEQ_WORD = 2                           # the header's seq, in u64 words from the slot's start
_MATCH = struct.Struct("=QQ8xQ8x5q")    # what ``take`` compares of a header, seq aside: kind
                                        # and nbytes (one word), comm_id, step, fp
SLOT_ARRAYS = 64        # (peer, dtype, count) keys of typed slot arrays a channel keeps (LRU-free:
                        # emptied when full; a step uses one key, a step of a loop re-makes it once)
SLICE = 0.01                            # a sleep's bound while the bell moves (s): bounds a
SLICE_MAX = 0.32                        # lost wake-up; doubled up to SLICE_MAX while it does not
_NAME = re.compile(r"^npusim-[A-Za-z0-9_.]+-hccl-r[0-9]+-[0-9a-f]{16}$")

_SYS_FUTEX = 202                        # x86-64's futex system call number
_FENCE = threading.Lock()              # acquire + release: a locked instruction, a full barrier
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_INT_MAX = 0x7FFFFFFF
_libc = ctypes.CDLL(None, use_errno=True)          # releases the GIL: for the blocking wait
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_PROT_RW, _MAP_SHARED = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED
_MAP_FAILED = ctypes.c_void_p(-1).value
_pylibc = ctypes.PyDLL(None, use_errno=True)       # keeps the GIL: the wake never blocks, and
_pylibc.syscall.restype = ctypes.c_long            # releasing it would hand it to another thread


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def available() -> bool:
    """Whether the channel may run here: Linux on x86-64 (the ordering argument of the module
    note is x86-64's; another CPU sends through the sockets) with /dev/shm."""
    return platform.machine() == "x86_64" and sys.platform == "linux" \
        and os.path.isdir("/dev/shm")


def _futex_wait(addr: int, value: int, seconds: float) -> None:
    ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint32(value),
                  ctypes.byref(ts), None, 0)


def _futex_wake(addr: int) -> None:
    _pylibc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, _INT_MAX, None, None, 0)


class ChannelError(Exception):
    """A segment could not be created or opened (the message says which and why)."""


class _Segment:
    """One rank's inbox mapped into this process."""

    def __init__(self, path: str, fd: int, size: int, create: tuple | None = None):
        self.path = path
        try:
            self.mm = _map(fd, size)
        finally:
            os.close(fd)
        if create is not None:                 # (rank, rings, slots, slot_bytes) of a new inbox
            _CTRL.pack_into(self.mm, 0, 0, 0, MAGIC, *create)
        self.buf = memoryview(self.mm).cast("B")
        self.u32 = self.buf.cast("I")
        self.u64 = self.buf.cast("Q")
        self.bell_addr = ctypes.addressof(self.mm)
        _, _, magic, self.rank, self.rings, self.slots, self.slot_bytes = _CTRL.unpack_from(self.mm)
        self.magic = magic
        self.ring_bytes = RING_HDR + self.slots * self.slot_bytes
        # per ring: the u64 index of its head (tail = head + 8) and the offset of its slot 0;
        # none for a control block that does not describe this mapping (``attach`` refuses it)
        rings = self.rings if segment_bytes(self.rings, self.slots, self.slot_bytes) == size else 0
        self.heads = [(CTRL_BYTES + r * self.ring_bytes) // 8 for r in range(rings)]
        self.slot0 = [CTRL_BYTES + r * self.ring_bytes + RING_HDR for r in range(rings)]

    def slot_offset(self, ring: int, n: int) -> int:
        return self.slot0[ring] + (n % self.slots) * self.slot_bytes

    def ring(self) -> None:
        """Tell this segment's owner that something changed (the bell first, then the sleepers:
        see the module note)."""
        u32 = self.u32
        u32[0] = (u32[0] + 1) & 0xFFFFFFFF
        _FENCE.acquire()        # barrier 2: the bell before the sleeper count (not ``with``:
        _FENCE.release()        # half the cost in CPython 3.11, every message rings)
        if u32[1]:
            _futex_wake(self.bell_addr)


def _map(fd: int, size: int):
    """``size`` bytes of ``fd`` mapped shared read-write, as a ctypes array; unmapped once the
    array and every view of it are garbage (so a thread still reading never touches unmapped
    memory). Unlike ``mmap.mmap`` it keeps no duplicate of ``fd`` open."""
    addr = _libc.mmap(None, ctypes.c_size_t(size), _PROT_RW, _MAP_SHARED, fd, ctypes.c_long(0))
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise ChannelError(f"cannot map {size} bytes of shared memory: {os.strerror(err)}")
    arr = (ctypes.c_ubyte * size).from_address(addr)
    unmap = weakref.finalize(arr, _libc.munmap, ctypes.c_void_p(addr), ctypes.c_size_t(size))
    # not at exit: a daemon thread (ZeroMQ's monitor, a peer's disconnect) may still ring the
    # bell then, and the process's end unmaps everything anyway (an unmap at exit was a SIGSEGV)
    unmap.atexit = False
    return arr


def segment_bytes(rings: int, slots: int, slot_bytes: int) -> int:
    return CTRL_BYTES + rings * (RING_HDR + slots * slot_bytes)


class Channel:
    """Rank ``rank``'s end of the node's shared-memory rings (see the module note).

    ``post`` writes into a peer's inbox, ``poll`` reads this rank's inbox; ``value``, ``wait``
    and ``ring`` make it the transport's bell (``base.Transport``). The caller
    (``hccl.transport.local``) decides what messages mean.
    """

    def __init__(self, rank: int, size: int, job: str, *, slots: int = 32,
                 slot_bytes: int = 64 << 10, spin: float = 20e-6):
        if not available():
            raise ChannelError(f"the shared-memory channel runs on x86-64 Linux only (this is "
                               f"{platform.machine()} {sys.platform}): its ordering argument "
                               "is x86-64's; send through the sockets (NPUSIM_SHM=0)")
        if slot_bytes % 64 or slot_bytes <= SLOT_HDR_BYTES or slots < 1:
            raise ValueError(f"slot_bytes={slot_bytes} must be a multiple of 64 above "
                             f"{SLOT_HDR_BYTES}, slots={slots} at least 1")
        self.rank, self.size, self.spin = rank, size, spin
        self._slice = SLICE                              # the next sleep's bound (wait)
        self.capacity = slot_bytes - SLOT_HDR_BYTES      # largest payload of one slot
        self.name = f"npusim-{job}-hccl-r{rank}-{secrets.token_hex(8)}"
        if not _NAME.match(self.name):
            raise ChannelError(f"job id {job!r} cannot name a shared-memory segment")
        path = os.path.join("/dev/shm", self.name)
        nbytes = segment_bytes(size, slots, slot_bytes)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as e:
            raise ChannelError(f"rank {rank}: cannot create {path}: {e.strerror}") from None
        try:
            os.ftruncate(fd, nbytes)
            self.inbox = _Segment(path, fd, nbytes, create=(rank, size, slots, slot_bytes))
        except BaseException:
            os.unlink(path)
            raise
        self.unlinked = False
        self.peers: dict[int, _Segment] = {}
        self._send_locks = {p: threading.Lock() for p in range(size)}
        self._recv_locks = {p: threading.Lock() for p in range(size)}
        self._out: dict[int, tuple] = {}        # peer -> its inbox's fields for post (attach)
        inbox = self.inbox                      # peer -> this inbox's fields for take
        self._in = {p: (inbox.heads[p], inbox.slot0[p], self._recv_locks[p])
                    for p in range(size)}
        self._waiters_lock = threading.Lock()
        self._arrays: dict = {}                 # slot_arrays' cache

    # -- set-up ----------------------------------------------------------------------------
    def attach(self, peer: int, name: str, fd: int | None = None) -> None:
        """Map rank ``peer``'s inbox ``name`` (as published in the store) read-write; ``fd``:
        the inbox already opened by the caller (e.g. through ``/proc/<pid>/fd`` once the name
        is unlinked), taken over and closed here."""
        if not _NAME.match(name or "") or not name.split("-hccl-r", 1)[1].startswith(f"{peer}-"):
            if fd is not None:
                os.close(fd)
            raise ChannelError(f"rank {self.rank}: {name!r} is not rank {peer}'s segment name")
        path = os.path.join("/dev/shm", name)
        try:
            if fd is None:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise ChannelError(f"rank {self.rank}: cannot open rank {peer}'s segment {path}: "
                               f"{e.strerror}") from None
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600 \
                or not stat.S_ISREG(st.st_mode) or st.st_size < CTRL_BYTES:
            os.close(fd)
            raise ChannelError(f"rank {self.rank}: {path} is not a 0600 file of this user")
        seg = _Segment(path, fd, st.st_size)
        if seg.magic != MAGIC or seg.rank != peer or seg.rings != self.size or \
                segment_bytes(seg.rings, seg.slots, seg.slot_bytes) != st.st_size or \
                seg.slot_bytes <= SLOT_HDR_BYTES:
            del seg
            raise ChannelError(f"rank {self.rank}: {path} does not hold rank {peer}'s rings")
        self.peers[peer] = seg
        # what ``post`` reads per message, in one lookup: that ring's head index, its slot 0
        self._out[peer] = (seg, seg.heads[self.rank], seg.slot0[self.rank], seg.slots,
                           seg.slot_bytes, self._send_locks[peer])

    def unlink(self) -> None:
        """Remove this rank's segment name (every peer has mapped it; mappings stay valid)."""
        if not self.unlinked:
            self.unlinked = True
            try:
                os.unlink(self.inbox.path)
            except FileNotFoundError:
                pass

    # -- sending ---------------------------------------------------------------------------
    def post(self, peer: int, kind: int, comm_id: int, seq: int, step: int, fp, value: int,
             payload) -> bool:
        """Put one message into ``peer``'s inbox; False (nothing sent) if it does not fit a
        slot, the ring is full or the inbox is not mapped (``attach`` failed: the peer is gone)."""
        out = self._out.get(peer)
        if out is None:
            return False
        seg, h, slot0, slots, slot_bytes, lock = out
        n = len(payload)
        if n > slot_bytes - SLOT_HDR_BYTES:
            return False
        u64 = seg.u64
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every message
        try:
            head = u64[h]
            if head - u64[h + 8] >= slots:
                return False
            off = slot0 + (head % slots) * slot_bytes
            SLOT_HDR.pack_into(seg.mm, off, kind, n, comm_id, seq, step, value, *fp)
            if n:
                seg.buf[off + SLOT_HDR_BYTES:off + SLOT_HDR_BYTES + n] = payload
            u64[h] = head + 1
        finally:
            lock.release()
        seg.ring()
        return True

    def writer(self, peer: int, kind: int, comm_id: int, step: int, value: int, fp,
               payload) -> "RingWriter | None":
        """One message to ``peer`` prepared for repeated posts (``RingWriter.post(seq)``), with
        ``payload`` (flat bytes, read at each post); None if it does not fit a slot or the
        peer's inbox is not mapped (``post`` would refuse it every time)."""
        out = self._out.get(peer)
        if out is None or len(payload) > out[4] - SLOT_HDR_BYTES:
            return None
        return RingWriter(out, SLOT_HDR.pack(kind, len(payload), comm_id, 0, step, value, *fp),
                          payload)

    def reader(self, peer: int, kind: int, comm_id: int, step: int, fp, nbytes: int,
               consume, dtype) -> "RingReader | None":
        """One message from ``peer`` prepared for repeated takes (``RingReader.take(seq)``):
        ``consume(arr)`` gets its payload as a read-only array of ``dtype`` (``nbytes`` of
        the slot), valid during the call; None if ``nbytes`` does not fit a slot or is not a
        whole number of ``dtype``."""
        dtype = np.dtype(dtype)
        if not 0 < nbytes <= self.capacity or nbytes % dtype.itemsize:
            return None
        header = SLOT_HDR.pack(kind, nbytes, comm_id, 0, step, 0, *fp)
        return RingReader(self, peer, _MATCH.unpack(header),
                          self.slot_arrays(peer, dtype, nbytes // dtype.itemsize), consume)

    def slot_arrays(self, peer: int, dtype, count: int) -> list:
        """Per slot of ``peer``'s ring in this inbox, a read-only array of ``count`` ``dtype``
        over its payload; kept per (peer, dtype, count), at most SLOT_ARRAYS keys."""
        key = (peer, dtype, count)
        arrs = self._arrays.get(key)
        if arrs is None:
            if len(self._arrays) >= SLOT_ARRAYS:
                self._arrays.clear()
            seg = self.inbox
            arrs = []
            for k in range(seg.slots):
                a = np.frombuffer(seg.mm, dtype, count,
                                  seg.slot0[peer] + k * seg.slot_bytes + SLOT_HDR_BYTES)
                a.flags.writeable = False
                arrs.append(a)
            self._arrays[key] = arrs
        return arrs

    # -- receiving -------------------------------------------------------------------------
    def poll(self, peer: int, handle) -> int:
        """Pass every message waiting from ``peer`` to ``handle(kind, nbytes, comm_id, seq, step,
        fp, value, payload)`` in order (payload: a view of at most one slot, valid only during
        the call; ``nbytes`` as the sender wrote it); returns how many. ``handle`` may raise:
        the message is consumed anyway."""
        seg = self.inbox
        h = seg.heads[peer]
        u64 = seg.u64
        if u64[h] == u64[h + 8]:
            return 0
        got = 0
        slot0, slots, slot_bytes = seg.slot0[peer], seg.slots, seg.slot_bytes
        with self._recv_locks[peer]:
            tail = u64[h + 8]
            while tail != u64[h]:
                off = slot0 + (tail % slots) * slot_bytes
                kind, n, comm_id, seq, step, value, *fp = SLOT_HDR.unpack_from(seg.mm, off)
                start = off + SLOT_HDR_BYTES
                tail += 1
                got += 1
                try:
                    handle(kind, n, comm_id, seq, step, tuple(fp), value,
                           seg.buf[start:start + min(n, self.capacity)])
                finally:
                    u64[h + 8] = tail
        return got

    def take(self, peer: int, kind: int, comm_id: int, seq: int, step: int, fp,
             consume) -> bool:
        """If the first message waiting from ``peer`` is of ``kind`` with exactly this tag and
        fingerprint, pass its payload (a view of its slot, valid during the call) to
        ``consume``, consume the message and return True; else leave the ring as it is and
        return None if it is empty, False if another message comes first. ``consume`` may
        raise: the message is consumed anyway."""
        seg = self.inbox
        h, slot0, lock = self._in[peer]
        u64 = seg.u64
        if u64[h] == u64[h + 8]:
            return None
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every message
        try:
            tail = u64[h + 8]
            if tail == u64[h]:
                return None
            off = slot0 + (tail % seg.slots) * seg.slot_bytes
            hdr = SLOT_HDR.unpack_from(seg.mm, off)     # kind, n, comm_id, seq, step, value, fp
            n = hdr[1]
            if hdr[4] != step or hdr[3] != seq or hdr[2] != comm_id or hdr[0] != kind \
                    or n > self.capacity or hdr[6:] != fp:
                return False
            start = off + SLOT_HDR_BYTES
            try:
                consume(seg.buf[start:start + n])
            finally:
                u64[h + 8] = tail + 1
        finally:
            lock.release()
        return True

    def wait_room(self, peer: int, until: float) -> bool:
        """Wait until ``peer``'s ring from this rank has a free slot (True), or ``perf_counter()``
        reaches ``until`` or the inbox is not mapped (False). Only the receiver frees a slot, and
        rings no bell for it: the sender spins the channel's spin, yielding the core at every
        turn, then naps ``ROOM_NAP`` at a time (the receiver may need this core to drain)."""
        seg = self.peers.get(peer)
        if seg is None:
            return False
        h, u64, slots = seg.heads[self.rank], seg.u64, seg.slots
        spin_end = time.perf_counter() + self.spin
        while u64[h] - u64[h + 8] >= slots:
            now = time.perf_counter()
            if now >= until:
                return False
            if now < spin_end:
                os.sched_yield()
            else:
                time.sleep(min(ROOM_NAP, until - now))
        return True

    def watch(self, peer: int, until: float) -> bool:
        """Spin, yielding the core at every turn, until a message from ``peer`` waits in its
        ring (True) or ``perf_counter()`` reaches ``until`` (False). Never sleeps in the kernel:
        for a caller that must not block, only look a few microseconds longer."""
        seg = self.inbox
        h = seg.heads[peer]
        u64 = seg.u64
        while u64[h] == u64[h + 8]:
            if time.perf_counter() >= until:
                return False
            os.sched_yield()
        return True

    def value(self) -> int:
        """The current bell value: pass it to ``wait`` after checking for work."""
        return self.inbox.u32[0]

    def wait(self, seen: int, seconds: float) -> None:
        """Return when the bell differs from ``seen``, after at most ``seconds`` (and the slice:
        the module note)."""
        u32 = self.inbox.u32
        if self.spin > 0:
            end = time.perf_counter() + min(self.spin, seconds)
            while u32[0] == seen:
                if time.perf_counter() >= end:
                    break
                os.sched_yield()          # a peer that shares this core runs now, not at the sleep
            else:
                return
        else:
            os.sched_yield()
            if u32[0] != seen:
                return
        with self._waiters_lock:
            u32[1] += 1
        cap = self._slice       # shared by this rank's waiters: a race only picks a bound
        try:
            _futex_wait(self.inbox.bell_addr, seen, max(0.0, min(seconds, cap)))
        finally:
            with self._waiters_lock:
                u32[1] -= 1
        self._slice = min(cap * 2, SLICE_MAX) if u32[0] == seen else SLICE

    def ring(self) -> None:
        """Wake this rank's own waiters (an abort, a close, a message that came another way)."""
        self.inbox.ring()

    def close(self) -> None:
        """Unlink this rank's segment if still linked. The mappings stay until the channel is
        garbage: a thread still inside ``poll`` or ``wait`` must never touch unmapped memory."""
        self.unlink()


class RingWriter:
    """One message prepared for a peer's ring (``Channel.writer``): ``post(seq)`` is
    ``Channel.post`` of it as ``seq``."""

    __slots__ = ("seg", "u64", "buf", "h", "slot0", "slots", "slot_bytes", "lock", "header",
                 "payload", "n")

    def __init__(self, out: tuple, header: bytes, payload):
        seg, self.h, self.slot0, self.slots, self.slot_bytes, self.lock = out
        self.seg, self.u64, self.buf = seg, seg.u64, seg.buf
        self.header, self.payload, self.n = header, payload, len(payload)

    def post(self, seq: int) -> bool:
        """Put the message, tagged ``seq``, into the peer's ring and ring its bell; False
        (nothing sent) if the ring is full."""
        u64, h, lock = self.u64, self.h, self.lock
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every message
        try:
            head = u64[h]
            if head - u64[h + 8] >= self.slots:
                return False
            off = self.slot0 + (head % self.slots) * self.slot_bytes
            buf = self.buf
            buf[off:off + SLOT_HDR.size] = self.header
            u64[(off >> 3) + _SEQ_WORD] = seq
            n = self.n
            if n:
                buf[off + SLOT_HDR_BYTES:off + SLOT_HDR_BYTES + n] = self.payload
            u64[h] = head + 1       # after the slot: barrier 1 is the release below
        finally:
            lock.release()
        self.seg.ring()
        return True


class RingReader:
    """One message prepared for this rank's ring from a peer (``Channel.reader``):
    ``take(seq)`` is ``Channel.take`` of it as ``seq``, its payload passed to the consumer as
    the slot's typed array."""

    __slots__ = ("mm", "u64", "h", "slot0", "lock", "slots", "slot_bytes", "match", "arrays",
                 "consume")

    def __init__(self, ch: Channel, peer: int, match: tuple, arrays: list, consume):
        seg = ch.inbox
        self.mm, self.u64 = seg.mm, seg.u64
        self.h, self.slot0, self.lock = ch._in[peer]
        self.slots, self.slot_bytes = seg.slots, seg.slot_bytes
        self.match, self.arrays, self.consume = match, arrays, consume

    def take(self, seq: int) -> bool | None:
        """If the first message in the ring is this one, tagged ``seq``, consume it and
        return True; else leave the ring as it is and return None if it is empty, False if
        another message comes first (``Channel.take``'s answers; the consumer may raise: the
        message is consumed anyway)."""
        u64, h = self.u64, self.h
        if u64[h] == u64[h + 8]:
            return None
        lock = self.lock
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every message
        try:
            tail = u64[h + 8]
            if tail == u64[h]:
                return None
            k = tail % self.slots
            off = self.slot0 + k * self.slot_bytes
            if u64[(off >> 3) + _SEQ_WORD] != seq or _MATCH.unpack_from(self.mm, off) != self.match:
                return False
            try:
                self.consume(self.arrays[k])
            finally:
                u64[h + 8] = tail + 1
        finally:
            lock.release()
        return True
