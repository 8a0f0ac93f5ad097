"""launcher.spawn: return values (closures, lambdas), the job's store inside fn, failures with the
failing rank's traceback, timeouts with every rank's stacks, and no leftovers."""
from __future__ import annotations

import os
import pickle
import time

import pytest

import launcher
from launcher.errors import ProcessExitedError, ProcessRaisedError, SpawnTimeoutError
from tests.leakcheck import LeakCheck, MARKER, pid_gone


@pytest.mark.timeout(60)
def test_spawn_returns_values_and_ranks_share_the_store():
    factor = 7
    seen = []

    def exchange(rank, base):  # a closure: shipped by value with cloudpickle
        from hccl.store import StoreClient
        store = StoreClient(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                            bytes.fromhex(os.environ["NPUSIM_JOB_SECRET"]), timeout=30)
        store.set(f"v/{rank}", str(base + rank))
        total = sum(int(store.get(f"v/{i}")) for i in range(int(os.environ["WORLD_SIZE"])))
        seen.append(rank)  # the child's copy: never comes back
        return {"rank": rank, "scaled": rank * factor, "total": total,
                "local": int(os.environ["LOCAL_RANK"]), "job": os.environ["NPUSIM_JOB_ID"],
                "device": os.environ["DEVICE_ID"], "pid": os.getpid()}

    with LeakCheck() as lc:
        out = launcher.spawn(exchange, 3, args=(10,), env={MARKER: lc.tag})
        squares = launcher.spawn(lambda r: r * r, 2, env={MARKER: lc.tag})
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert [o["scaled"] for o in out] == [0, 7, 14]
    assert all(o["total"] == 33 for o in out)
    assert [o["local"] for o in out] == [0, 1, 2] and [o["device"] for o in out] == ["0", "1", "2"]
    assert len({o["job"] for o in out}) == 1
    assert all(pid_gone(o["pid"]) for o in out)
    assert seen == []
    assert squares == [0, 1]


def _rank_one_fails(rank, pid_dir):
    """A module-level function: pickled by reference, imported from this module by the rank."""
    with open(os.path.join(pid_dir, f".pid.{rank}"), "w") as f:    # whole or absent
        f.write(str(os.getpid()))
    os.replace(os.path.join(pid_dir, f".pid.{rank}"), os.path.join(pid_dir, f"pid.{rank}"))
    while len([n for n in os.listdir(pid_dir) if n.startswith("pid.")]) < 3:  # everyone is up
        time.sleep(0.01)

    def deep_inside(x):
        raise RuntimeError(f"rank {x} cannot go on")

    if rank == 1:
        deep_inside(rank)
    if rank == 2:
        time.sleep(1.0)
        os._exit(3)  # would fail too, but after rank 1: not the root cause
    time.sleep(120)


@pytest.mark.timeout(60)
def test_spawn_raises_with_the_failing_ranks_traceback(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def task(rank):
        return _rank_one_fails(rank, str(pid_dir))

    with LeakCheck() as lc:
        t0 = time.monotonic()
        with pytest.raises(ProcessRaisedError) as info:
            launcher.spawn(task, 3, env={MARKER: lc.tag, "NPUSIM_STOP_GRACE": "2"})
        elapsed = time.monotonic() - t0
        pids = [int((pid_dir / f"pid.{r}").read_text()) for r in range(3)]
        assert all(pid_gone(p) for p in pids)
    err = info.value
    assert err.rank == 1 and err.exitcode == 1
    assert "RuntimeError: rank 1 cannot go on" in err.traceback
    assert "deep_inside" in err.traceback
    assert "rank 1 failed" in str(err) and "deep_inside" in str(err)
    assert elapsed < 45                  # not the ranks' 120 s sleep (load slack)
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.rank, clone.exitcode, clone.traceback) == (1, 1, err.traceback)


@pytest.mark.timeout(60)
def test_spawn_exit_code_without_exception():
    with LeakCheck() as lc:
        with pytest.raises(ProcessExitedError) as info:
            launcher.spawn(lambda r: os._exit(5) if r == 0 else None, 2, env={MARKER: lc.tag})
    assert info.value.rank == 0 and info.value.exitcode == 5
    assert info.value.traceback == ""


@pytest.mark.timeout(60)
def test_spawn_timeout_reports_every_live_ranks_stack():
    def stuck_in_user_code(rank):
        while True:
            time.sleep(0.05)

    with LeakCheck() as lc:
        t0 = time.monotonic()
        with pytest.raises(SpawnTimeoutError) as info:
            launcher.spawn(stuck_in_user_code, 2, timeout=3, env={MARKER: lc.tag})
        elapsed = time.monotonic() - t0
    assert sorted(info.value.pending) == [0, 1]
    for rank in (0, 1):
        assert "stuck_in_user_code" in info.value.stacks[rank], info.value.stacks
    assert "stacks of rank 1" in str(info.value)
    assert elapsed < 45                  # the 3 s timeout, not forever (load slack)
