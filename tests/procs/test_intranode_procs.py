"""The intra-node channel over real processes: same bytes as the network path, other nodes over
the network, no shared-memory segment outliving a job (even one whose rank is SIGKILLed), and
2 ranks' in-place AllReduce staged exactly where a send waits for the peer."""
import hashlib
import multiprocessing as mp
import os
import secrets
import sys
import textwrap
import traceback

import pytest

import hccl
from tests.leakcheck import LeakCheck, run_npurun

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def _rank_main(rank, size, root_info, cases, env, fake_nodes, q):
    try:
        sys.path.insert(0, TESTS)
        os.environ.update(env)
        os.environ["NPUSIM_HBM_BYTES"] = str(1 << 30)
        import collective_cases as cc
        import runtime
        from hccl import executor
        from runtime import ipc
        if fake_nodes:                       # ranks of "another node" get another node id
            ipc._node_id = f"{ipc.node_id()}/fake{fake_nodes[rank]}"
        runtime.set_device(rank)
        comm = hccl.comm_init_root_info(size, root_info, rank)
        t = comm.world.transport
        job = os.environ["NPUSIM_JOB_ID"]
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"npusim-{job}-hccl-r{rank}-")]
        digests, failures = [], []
        for case in cases:
            out = cc.run_case(comm, case)
            digests.append(None if out is None else hashlib.sha256(out.tobytes()).hexdigest())
            try:
                cc.check(out, cc.expected(size, rank, case), case, size)
            except AssertionError as e:
                failures.append(f"{case}: {str(e)[:300]}")
        info = {"digests": digests, "failures": failures, "left": left,
                "local": t.local_peers, "ring": t.ring_sends,
                "shm": t.channel is not None, "solo": t.solo_bytes,
                "staged": [type(c.program.ops[0]) is executor.BoundCopy
                           for c in comm._calls._d.values()],
                # per Call: bound again to the real pairs after its first run, and whether
                # every Send and Recv holds what its pair prepared
                "provisional": [c.program.provisional for c in comm._calls._d.values()],
                "prepared": [all(op.fn is not None for op in c.program.ops
                                 if type(op) in (executor.BoundSend, executor.BoundRecv))
                             for c in comm._calls._d.values()]}
        comm.destroy()
        runtime.reset_device()
        q.put((rank, info))
    except BaseException:
        q.put((rank, {"failures": [traceback.format_exc()]}))


def run_procs(size, cases, env, fake_nodes=None, timeout=200):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    info = hccl.get_root_info()
    env = {"NPUSIM_JOB_ID": "itest" + secrets.token_hex(4), "NPUSIM_SLICE_BYTES": "4096", **env}
    procs = [ctx.Process(target=_rank_main, args=(r, size, info, cases, env, fake_nodes, q),
                         daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    try:
        results = dict(q.get(timeout=timeout) for _ in range(size))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    assert sorted(results) == list(range(size))
    bad = {r: i["failures"] for r, i in results.items() if i["failures"]}
    assert not bad, bad
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"npusim-{env['NPUSIM_JOB_ID']}-")]
    return results


def _cases(size):
    sys.path.insert(0, TESTS)
    import collective_cases as cc
    # 5 and 6000 elements: inside one ring slot, and sliced (4 KiB) through device memory
    return [c for c in cc.cases([5, 6000], size=size) if c["dtype"] in ("float32", "bfloat16",
                                                                        "int64", "uint8")]


@pytest.mark.timeout(400)
def test_channel_and_network_paths_give_identical_bytes():
    size = 3
    cases = _cases(size)
    shm = run_procs(size, cases, {})
    for forced in ({"NPUSIM_SHM": "0"}, {"HCCL_INTRA_ROCE_ENABLE": "1"}):
        net = run_procs(size, cases, forced)
        for r in range(size):
            assert not net[r]["shm"] and net[r]["ring"] == 0 and net[r]["local"] == []
            assert net[r]["digests"] == shm[r]["digests"], (forced, r)
    for r in range(size):
        assert shm[r]["shm"]
        assert shm[r]["local"] == [p for p in range(size) if p != r]
        assert shm[r]["ring"] > len(cases)          # the channel carried the traffic
        assert shm[r]["left"] == []                 # its own name gone once init returned


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env,solo", [({}, (64 << 10) + 32),            # a slot, less its header
                                      ({"NPUSIM_SHM_SLOT_BYTES": "4224"}, 4128),
                                      ({"NPUSIM_SHM": "0"}, 256 << 20)])   # zmq.MAX_MESSAGE
def test_two_ranks_in_place_all_reduce_stages_only_sends_that_wait_for_the_peer(env, solo):
    """In place on 2 ranks, the one-shot AllReduce skips its staging copy up to the transport's
    ``solo_bytes`` (a copy into a ring slot; sockets: any size) and stages above, where a send
    completes only once the peer has read it: exact results both ways, no wait on each other."""
    nbytes = [1024, 4096, 8192, 64 << 10]
    cases = [{"op": "all_reduce", "dtype": dt, "redop": redop, "count": nb // 4, "inplace": True}
             for nb in nbytes for dt, redop in (("float32", "SUM"), ("int32", "MAX"))]
    got = run_procs(2, cases, {"NPUSIM_SLICE_BYTES": str(1 << 20), **env})
    for r in range(2):
        assert got[r]["solo"] == solo
        # the Calls in the order made: one per case (a fresh buffer each time), staged above solo
        assert got[r]["staged"] == [nb > solo for nb in nbytes for _ in range(2)], (r, env)
        # a message that goes into a ring slot is prepared (shm.RingWriter / RingReader)
        ring = env.get("NPUSIM_SHM") != "0"
        assert got[r]["provisional"] == [False] * len(cases)
        assert got[r]["prepared"] == [ring and nb <= solo for nb in nbytes for _ in range(2)]


@pytest.mark.timeout(300)
def test_ranks_on_different_nodes_use_the_network():
    size = 4
    cases = _cases(size)[:12]
    res = run_procs(size, cases, {}, fake_nodes={0: "a", 1: "a", 2: "b", 3: "b"})
    for r in range(size):
        assert res[r]["local"] == [r ^ 1], res[r]["local"]   # the partner on its node only
        assert res[r]["ring"] > 0


KILL_SCRIPT = """
import glob, os, signal, sys, time
import runtime, hccl
job = os.environ["NPUSIM_JOB_ID"]
rank = int(os.environ["RANK"])
if rank == 1:
    # wait until rank 0 created its segment (it waits in init for us), then die hard
    deadline = time.monotonic() + 30
    while not glob.glob(f"/dev/shm/npusim-{job}-hccl-r0-*"):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)
    open(os.path.join({out!r}, "saw"), "w").write(job)
    os.kill(os.getpid(), signal.SIGKILL)
runtime.set_device(rank)
hccl.init_comm()
"""


@pytest.mark.timeout(120)
def test_no_segment_outlives_a_job_whose_rank_is_killed_during_init(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT.replace("{out!r}", repr(str(tmp_path)))))
    with LeakCheck() as lc:
        lc.env["HCCL_CONNECT_TIMEOUT"] = "60"
        res = run_npurun("--nproc-per-node", "2", str(script), env=lc.env, cwd=str(tmp_path),
                         timeout=100)
    assert res.returncode != 0
    job = (tmp_path / "saw").read_text()         # the segment existed while the job ran
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"npusim-{job}-")]
