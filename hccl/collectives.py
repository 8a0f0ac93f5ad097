"""The HCCL API: every collective validates at the call, then enqueues one task on ``stream``.

Names follow HCCL (``HcclAllReduce(sendBuf, recvBuf, count, dataType, op, comm, stream)`` is
``all_reduce(send, recv, count, dtype, op, comm, stream)``); ``count`` is the per-rank element
count. Buffers are ``runtime.DevicePtr`` or ``runtime.DeviceArray``; a DeviceArray must be of
the call's dtype and bounds the call by its own extent. ``recv`` may be ``send`` (in place), or,
as in HCCL, ``send`` may be block ``rank`` of AllGather's ``recv`` and ``recv`` block ``rank`` of
ReduceScatter's ``send``; any other overlap is refused. ``stream=None`` means the current
stream. Bad arguments raise ``InvalidArgumentError`` (E_PARA) naming the argument and the
sizes, before anything is enqueued, so the communicator still works afterwards. ``site``
(keyword only) is the call site the flight recorder shows; by default the first frame outside
npusim, and a wrapper whose own caller is the user's (the torch backend) passes it.

A call's path: the communicator's remembered ``hccl.call.Call`` for the very same arguments
(the checks passed before, ``Calls.find``), else the checks of this module and a new Call; then
``Call.issue``. The same path serves the communicator's methods (``Collectives``, the base of
``hccl.Comm``, which infer count and dtype from a DeviceArray), so a call goes down through the
modules once: collectives -> call -> executor -> transport.
"""
from __future__ import annotations

import numpy as np

import runtime
from runtime.array import DeviceArray
from runtime.callsite import callsite
from runtime.context import current_stream, resolve_stream
from runtime.errors import NpuError, describe
from runtime.memory import DevicePtr
from runtime.stream import Stream

from . import config
from .call import Call
from .errors import InvalidArgumentError
from .types import DataType, OpType, ReduceOp, from_numpy


def _dtype(dtype, api) -> DataType:
    try:
        return DataType.of(dtype)
    except Exception:
        raise InvalidArgumentError(f"{api}: dtype={dtype!r} is not an HCCL data type "
                                   f"({', '.join(d.name for d in DataType)})") from None


def _redop(op, api) -> ReduceOp:
    try:
        return ReduceOp.of(op)
    except Exception:
        raise InvalidArgumentError(f"{api}: op={op!r} is not a ReduceOp (SUM, PROD, MAX, MIN)") from None


def _count(count, api, name="count") -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise InvalidArgumentError(f"{api}: {name}={count!r} must be a non-negative int")
    return int(count)


def _rank(value, size, api, name) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
        raise InvalidArgumentError(f"{api}: {name}={value!r} is out of range for a communicator of "
                                   f"{size} ranks (valid: 0..{size - 1})")
    return int(value)


def _buf(b, need: int, api: str, name: str, dtype: DataType, count_desc: str):
    """Check that ``b`` is live device memory of ``dtype`` holding at least ``need`` bytes.

    A DeviceArray bounds the call by its own extent (not the rest of its allocation) and by its
    dtype: a float64 array passed as FP32 would otherwise be reduced as garbage.
    """
    if not isinstance(b, (runtime.DevicePtr, runtime.DeviceArray)):
        raise InvalidArgumentError(f"{api}: {name}={describe(b)} must be a runtime.DevicePtr or "
                                   "DeviceArray (copy host data in with runtime.to_device)")
    if isinstance(b, runtime.DeviceArray):
        if b.dtype != dtype.numpy:
            raise InvalidArgumentError(
                f"{api}: {name} is a DeviceArray of {b.dtype} but dtype={dtype.name} "
                f"({dtype.numpy}); pass dtype={_name_of(b.dtype)} or an array of {dtype.numpy}")
    if isinstance(b, runtime.DeviceArray) and b.nbytes == 0:
        have = 0
    else:
        try:
            have = runtime.buffer_nbytes(b)
        except NpuError as e:
            raise InvalidArgumentError(f"{api}: {name}: {e}") from None
        if isinstance(b, runtime.DeviceArray):
            have = min(have, b.nbytes)
    if need > have:
        raise InvalidArgumentError(
            f"{api}: {name} holds {have} bytes but {count_desc} of {dtype.name} "
            f"({dtype.itemsize} bytes each) need {need} bytes")
    return b


def _name_of(np_dtype) -> str:
    try:
        return DataType.of(np_dtype).name
    except InvalidArgumentError:
        return f"<none: {np_dtype} is not an HCCL data type>"


def _extent(b, nbytes: int):
    """(device, first address, end address) of the ``nbytes`` a call touches at ``b``, or None."""
    ptr = b.ptr if isinstance(b, runtime.DeviceArray) else b
    if ptr is None or nbytes == 0:
        return None
    return ptr.device_id, ptr.addr, ptr.addr + nbytes


def _no_overlap(api: str, send, send_bytes: int, recv, recv_bytes: int, in_place_at=(0,)):
    """Refuse send and recv ranges that overlap other than in place.

    In place means recv starts where send starts, or, where HCCL defines it (``in_place_at``),
    at one of the other listed byte offsets of recv from send. Any other overlap makes the result
    depend on the order of the copies inside the schedule.
    """
    s, r = _extent(send, send_bytes), _extent(recv, recv_bytes)
    if s is None or r is None or s[0] != r[0] or s[2] <= r[1] or r[2] <= s[1]:
        return
    if r[1] - s[1] in in_place_at:
        return
    raise InvalidArgumentError(
        f"{api}: send [0x{s[1]:x}, 0x{s[2]:x}) ({send_bytes} bytes) and recv [0x{r[1]:x}, "
        f"0x{r[2]:x}) ({recv_bytes} bytes) overlap with recv {r[1] - s[1]:+d} bytes from send; "
        "use the same buffer for both (in place) or separate buffers")


def all_reduce(send, recv, count, dtype, op, comm, stream=None, *, site=None):
    """HcclAllReduce: every rank receives the reduction of all ranks' ``count`` elements."""
    _collective(OpType.ALLREDUCE, _all_reduce_args, comm, send, recv, count, dtype, op, None,
                stream, site)


def all_reduce_keyed(send, recv, count, dtype, op, comm, stream, site, key) -> None:
    """``all_reduce`` whose new Call the communicator remembers under ``key`` (a caller that
    finds it there next time issues it without the checks: hccl.torch's npu all_reduce)."""
    _collective(OpType.ALLREDUCE, _all_reduce_args, comm, send, recv, count, dtype, op, None,
                stream, site, key)


def all_gather(send, recv, send_count, dtype, comm, stream=None, *, site=None):
    """HcclAllGather: recv holds every rank's ``send_count`` elements, in rank order."""
    _collective(OpType.ALLGATHER, _all_gather_args, comm, send, recv, send_count, dtype, None,
                None, stream, site)


def reduce_scatter(send, recv, recv_count, dtype, op, comm, stream=None, *, site=None):
    """HcclReduceScatter: rank r receives block r (``recv_count`` elements) of the reduction."""
    _collective(OpType.REDUCE_SCATTER, _reduce_scatter_args, comm, send, recv, recv_count, dtype,
                op, None, stream, site)


def broadcast(buf, count, dtype, root, comm, stream=None, *, site=None):
    """HcclBroadcast: every rank's ``buf`` receives root's ``count`` elements."""
    _collective(OpType.BROADCAST, _broadcast_args, comm, buf, buf, count, dtype, None, root,
                stream, site)


def reduce(send, recv, count, dtype, op, root, comm, stream=None, *, site=None):
    """HcclReduce: root's ``recv`` receives the reduction; ``recv`` may be None elsewhere."""
    _collective(OpType.REDUCE, _reduce_args, comm, send, recv, count, dtype, op, root, stream,
                site)


def all_to_all(send, send_count, recv, recv_count, dtype, comm, stream=None, *, site=None):
    """HcclAlltoAll: block j of rank i's send goes to block i of rank j's recv."""
    _collective(OpType.ALLTOALL, _all_to_all_args, comm, send, recv, (send_count, recv_count),
                dtype, None, None, stream, site)


def _collective(op: OpType, check, comm, send, recv, count, dtype, redop, root, stream,
                site, mkey=None) -> None:
    """Issue collective ``op``: the communicator's remembered Call when the arguments are the
    very ones checked before (see ``hccl.call``), else ``check(comm, bufs, count, dtype, redop,
    root)`` and a new Call. A check raises InvalidArgumentError for a bad argument, else
    returns (the live comm, the API's name, the Call's normalized arguments). Checks are
    module-level functions, not closures: a closure would cost every call its cells. ``mkey``:
    a communicator method's key (``_repeat``), under which the new Call is remembered."""
    key = mkey                  # a method's key (``_repeat`` looked it up already), or:
    if key is None and isinstance(comm, Collectives) and not comm._destroyed:
        try:
            s = resolve_stream(stream)
        except NpuError:        # the check says what is wrong with it
            s = None
        if s is not None:
            key = (op, send if type(send) is DevicePtr else id(send),
                   recv if type(recv) is DevicePtr else id(recv), type(count), count,
                   type(dtype), dtype, type(redop), redop, type(root), root, s)
            objs = (send,) if recv is None else (send, recv)
            call = comm._calls.find(key, objs)
            if call is not None:
                call.issue(objs, site or callsite(3))
                return
    bufs = {"send": send, "recv": recv}
    comm, api, args = check(comm, bufs, count, dtype, redop, root)
    _new_call(comm, op, api, bufs, stream, site or callsite(3), key, **args)


def _repeat(comm, op: OpType, send, recv, redop, root, stream):
    """A communicator method's fast path: issue the Call remembered for the very same
    arguments, and return True; else the key to remember the new Call under (None: the method
    cannot be remembered this way), for ``_collective``.

    The method infers count and dtype from its DeviceArrays, whose shape and dtype are fixed
    when the array is made (a reshape or a view is a new array), so none of the checks, not even
    that inference, runs again for a repeat: the key holds the buffers by identity (of another length than
    ``_collective``'s keys: never equal to one), and ``Calls.find`` checks that they are the
    very objects checked, still in the same live allocations (``hccl.call``)."""
    if type(send) is not DeviceArray or comm._destroyed:
        return None
    if type(stream) is Stream and not stream.destroyed:
        s = stream
    elif stream is None:
        s = current_stream()
    else:
        return None
    if recv is None:
        key = (op, id(send), None, type(redop), redop, type(root), root, s)
        objs = (send,)
    elif type(recv) is DeviceArray:
        key = (op, id(send), id(recv), type(redop), redop, type(root), root, s)
        objs = (send, recv)
    else:
        return None
    call = comm._calls.find(key, objs)
    if call is None:
        return key
    call.issue(objs, callsite(3))
    return True


def _new_call(comm, op: OpType, api: str, bufs: dict, stream, site: str, key, *, count: int,
              dtype: DataType, redop=None, root=None, peer=None) -> None:
    """Make the Call of checked arguments and issue it; remember it under ``key`` if given."""
    try:
        s = resolve_stream(stream)
    except NpuError as e:
        raise InvalidArgumentError(f"{api}: stream: {e}") from None
    for name, b in bufs.items():
        if b is not None and _device_of(b) not in (s.device_id, -1):
            raise InvalidArgumentError(
                f"{api}: {name} is on device {_device_of(b)} but the stream is on device {s.device_id}")
    send, recv = bufs.get("send"), bufs.get("recv")
    inplace = send is not None and _same(send, recv)
    knobs = comm._knobs or _read_knobs(comm)
    call = Call(comm, op, bufs, count, dtype, redop, root, peer, s, knobs, inplace)
    comm._knobs = knobs     # kept once a call was planned with them (a bad one is not kept)
    if key is not None:
        comm._calls.put(key, call)
    call.issue(tuple(bufs[k] for k in call.names), site)


def _read_knobs(comm) -> tuple:
    """(HCCL_ALGO, slice bytes, the transport's ``solo_bytes``) for ``plan.collective``. A
    communicator keeps them from its first planned collective on; a bad value fails each call
    until it is fixed, as when read at every call."""
    algo = config.algo() if config.algo_set() else "auto"   # auto: schedule.choose by size
    return algo, config.slice_bytes(), comm.world.transport.solo_bytes


def _device_of(b) -> int:
    if isinstance(b, runtime.DeviceArray):
        return b.ptr.device_id if b.ptr is not None else -1
    return b.device_id


def _same(a, b) -> bool:
    if a is None or b is None:
        return False
    if a is b:
        return True
    pa = a.ptr if isinstance(a, runtime.DeviceArray) else a
    pb = b.ptr if isinstance(b, runtime.DeviceArray) else b
    return pa is not None and pb is not None and pa.device_id == pb.device_id and pa.addr == pb.addr


def live(comm, api: str):
    """``comm`` if it is an ``hccl.Comm`` not yet destroyed; else InvalidArgumentError naming
    ``api``."""
    if not isinstance(comm, Collectives):
        raise InvalidArgumentError(f"{api}: comm={comm!r} is not an hccl.Comm")
    comm._check_alive(api)
    return comm


# -- the checks of a call met for the first time (see _collective) ---------------------

def _all_reduce_args(comm, bufs, count, dtype, op, root):
    api = "all_reduce"
    comm, dt, n, rop = live(comm, api), _dtype(dtype, api), _count(count, api), \
        _redop(op, api)
    send, recv, need = bufs["send"], bufs["recv"], n * dt.itemsize
    _buf(send, need, api, "send", dt, f"count={n} elements")
    _buf(recv, need, api, "recv", dt, f"count={n} elements")
    _no_overlap(api, send, need, recv, need)
    return comm, api, {"count": n, "dtype": dt, "redop": rop}


def _all_gather_args(comm, bufs, send_count, dtype, op, root):
    api = "all_gather"
    comm, dt = live(comm, api), _dtype(dtype, api)
    n, send, recv = _count(send_count, api, "send_count"), bufs["send"], bufs["recv"]
    _buf(send, n * dt.itemsize, api, "send", dt, f"send_count={n} elements")
    _buf(recv, n * comm.size * dt.itemsize, api, "recv", dt,
         f"send_count={n} x {comm.size} ranks = {n * comm.size} elements")
    cb = n * dt.itemsize
    _no_overlap(api, send, cb, recv, cb * comm.size, (0, -comm.rank * cb))
    return comm, api, {"count": n, "dtype": dt}


def _reduce_scatter_args(comm, bufs, recv_count, dtype, op, root):
    api = "reduce_scatter"
    comm, dt = live(comm, api), _dtype(dtype, api)
    n, rop = _count(recv_count, api, "recv_count"), _redop(op, api)
    send, recv = bufs["send"], bufs["recv"]
    _buf(send, n * comm.size * dt.itemsize, api, "send", dt,
         f"recv_count={n} x {comm.size} ranks = {n * comm.size} elements")
    _buf(recv, n * dt.itemsize, api, "recv", dt, f"recv_count={n} elements")
    cb = n * dt.itemsize
    _no_overlap(api, send, cb * comm.size, recv, cb, (0, comm.rank * cb))
    return comm, api, {"count": n, "dtype": dt, "redop": rop}


def _broadcast_args(comm, bufs, count, dtype, op, root):
    api = "broadcast"
    comm, dt, n = live(comm, api), _dtype(dtype, api), _count(count, api)
    r = _rank(root, comm.size, api, "root")
    _buf(bufs["send"], n * dt.itemsize, api, "buf", dt, f"count={n} elements")
    return comm, api, {"count": n, "dtype": dt, "root": r}


def _reduce_args(comm, bufs, count, dtype, op, root):
    api = "reduce"
    comm, dt, n, rop = live(comm, api), _dtype(dtype, api), _count(count, api), \
        _redop(op, api)
    r, send, recv = _rank(root, comm.size, api, "root"), bufs["send"], bufs["recv"]
    _buf(send, n * dt.itemsize, api, "send", dt, f"count={n} elements")
    if comm.rank == r or recv is not None:
        _buf(recv, n * dt.itemsize, api, "recv", dt, f"count={n} elements")
        _no_overlap(api, send, n * dt.itemsize, recv, n * dt.itemsize)
    return comm, api, {"count": n, "dtype": dt, "redop": rop, "root": r}


def _all_to_all_args(comm, bufs, counts, dtype, op, root):
    api = "all_to_all"
    comm, dt = live(comm, api), _dtype(dtype, api)
    sc, rc = _count(counts[0], api, "send_count"), _count(counts[1], api, "recv_count")
    if sc != rc:
        raise InvalidArgumentError(f"{api}: send_count={sc} and recv_count={rc} differ; npusim's "
                                   "all_to_all exchanges equal blocks")
    send, recv = bufs["send"], bufs["recv"]
    _buf(send, sc * comm.size * dt.itemsize, api, "send", dt,
         f"send_count={sc} x {comm.size} ranks = {sc * comm.size} elements")
    _buf(recv, rc * comm.size * dt.itemsize, api, "recv", dt,
         f"recv_count={rc} x {comm.size} ranks = {rc * comm.size} elements")
    _no_overlap(api, send, sc * comm.size * dt.itemsize, recv, rc * comm.size * dt.itemsize)
    return comm, api, {"count": sc, "dtype": dt}


def send(buf, count, dtype, dest, comm, stream=None, *, site=None):
    """HcclSend: send ``count`` elements to rank ``dest`` (matched by that rank's ``recv``)."""
    _point_to_point(OpType.SEND, "send", buf, count, dtype, dest, "dest", comm, stream,
                    site or callsite(2))


def recv(buf, count, dtype, src, comm, stream=None, *, site=None):
    """HcclRecv: receive ``count`` elements from rank ``src``."""
    _point_to_point(OpType.RECV, "recv", buf, count, dtype, src, "src", comm, stream,
                    site or callsite(2))


def _point_to_point(op, api, buf, count, dtype, peer, peer_arg, comm, stream, site):
    comm, dt, n = live(comm, api), _dtype(dtype, api), _count(count, api)
    p = _rank(peer, comm.size, api, peer_arg)
    if p == comm.rank:
        raise InvalidArgumentError(f"{api}: {peer_arg}={p} is this rank; {api} needs another rank")
    _buf(buf, n * dt.itemsize, api, "buf", dt, f"count={n} elements")
    _new_call(comm, op, api, {"send" if op == OpType.SEND else "recv": buf}, stream, site, None,
              count=n, dtype=dt, peer=p)


def barrier(comm, stream=None, *, site=None):
    """HcclBarrier: completes on every rank once all ranks have reached it."""
    api = "barrier"
    comm = live(comm, api)
    _new_call(comm, OpType.BARRIER, api, {}, stream, site or callsite(2), None, count=0,
              dtype=DataType.UINT8)




class Collectives:
    """The collective methods of a communicator (the base of ``hccl.Comm``): count and dtype
    come from a DeviceArray, and each method returns its result buffer."""

    __slots__ = ()

    def all_reduce(self, send, recv=None, op=ReduceOp.SUM, stream=None):
        recv = send if recv is None else recv
        k = _repeat(self, OpType.ALLREDUCE, send, recv, op, None, stream)
        if k is not True:
            _collective(OpType.ALLREDUCE, _all_reduce_args, self, send, recv,
                        _size(send, "send"), _arr_dtype(send), op, None, stream, None, k)
        return recv

    def all_gather(self, send, recv, stream=None):
        k = _repeat(self, OpType.ALLGATHER, send, recv, None, None, stream)
        if k is not True:
            _collective(OpType.ALLGATHER, _all_gather_args, self, send, recv,
                        _size(send, "send"), _arr_dtype(send), None, None, stream, None, k)
        return recv

    def reduce_scatter(self, send, recv, op=ReduceOp.SUM, stream=None):
        k = _repeat(self, OpType.REDUCE_SCATTER, send, recv, op, None, stream)
        if k is not True:
            _collective(OpType.REDUCE_SCATTER, _reduce_scatter_args, self, send, recv,
                        _size(recv, "recv"), _arr_dtype(recv), op, None, stream, None, k)
        return recv

    def broadcast(self, buf, root=0, stream=None):
        k = _repeat(self, OpType.BROADCAST, buf, buf, None, root, stream)
        if k is not True:
            _collective(OpType.BROADCAST, _broadcast_args, self, buf, buf, _size(buf, "buf"),
                        _arr_dtype(buf), None, root, stream, None, k)
        return buf

    def reduce(self, send, recv=None, op=ReduceOp.SUM, root=0, stream=None):
        k = _repeat(self, OpType.REDUCE, send, recv, op, root, stream)
        if k is not True:
            _collective(OpType.REDUCE, _reduce_args, self, send, recv, _size(send, "send"),
                        _arr_dtype(send), op, root, stream, None, k)
        return recv

    def all_to_all(self, send, recv, stream=None):
        n = _size(send, "send")
        if n % self.size:
            raise InvalidArgumentError(f"all_to_all: send has {n} elements, not a multiple of the "
                                       f"communicator size {self.size}")
        c = n // self.size
        _collective(OpType.ALLTOALL, _all_to_all_args, self, send, recv, (c, c),
                    _arr_dtype(send), None, None, stream, None)
        return recv

    def send(self, buf, dest, stream=None):
        send(buf, _size(buf, "buf"), _arr_dtype(buf), dest, self, stream, site=callsite(2))

    def recv(self, buf, src, stream=None):
        recv(buf, _size(buf, "buf"), _arr_dtype(buf), src, self, stream, site=callsite(2))
        return buf

    def barrier(self, stream=None):
        barrier(self, stream, site=callsite(2))


def _size(a, name) -> int:
    if not isinstance(a, runtime.DeviceArray):
        raise InvalidArgumentError(f"{name}={describe(a)}: the Comm methods infer count and dtype from a "
                                   "DeviceArray; use hccl.<collective>(...) with a count for DevicePtr")
    return a.size


def _arr_dtype(a) -> DataType:
    dt = from_numpy(a.dtype)
    if dt is None:
        raise InvalidArgumentError(f"dtype {a.dtype} of the DeviceArray is not an HCCL data type "
                                   f"({', '.join(d.name for d in DataType)})")
    return dt
