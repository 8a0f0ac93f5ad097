"""Schedules as data: topology, step counts, layout, and a symbolic run of all ranks."""
from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest

from hccl import schedule as sch
from hccl.errors import InvalidArgumentError
from hccl.reduction import reduce3, reduce_into, reduce_reference
from hccl.schedule import NONE, SCRATCH, Copy, Recv, Send
from hccl.steps import Layout, split
from hccl.types import OpType, ReduceOp

SIZES = [1, 2, 3, 4, 5, 8]
COUNTS = [0, 1, 7, 1000, 1001]
BIG = 1 << 30
COLLECTIVES = [OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCE_SCATTER, OpType.BROADCAST,
               OpType.REDUCE, OpType.ALLTOALL, OpType.SEND, OpType.BARRIER]


def programs(op, size, count, itemsize=4, slice_bytes=BIG, root=0, inplace=False, algo="ring"):
    """Every rank's schedule. SEND stands for a ring of point-to-point pairs r -> r+1."""
    if op is OpType.SEND:
        return [[*sch.build(OpType.SEND, r, size, count, itemsize, slice_bytes, peer=(r + 1) % size),
                 *sch.build(OpType.RECV, r, size, count, itemsize, slice_bytes,
                            peer=(r - 1) % size)] for r in range(size)]
    return [sch.build(op, r, size, count, itemsize, slice_bytes, root=root, inplace=inplace,
                      algo=algo) for r in range(size)]


def messages(progs):
    sends, recvs = collections.Counter(), collections.Counter()
    for r, prog in enumerate(progs):
        for st in prog:
            if isinstance(st, Send):
                sends[(r, st.peer, st.step, st.nbytes)] += 1
            elif isinstance(st, Recv):
                recvs[(st.peer, r, st.step, st.nbytes)] += 1
    return sends, recvs


# --- symbolic execution -----------------------------------------------------------------------

def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def simulate(progs, bufs, op=ReduceOp.SUM, dtype=np.int32, solo=0):
    """Run all ranks' schedules round-robin over an in-memory mailbox, with zero-copy semantics.

    A rank blocks on a Recv whose message is not there, and on any write over bytes that one of
    its sends not yet received still reads (the strictest transport), but for sends of at most
    ``solo`` bytes (``Transport.solo_bytes``: complete at once). Fails on deadlock, on a tag
    used twice, on a size mismatch and on messages left over.
    """
    n = len(progs)
    views = []
    for r in range(n):
        v = {k: a.reshape(-1).view(np.uint8) for k, a in bufs[r].items()}
        ext = sch.buffer_extents(progs[r])
        if SCRATCH in ext:
            v[SCRATCH] = np.full(ext[SCRATCH], 0xEE, np.uint8)
        v[NONE] = np.empty(0, np.uint8)
        for name, need in ext.items():
            assert v[name].nbytes >= need, (r, name, need)
        views.append(v)
    pcs, mail, used = [0] * n, {}, set()
    pending = [[] for _ in range(n)]

    def blocked(r, buf, off, nb):
        if not nb:
            return False
        lo = _addr(views[r][buf]) + off
        pending[r] = [p for p in pending[r] if p[2] in mail]
        return any(p[0] < lo + nb and lo < p[1] for p in pending[r])

    while True:
        progress = False
        for r in range(n):
            prog, v = progs[r], views[r]
            while pcs[r] < len(prog):
                st = prog[pcs[r]]
                if isinstance(st, Send):
                    key = (r, st.peer, st.step)
                    assert key not in used, f"tag used twice: {key}"
                    used.add(key)
                    mail[key] = bytes(v[st.buf][st.offset:st.offset + st.nbytes])
                    assert len(mail[key]) == st.nbytes
                    lo = _addr(v[st.buf]) + st.offset
                    if st.nbytes > solo:
                        pending[r].append((lo, lo + st.nbytes, key))
                elif isinstance(st, Recv):
                    key = (st.peer, r, st.step)
                    if key not in mail or blocked(r, st.buf, st.offset, st.nbytes):
                        break
                    data = mail.pop(key)
                    assert len(data) == st.nbytes, (key, len(data), st.nbytes)
                    dst = v[st.buf][st.offset:st.offset + st.nbytes]
                    if st.reduce and st.src:        # dst = src op payload (src may be dst)
                        reduce3(dst.view(dtype), v[st.src][st.offset:st.offset + st.nbytes]
                                .view(dtype), np.frombuffer(data, dtype), op)
                    elif st.reduce:
                        reduce_into(dst.view(dtype), np.frombuffer(data, dtype), op)
                    else:
                        dst[...] = np.frombuffer(data, np.uint8)
                elif isinstance(st, sch.LocalReduce):
                    if blocked(r, st.dst_buf, st.dst_off, st.nbytes):
                        break
                    reduce_into(v[st.dst_buf][st.dst_off:st.dst_off + st.nbytes].view(dtype),
                                v[st.src_buf][st.src_off:st.src_off + st.nbytes].view(dtype), op)
                else:
                    if _addr(v[st.src_buf]) + st.src_off == _addr(v[st.dst_buf]) + st.dst_off:
                        pcs[r] += 1                 # a self-copy: skipped, as the executor does
                        progress = True
                        continue
                    if blocked(r, st.dst_buf, st.dst_off, st.nbytes):
                        break
                    np.copyto(v[st.dst_buf][st.dst_off:st.dst_off + st.nbytes],
                              v[st.src_buf][st.src_off:st.src_off + st.nbytes])
                pcs[r] += 1
                progress = True
        if all(pcs[r] == len(progs[r]) for r in range(n)):
            break
        stuck = [(r, progs[r][pcs[r]]) for r in range(n) if pcs[r] < len(progs[r])]
        assert progress, f"deadlock: {stuck}"
    assert not mail, f"messages never received: {sorted(mail)}"


def make_case(op, size, count, dtype, inplace, root, rng, redop=ReduceOp.SUM):
    """Per-rank buffers (set up for in-place where asked) and the expected recv contents."""
    def data(n):
        if np.dtype(dtype).kind == "f":
            return rng.standard_normal(n).astype(dtype)
        return rng.integers(-50, 50, n).astype(dtype)

    n_in = {OpType.ALLGATHER: count, OpType.REDUCE_SCATTER: size * count,
            OpType.ALLTOALL: size * count}.get(op, count)
    n_out = {OpType.ALLGATHER: size * count, OpType.REDUCE_SCATTER: count,
             OpType.ALLTOALL: size * count}.get(op, count)
    xs = [data(n_in) for _ in range(size)]
    bufs, expect = [], []
    for r in range(size):
        if op is OpType.BROADCAST:
            recv = xs[r].copy() if r == root else np.full(n_out, 7, dtype)
            send = recv
        elif inplace and op is OpType.ALLGATHER:
            recv = np.full(n_out, 7, dtype)
            send = recv[:count]
            send[...] = xs[r]
        elif inplace and op is OpType.REDUCE_SCATTER:
            send = xs[r].copy()
            recv = send[:count]
        elif inplace:
            send = recv = xs[r].copy()
        else:
            send, recv = xs[r].copy(), np.full(n_out, 7, dtype)
        bufs.append({"send": send, "recv": recv})
    total = reduce_reference(xs, redop) if xs and op.reduces else None
    for r in range(size):
        if op is OpType.ALLREDUCE:
            e = total
        elif op is OpType.ALLGATHER:
            e = np.concatenate(xs)
        elif op is OpType.REDUCE_SCATTER:
            e = total[r * count:(r + 1) * count]
        elif op is OpType.BROADCAST:
            e = xs[root]
        elif op is OpType.REDUCE:
            e = total if r == root else bufs[r]["recv"].copy()
        elif op is OpType.ALLTOALL:
            e = np.concatenate([xs[j][r * count:(r + 1) * count] for j in range(size)])
        elif op is OpType.SEND:
            e = xs[(r - 1) % size]
        else:
            e = bufs[r]["recv"].copy()
        expect.append(e)
    return bufs, expect


# --- topology and counts ----------------------------------------------------------------------

@pytest.mark.parametrize("op", COLLECTIVES)
@pytest.mark.parametrize("algo", ["ring", "tree", "hd", "scatter", "oneshot", "star", "mesh"])
def test_every_send_has_a_matching_recv(op, algo):
    for size, count, sl in itertools.product(SIZES, COUNTS, [BIG, 64]):
        if op is OpType.SEND and size == 1:
            continue
        for root in {0, size - 1}:
            sends, recvs = messages(programs(op, size, count, 4, sl, root=root, algo=algo))
            assert sends == recvs, (op, size, count, sl, root)
            assert all(c == 1 for c in sends.values()), "a (src, dst, step) tag is used twice"


@pytest.mark.parametrize("size", SIZES)
def test_ring_allreduce_has_2n_minus_2_steps_between_ring_neighbours(size):
    for count in COUNTS:
        for r, prog in enumerate(programs(OpType.ALLREDUCE, size, count)):
            sends = [s for s in prog if isinstance(s, Send)]
            recvs = [s for s in prog if isinstance(s, Recv)]
            assert len(sends) == len(recvs) == 2 * (size - 1)
            assert sum(s.reduce for s in recvs) == size - 1
            assert {s.peer for s in sends} <= {(r + 1) % size}
            assert {s.peer for s in recvs} <= {(r - 1) % size}
            assert [s.step for s in sends] == list(range(2 * (size - 1)))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_ring_allreduce_bytes_on_the_wire(size):
    count, isz = 1001, 4
    chunks = [n * isz for _, n in sch.split(count, size)]
    for r, prog in enumerate(programs(OpType.ALLREDUCE, size, count, isz, 256)):
        sent = sum(s.nbytes for s in prog if isinstance(s, Send))
        got = sum(s.nbytes for s in prog if isinstance(s, Recv))
        # RS sends every chunk but r's own, AG every chunk but r+1's: 2(n-1)/n * S;
        # RS receives every chunk but r-1's, AG every chunk but r's own
        assert sent == 2 * count * isz - chunks[r] - chunks[(r + 1) % size]
        assert got == 2 * count * isz - chunks[(r - 1) % size] - chunks[r]


def test_uneven_chunks_differ_by_at_most_one_element_and_tile_the_buffer():
    for count, size in itertools.product(range(0, 40), SIZES):
        parts = sch.split(count, size)
        assert sum(n for _, n in parts) == count
        assert max(n for _, n in parts) - min(n for _, n in parts) <= 1
        assert [f for f, _ in parts] == list(itertools.accumulate([0] + [n for _, n in parts[:-1]]))


def test_reduce_scatter_chunk_regions_cover_each_chunk_once_per_rank():
    size, count, isz = 5, 3, 2
    for r, prog in enumerate(programs(OpType.REDUCE_SCATTER, size, count, isz)):
        reduced = sorted((s.buf, s.offset) for s in prog if isinstance(s, Recv))
        assert len(reduced) == size - 1 and all(isinstance(s, Recv) and s.reduce for s in prog
                                                 if isinstance(s, Recv))
        assert ("recv", 0) in reduced          # the last step lands in recv


@pytest.mark.parametrize("op", COLLECTIVES)
def test_zero_count_exchanges_empty_messages_and_copies_nothing(op):
    for size in SIZES:
        if op is OpType.SEND and size == 1:
            continue
        for prog in programs(op, size, 0):
            assert all(s.nbytes == 0 for s in prog)
            assert not any(isinstance(s, Copy) for s in prog)
        if op in (OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCE_SCATTER) and size > 1:
            # still one message per ring step, so a mismatched peer is detected
            assert any(isinstance(s, Send) for s in programs(op, size, 0)[0])


def test_size_one_is_copy_only_or_empty():
    c = 10
    assert sch.ring_all_reduce(0, 1, c, 4, BIG) == [Copy("send", 0, "recv", 0, 40)]
    assert sch.ring_all_reduce(0, 1, c, 4, BIG, inplace=True) == []
    assert sch.ring_all_gather(0, 1, c, 4, BIG) == [Copy("send", 0, "recv", 0, 40)]
    assert sch.ring_reduce_scatter(0, 1, c, 4, BIG) == [Copy("send", 0, "recv", 0, 40)]
    assert sch.chain_broadcast(0, 1, c, 4, BIG, root=0) == []
    assert sch.chain_reduce(0, 1, c, 4, BIG, root=0) == [Copy("send", 0, "recv", 0, 40)]
    assert sch.pairwise_all_to_all(0, 1, c, 4, BIG) == [Copy("send", 0, "recv", 0, 40)]
    assert sch.dissemination_barrier(0, 1) == []


def test_slices_fit_slice_bytes_whole_elements_and_pipeline_per_slice():
    size, count, isz, sl = 4, 1201, 8, 1000            # 125 elements a slice, chunks 301/300
    for r, prog in enumerate(programs(OpType.ALLREDUCE, size, count, isz, sl)):
        net = [s for s in prog if isinstance(s, (Send, Recv))]
        assert all(0 < s.nbytes <= sl and s.nbytes % isz == 0 for s in net)
        assert sum(isinstance(s, Send) for s in net) == 2 * (size - 1) * 3
        # each received slice is sent on at once: Recv(step t) is followed by Send(step t + width)
        for a, b in zip(prog, prog[1:]):
            if isinstance(a, Recv) and a.step < (2 * (size - 1) - 1) * 3:
                assert isinstance(b, Send) and (b.offset, b.nbytes, b.step) == (
                    a.offset, a.nbytes, a.step + 3)


def test_barrier_is_dissemination_with_zero_byte_messages():
    for size in SIZES:
        rounds = (size - 1).bit_length()
        for r, prog in enumerate(programs(OpType.BARRIER, size, 0)):
            assert len(prog) == 2 * rounds
            assert all(s.nbytes == 0 and s.buf == NONE for s in prog)


def test_tree_broadcast_hops_are_logarithmic():
    for size in SIZES:
        progs = programs(OpType.BROADCAST, size, 5, algo="tree", root=size // 2)
        assert sum(isinstance(s, Send) for p in progs for s in p) == size - 1
        assert max(sum(isinstance(s, Send) for s in p) for p in progs) == (size - 1).bit_length()


def test_registry_and_argument_errors():
    assert set(sch.ALGORITHMS) >= {"ring"}
    assert all(set(v) == set(OpType) for v in sch.ALGORITHMS.values())
    with pytest.raises(InvalidArgumentError, match="ring"):
        sch.algorithms("bogus")
    assert sch.algorithms(" RING ") is sch.ALGORITHMS["ring"]
    with pytest.raises(InvalidArgumentError, match="root 4"):
        sch.build(OpType.BROADCAST, 0, 4, 1, 4, BIG, root=4)
    with pytest.raises(InvalidArgumentError, match="peer"):
        sch.build(OpType.SEND, 1, 4, 1, 4, BIG, peer=1)
    with pytest.raises(InvalidArgumentError):
        sch.build(OpType.ALLREDUCE, 4, 4, 1, 4, BIG)
    with pytest.raises(InvalidArgumentError):
        sch.build(OpType.ALLREDUCE, 0, 4, -1, 4, BIG)
    assert list(sch.build("all_reduce", 0, 2, 2, 4, BIG)) == sch.ring_all_reduce(0, 2, 2, 4, BIG)


def test_buffer_extents():
    prog = sch.ring_reduce_scatter(1, 4, 10, 4, BIG)
    assert sch.buffer_extents(prog) == {"send": 160, "recv": 40, "scratch": 80}
    assert sch.buffer_extents(sch.dissemination_barrier(0, 4)) == {}


# --- symbolic runs against numpy --------------------------------------------------------------

SIM_CASES = ([(op, algo) for op in COLLECTIVES for algo in ("ring", "tree")
              if algo == "ring" or op in (OpType.BROADCAST, OpType.REDUCE)]
             + [(OpType.ALLREDUCE, "hd"), (OpType.ALLREDUCE, "oneshot"), (OpType.ALLREDUCE, "star"),
                (OpType.ALLREDUCE, "mesh"),
                (OpType.BROADCAST, "scatter"), (OpType.BROADCAST, "mesh"),
                (OpType.ALLGATHER, "mesh"), (OpType.ALLGATHER, "star")])


@pytest.mark.parametrize("size,op,algo", [(n, op, algo) for op, algo in SIM_CASES for n in SIZES
                                          if n > 1 or op is not OpType.SEND])   # p2p: two ranks
def test_simulated_results_match_numpy(op, algo, size):
    rng = np.random.default_rng(size * 100 + int(op))
    for count, sliced, inplace in itertools.product(COUNTS + [3 * size + 1], [False, True],
                                                    [False, True]):
        if inplace and op in (OpType.BROADCAST, OpType.SEND, OpType.BARRIER):
            continue
        # sliced: a few elements a slice for small counts, about ten slices a chunk for big ones
        sl = (4 * 7 if count < 100 else 4 * 97) if sliced else BIG
        root = (count + 1) % size
        bufs, expect = make_case(op, size, count, np.int32, inplace, root, rng)
        progs = programs(op, size, count, 4, sl, root=root, inplace=inplace, algo=algo)
        simulate(progs, bufs)
        for r in range(size):
            np.testing.assert_array_equal(bufs[r]["recv"], expect[r],
                                          err_msg=f"{op} {algo} size={size} count={count} "
                                                  f"slice={sl} inplace={inplace} rank={r}")


@pytest.mark.parametrize("algo", ["ring", "hd", "oneshot", "star", "mesh"])
@pytest.mark.parametrize("size", [3, 5, 8])
@pytest.mark.parametrize("redop", list(ReduceOp))
def test_simulated_float_allreduce_is_bitwise_identical_on_every_rank(size, redop, algo):
    rng = np.random.default_rng(7)
    for count, sl in [(1001, BIG), (1001, 64), (7, BIG)]:
        bufs, expect = make_case(OpType.ALLREDUCE, size, count, np.float32, False, 0, rng, redop)
        simulate(programs(OpType.ALLREDUCE, size, count, 4, sl, algo=algo), bufs, redop,
                 np.float32)
        first = bufs[0]["recv"].view(np.uint32)
        for r in range(1, size):
            np.testing.assert_array_equal(bufs[r]["recv"].view(np.uint32), first)
        np.testing.assert_allclose(bufs[0]["recv"], expect[0], rtol=1e-5, atol=1e-5)


def test_one_shot_all_reduce_structure_and_fallback():
    """One message to and from every peer, own data staged in scratch only in place,
    contributions reduced in rank order 0..n-1 on every rank; above slice_bytes it is the ring."""
    n, count = 4, 100
    for rank, inplace in itertools.product(range(n), [False, True]):
        own = sch.SCRATCH if inplace else sch.SEND
        steps = sch.one_shot_all_reduce(rank, n, count, 4, 1 << 20, inplace=inplace)
        sends = [s for s in steps if isinstance(s, sch.Send)]
        recvs = [s for s in steps if isinstance(s, sch.Recv)]
        assert sorted(s.peer for s in sends) == sorted(set(range(n)) - {rank})
        assert all(s.buf == own and s.nbytes == 400 and s.step == 0 for s in sends)
        assert [type(s) for s in steps if isinstance(s, sch.Copy)] == \
            ([sch.Copy] if inplace else [])                      # only the staging copy
        # what goes into recv, in order: rank 0 reads its own data with rank 1's message, rank
        # 1 rank 0's message with its own data (payload first)
        order = [p for s in steps for p in
                 ([s.peer] if isinstance(s, sch.Recv) and not s.src else
                  [s.peer, rank] if isinstance(s, sch.Recv) and s.payload_first else
                  [rank, s.peer] if isinstance(s, sch.Recv) else
                  [rank] if isinstance(s, sch.LocalReduce) else [])]
        assert order == list(range(n))                           # the same order on every rank
        assert [r.reduce for r in recvs] == [p != 0 or rank == 1 for p in range(n) if p != rank]
        assert [r.src for r in recvs] == [own if (rank, p) in ((0, 1), (1, 0)) else ""
                                          for p in range(n) if p != rank]
        assert [r.payload_first for r in recvs] == [rank == 1 and p == 0
                                                    for p in range(n) if p != rank]
    ring = sch.one_shot_all_reduce(1, n, count, 4, 256)           # 400 B > 256 B slices: ring
    assert not any(isinstance(s, sch.LocalReduce) for s in ring)
    assert sch.algorithms("oneshot")[OpType.ALLREDUCE] is sch.one_shot_all_reduce


@pytest.mark.parametrize("count", [1, 7, 1000])
def test_two_ranks_in_place_one_shot_skips_the_staging_copy_when_sends_complete_alone(count):
    """In place on 2 ranks, sends the transport completes alone need no scratch: the one
    receive reduces into the buffer the send read. Larger sends still stage (without, the two
    ranks would wait for each other: the simulation's zero-copy sends deadlock)."""
    nb = 4 * count
    for solo, staged in ((nb, False), (1 << 30, False), (nb - 1, True), (0, True)):
        progs = [sch.build(OpType.ALLREDUCE, r, 2, count, 4, BIG, inplace=True, algo="oneshot",
                           solo_bytes=solo) for r in range(2)]
        assert [any(isinstance(s, Copy) for s in p) for p in progs] == [staged, staged]
        assert [sch.buffer_extents(p).get(SCRATCH, 0) for p in progs] == [nb * staged] * 2
        bufs, expect = make_case(OpType.ALLREDUCE, 2, count, np.float32, True, 0,
                                 np.random.default_rng(count), ReduceOp.SUM)
        simulate(progs, bufs, ReduceOp.SUM, np.float32, solo=solo)
        for r in range(2):
            np.testing.assert_array_equal(bufs[r]["recv"].view(np.uint32),
                                          bufs[0]["recv"].view(np.uint32))
            np.testing.assert_allclose(bufs[r]["recv"], expect[r], rtol=1e-6)
    unstaged = [sch.build(OpType.ALLREDUCE, r, 2, count, 4, BIG, inplace=True, algo="oneshot",
                          solo_bytes=nb) for r in range(2)]
    bufs, _ = make_case(OpType.ALLREDUCE, 2, count, np.int32, True, 0,
                        np.random.default_rng(1))
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(unstaged, bufs, solo=0)      # what staging avoids where sends wait
    for n in (3, 4):                          # from 3 ranks on, a receive overwrites own data
        assert all(isinstance(sch.build(OpType.ALLREDUCE, r, n, count, 4, BIG, inplace=True,
                                        algo="oneshot", solo_bytes=1 << 30)[0], Copy)
                   for r in range(n))


def test_star_all_reduce_goes_through_rank_0_in_rank_order():
    """2(n-1) messages in all; rank 0 reduces r0 op r1 op ... in rank order (its own data read
    with rank 1's message), then sends the result; above slice_bytes it is the ring."""
    n, count = 5, 100
    for inplace in (False, True):
        progs = [sch.star_all_reduce(r, n, count, 4, 1 << 20, inplace=inplace) for r in range(n)]
        for r in range(1, n):
            assert progs[r] == [sch.Send(0, sch.SEND, 0, 400, 0), sch.Recv(0, sch.RECV, 0, 400, 1)]
        root = progs[0]
        assert root[:n - 1] == [sch.Recv(1, sch.RECV, 0, 400, 0, True, sch.SEND)] + \
            [sch.Recv(p, sch.RECV, 0, 400, 0, True) for p in range(2, n)]
        assert root[n - 1:] == [sch.Send(p, sch.RECV, 0, 400, 1) for p in range(1, n)]
    ring = sch.star_all_reduce(1, n, count, 4, 256)               # 400 B > 256 B slices: ring
    assert len([s for s in ring if isinstance(s, Send)]) == 2 * (n - 1)
    assert sch.algorithms("star")[OpType.ALLREDUCE] is sch.star_all_reduce


def test_star_all_gather_goes_through_rank_0():
    """2(n-1) messages in all: every block to rank 0, the gathered buffer back; above
    slice_bytes the mesh."""
    n, count = 5, 100
    progs = [sch.star_all_gather(r, n, count, 4, 1 << 20) for r in range(n)]
    for r in range(1, n):
        assert progs[r] == [sch.Send(0, sch.SEND, 0, 400, 0), sch.Recv(0, sch.RECV, 0, n * 400, 1)]
    root = progs[0]
    assert root[:n - 1] == [sch.Recv(p, sch.RECV, p * 400, 400, 0) for p in range(1, n)]
    assert root[n - 1] == sch.Copy(sch.SEND, 0, sch.RECV, 0, 400)
    assert root[n:] == [sch.Send(p, sch.RECV, 0, n * 400, 1) for p in range(1, n)]
    assert sch.star_all_gather(1, n, count, 4, 1024) == sch.mesh_all_gather(1, n, count, 4, 1024)
    assert sch.algorithms("star")[OpType.ALLGATHER] is sch.star_all_gather


def test_mesh_all_reduce_is_two_rounds_between_every_pair():
    """Round 0: chunk c of send to rank c, own chunk = send op the others in rank order; round 1:
    own chunk to every rank, every other chunk from its owner. 2(n-1) messages a rank."""
    n, count = 4, 10                                    # chunks of 3, 3, 2, 2 elements
    lay = Layout(split(count, n), 4, 1 << 20)
    for r in range(n):
        steps = sch.mesh_all_reduce(r, n, count, 4, 1 << 20)
        others = [(r + i) % n for i in range(1, n)]
        mine = lay.slices[r][0]
        assert steps[:n - 1] == [Send(p, sch.SEND, *lay.slices[p][0], 0) for p in others]
        peers = sorted(others)
        assert steps[n - 1:2 * (n - 1)] == [Recv(peers[0], sch.RECV, *mine, 0, True, sch.SEND)] + \
            [Recv(p, sch.RECV, *mine, 0, True) for p in peers[1:]]
        assert steps[2 * (n - 1):3 * (n - 1)] == [Send(p, sch.RECV, *mine, 1) for p in others]
        assert sorted(s.peer for s in steps[3 * (n - 1):]) == peers
        assert all(isinstance(s, Recv) and not s.reduce and s.step == 1
                   for s in steps[3 * (n - 1):])
    assert sch.algorithms("mesh")[OpType.ALLREDUCE] is sch.mesh_all_reduce


def test_halving_doubling_rounds_are_logarithmic_and_extra_ranks_fold_in():
    """2 log2 p exchanges for the p = 2^k ranks, plus a fold at each end for the n - p others."""
    for size in (2, 4, 8, 5, 6):
        p = 1 << (size.bit_length() - 1)
        progs = programs(OpType.ALLREDUCE, size, 1000, algo="hd")
        for r, prog in enumerate(progs):
            peers = [s.peer for s in prog if isinstance(s, Send)]
            if r >= p:
                assert peers == [r - p]
            else:
                fold = [r + p] if r + p < size else []
                k = p.bit_length() - 1
                ring = [r ^ (p >> (j + 1)) for j in range(k)] + [r ^ (1 << j) for j in range(k)]
                assert peers == ring + fold


def test_choose_picks_by_size_and_world():
    assert sch.choose(OpType.ALLREDUCE, 1024, 2) == "oneshot"
    assert sch.choose(OpType.ALLREDUCE, sch.ONE_SHOT_BYTES + 1, 2) == "ring"
    assert sch.choose(OpType.ALLREDUCE, 1024, 3) == "star"
    assert sch.choose(OpType.ALLREDUCE, sch.STAR_BYTES, 8) == "star"
    assert sch.choose(OpType.ALLREDUCE, sch.STAR_BYTES + 1, 4) == "mesh"
    assert sch.choose(OpType.ALLREDUCE, 0, 4) == "mesh"
    assert sch.choose(OpType.ALLREDUCE, 64 << 20, 2) == "ring"
    assert sch.choose(OpType.BROADCAST, 1024, 4) == "tree"
    assert sch.choose(OpType.BROADCAST, 64 << 20, 4) == "tree"
    assert sch.choose(OpType.BROADCAST, 1 << 30, 3) == "tree"
    assert sch.choose(OpType.BROADCAST, 64 << 20, 2) == "tree"
    assert sch.choose(OpType.REDUCE, sch.TREE_BYTES, 4) == "tree"
    assert sch.choose(OpType.REDUCE, sch.TREE_BYTES + 1, 4) == "ring"
    assert sch.choose(OpType.ALLGATHER, 1024, 2) == "ring"
    assert sch.choose(OpType.ALLGATHER, 1024, 3) == "star"
    assert sch.choose(OpType.ALLGATHER, sch.STAR_GATHER_BYTES // 4, 4) == "star"
    assert sch.choose(OpType.ALLGATHER, sch.STAR_GATHER_BYTES // 4 + 1, 4) == "mesh"
    assert sch.choose(OpType.ALLGATHER, 0, 4) == "mesh"
    assert sch.choose(OpType.ALLGATHER, 64 << 20, 4) == "mesh"
    assert sch.algorithms("fullmesh") is sch.ALGORITHMS["mesh"]
    a = sch.build(OpType.ALLREDUCE, 1, 4, 300, 4, BIG, algo="auto")
    assert list(a) == sch.star_all_reduce(1, 4, 300, 4, BIG)
    assert sch.buffer_extents(a) == sch.buffer_extents(list(a))
    assert a.reduces is sch.reduces(list(a)) is False   # the star: rank 0 reduces, rank 1 not
    assert sch.algorithms("H-D_R") is sch.ALGORITHMS["hd"]


@pytest.mark.parametrize("nbytes", [1, 511, 512, 4096, (256 << 10), (256 << 10) + 1, 1 << 20])
def test_copy_bytes_copies_exactly_on_both_sides_of_the_gil_limit(nbytes):
    from hccl.executor import GIL_COPY_BYTES, copy_bytes
    rng = np.random.default_rng(nbytes)
    src = np.frombuffer(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes(), np.uint8)
    assert not src.flags.writeable          # a received payload is read-only
    dst = np.zeros(nbytes + 2, np.uint8)
    copy_bytes(dst[1:-1], src)
    assert bytes(dst[1:-1]) == bytes(src) and dst[0] == 0 and dst[-1] == 0
    assert (nbytes <= GIL_COPY_BYTES) == (nbytes <= 256 << 10)
