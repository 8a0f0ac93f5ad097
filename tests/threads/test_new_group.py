"""Comm.new_group, torch's habit: every rank calls it; members get the group, others None."""
import numpy as np
import pytest

import hccl
import runtime

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("size,members", [(3, [2, 0]), (4, [1, 3]), (4, [0, 1, 2, 3]), (2, [1])])
def test_every_rank_calls_new_group(ranks, size, members):
    def body(comm):
        g = comm.new_group(members)
        if comm.rank not in members:
            assert g is None
            return None
        want = sorted(members)
        assert g.size == len(want) and g.rank == want.index(comm.rank)     # local rank
        x = runtime.to_device(np.full(5, comm.rank + 1, np.int64))
        g.all_reduce(x)
        out = x.to_host()
        g.destroy()
        return out

    results = ranks(size, body)
    total = sum(r + 1 for r in members)
    for r in range(size):
        if r in members:
            assert np.array_equal(results[r], np.full(5, total, np.int64))
        else:
            assert results[r] is None


def test_new_group_twice_gives_distinct_comms_and_checks_args(ranks):
    def body(comm):
        a = comm.new_group([0, 1])
        b = comm.new_group([0, 1])
        assert a.comm_id != b.comm_id
        x = runtime.to_device(np.array([comm.rank], np.int32))
        y = runtime.to_device(np.array([10 * comm.rank], np.int32))
        b.all_reduce(y)          # b before a: distinct communicators never cross
        a.all_reduce(x)
        runtime.synchronize()
        msgs = []
        for bad in ([0, 0], [0, 5], [], [0.5], "01"):
            with pytest.raises(hccl.InvalidArgumentError) as e:
                comm.new_group(bad)
            msgs.append(str(e.value))
        a.destroy()
        b.destroy()
        return x.to_host()[0], y.to_host()[0], msgs

    for x, y, msgs in ranks(2, body):
        assert (x, y) == (1, 10)
        assert "listed more than once" in msgs[0] and "out of range" in msgs[1]
        assert "at least one rank" in msgs[2] and "not an int rank" in msgs[3]
        assert "expected a list of ints" in msgs[4]


def test_create_sub_comm_by_a_non_member_points_to_new_group(ranks):
    def body(comm):
        if comm.rank == 1:
            with pytest.raises(hccl.InvalidArgumentError, match="new_group"):
                comm.create_sub_comm([0])
        return True

    assert ranks(2, body) == [True, True]
