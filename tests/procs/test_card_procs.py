"""One card, several processes (runtime/memory/card.py): separate processes on device 0, no launcher.

The second process sees the first one's bytes, is refused past the card with an error naming
the first, is capped by its fraction, and gets the bytes of a holder killed with SIGKILL back;
through ``runtime`` and ``runtime.acl`` (no torch). Every wait has a deadline; each test has a
card directory of its own.
"""
import os
import signal
import struct
import subprocess
import sys

import pytest

import runtime
from runtime import card, errors
from tests.card_holder import Holder
from tests.leakcheck import reaped

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def card_dir(tmp_path, monkeypatch):
    d = tmp_path / "cards"
    monkeypatch.setenv("NPUSIM_CARD_DIR", str(d))
    monkeypatch.setenv("NPUSIM_HBM_BYTES", str(GiB))
    monkeypatch.delenv("NPUSIM_CARD_SHARE", raising=False)
    # a device an earlier test left open keeps its capacity and card: start from none
    for dev in list(runtime.context.contexts_by_device):
        runtime.reset_device(dev)
    yield d
    for dev in list(runtime.context.contexts_by_device):
        runtime.reset_device(dev)


@pytest.mark.timeout(120)
def test_the_second_process_sees_the_first_ones_bytes_and_is_refused_past_the_card(card_dir):
    with Holder(0, 700) as first:
        runtime.set_device(0)
        free, total = runtime.get_mem_info()
        assert (free, total) == (GiB - 700 * MiB, GiB)
        [h] = runtime.memory.card_holders()
        assert (h.pid, h.reserved, h.job, h.rank) == (first.pid, 700 * MiB, "local", None)
        small = runtime.malloc(100 * MiB)            # fits beside the first
        assert runtime.get_mem_info()[0] == GiB - 800 * MiB
        with pytest.raises(errors.OutOfMemoryError) as ei:
            runtime.malloc(300 * MiB)
        e = ei.value
        assert e.code == errors.ACL_ERROR_RT_MEMORY_ALLOCATION
        assert f"pid {first.pid} of job local: 700.00 MiB" in str(e)
        assert "1.00 GiB total capacity" in str(e) and "224.00 MiB free" in str(e), str(e)
        assert e.others_reserved == 700 * MiB
        assert e.holders == [{"pid": first.pid, "job": "local", "rank": None,
                              "reserved": 700 * MiB}]
        runtime.free(small)
        assert first.release() == 0
    # the first has gone: the whole card is this process's again (its cached 100 MiB counts)
    assert runtime.get_mem_info()[0] == GiB - 100 * MiB
    runtime.empty_cache()
    assert runtime.get_mem_info()[0] == GiB
    big = runtime.malloc(900 * MiB)
    runtime.free(big)


@pytest.mark.timeout(120)
def test_a_holder_killed_with_sigkill_gives_its_bytes_back(card_dir):
    runtime.set_device(0)
    first = Holder(0, 700)
    try:
        assert runtime.get_mem_info()[0] == GiB - 700 * MiB
        path = card.ledger_path(0)
        size = os.path.getsize(path)
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait(30)
    finally:
        first.kill()
    # no cleanup ran in the holder: its slot still says 700 MiB, its lock is gone with it
    with open(path, "rb") as f:
        data = f.read()
    pids = [struct.unpack_from("<qqq", data, card.HEADER + i * card.SLOT)
            for i in range((len(data) - card.HEADER) // card.SLOT)]
    assert any(p[0] == first.pid and p[2] == 700 * MiB for p in pids), pids
    assert runtime.get_mem_info()[0] == GiB
    assert runtime.memory.card_holders() == []
    x = runtime.malloc(900 * MiB)
    runtime.free(x)
    with Holder(0, 10) as again:                      # the dead slot is taken again
        assert os.path.getsize(path) == size
        assert [h.pid for h in runtime.memory.card_holders()] == [again.pid]
        again.release()


@pytest.mark.timeout(120)
def test_a_fraction_of_a_tenth_refuses_150_mib_of_a_1_gib_card(card_dir):
    runtime.set_device(0)
    runtime.set_per_process_memory_fraction(0.1)
    with pytest.raises(errors.OutOfMemoryError) as ei:
        runtime.malloc(150 * MiB)
    assert "limit 102.40 MiB" in str(ei.value) and ei.value.limit == int(0.1 * GiB)
    assert ei.value.code == errors.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert ei.value.holders == [] and "1.00 GiB free" in str(ei.value)
    ok = runtime.malloc(100 * MiB)
    # refused by the fraction while another process holds memory: the card's numbers too
    with Holder(0, 200) as other:
        with pytest.raises(errors.OutOfMemoryError) as ei:
            runtime.malloc(50 * MiB)
        assert f"pid {other.pid} of job local: 200.00 MiB" in str(ei.value)
        assert "724.00 MiB free" in str(ei.value), str(ei.value)
        other.release()
    runtime.free(ok)
    runtime.set_per_process_memory_fraction(1.0)


@pytest.mark.timeout(120)
def test_the_same_through_acl(card_dir):
    from runtime import acl
    assert acl.init() == 0
    try:
        assert acl.rt.set_device(0) == 0
        with Holder(0, 700) as first:
            free, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
            assert (free, total, ret) == (GiB - 700 * MiB, GiB, 0)
            p, ret = acl.rt.malloc(500 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            assert (p, ret) == (0, acl.ACL_ERROR_RT_MEMORY_ALLOCATION)
            assert f"pid {first.pid} of job local: 700.00 MiB" in acl.get_recent_err_msg()
            p, ret = acl.rt.malloc(300 * MiB, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            assert ret == 0
            free, _, _ = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
            assert free == GiB - 1000 * MiB
            assert acl.rt.free(p) == 0
            # aclrtFree gives the memory back to the card for aclrtGetMemInfo at once
            assert acl.rt.get_mem_info(acl.ACL_HBM_MEM)[0] == GiB - 700 * MiB
            first.release()
        assert acl.rt.get_mem_info(acl.ACL_HBM_MEM)[0] == GiB
    finally:
        acl.finalize()


@pytest.mark.timeout(120)
def test_holders_name_their_job_and_rank_and_other_devices_are_other_cards(card_dir):
    env = dict(os.environ, NPUSIM_JOB_ID="jobA", RANK="3", LOCAL_RANK="1")
    with Holder(1, 64, env=env) as r3:
        runtime.set_device(0)
        assert runtime.get_mem_info()[0] == GiB        # device 1's card is another card
        [h] = card.survey(1)
        assert (h.pid, h.job, h.rank, h.local_rank, h.reserved) == (r3.pid, "jobA", 3, 1,
                                                                    64 * MiB)
        assert h.label() == f"pid {r3.pid} of job jobA rank 3"
        # node 1 of a job simulated on this machine has cards of its own
        with Holder(1, 32, env=dict(env, NPUSIM_NODE="jobA/1", RANK="9")) as n1:
            assert [x.pid for x in card.survey(1, node=1)] == [n1.pid]
            assert [x.pid for x in card.survey(1)] == [r3.pid]
            assert card.nodes() == [0, 1]
            n1.release()
        r3.release()


@pytest.mark.timeout(120)
def test_sharing_off_gives_each_process_its_own_card(card_dir, monkeypatch):
    monkeypatch.setenv("NPUSIM_CARD_SHARE", "0")
    with Holder(0, 700):
        runtime.set_device(0)
        assert runtime.get_mem_info()[0] == GiB
        x = runtime.malloc(900 * MiB)
        runtime.free(x)
        assert runtime.memory.card_holders() == []


@pytest.mark.timeout(60)
def test_a_forked_child_does_not_keep_its_parents_slot(card_dir):
    runtime.set_device(0)
    x = runtime.malloc(64 * MiB)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: it holds nothing of the card
        try:
            os.close(r)
            ok = runtime.context.current_context().memory.card.fd is None
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert [h.pid for h in card.survey(0)] == [os.getpid()]
    runtime.free(x)


def test_a_ledger_directory_that_is_not_the_users_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv("NPUSIM_CARD_DIR", str(link))
    with pytest.raises(card.CardLedgerError, match="not a directory of uid"):
        card.Card(0, GiB)
    monkeypatch.setenv("NPUSIM_CARD_SHARE", "maybe")
    with pytest.raises(ValueError, match="NPUSIM_CARD_SHARE='maybe' is not 1 or 0"):
        card.Card(0, GiB)


@pytest.mark.timeout(60)
def test_the_ledger_is_a_small_file_outside_the_job_segment_pattern(card_dir):
    runtime.set_device(0)
    x = runtime.malloc(MiB)
    path = card.ledger_path(0)
    assert path == os.path.join(str(card_dir), "node0.npu0")
    assert os.path.getsize(path) <= card.HEADER + card.SLOT
    runtime.free(x)
    runtime.reset_device(0)
    assert card.survey(0) == []                      # the slot is cleared at reset
    out = subprocess.run([sys.executable, "-c", "from runtime import card; "
                          "print(card.ledger_dir())"], env={k: v for k, v in os.environ.items()
                                                            if k != "NPUSIM_CARD_DIR"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"/dev/shm/npusim.cards.{os.getuid()}", out.stderr
    assert not os.path.basename(out.stdout.strip()).startswith("npusim-")


@pytest.mark.timeout(120)
def test_the_last_holder_removes_the_ledger(card_dir):
    runtime.set_device(0)
    x = runtime.malloc(MiB)
    path = card.ledger_path(0)
    with Holder(0, 10):
        assert os.path.exists(path)
    assert os.path.exists(path)                      # this process still holds the card
    runtime.free(x)
    runtime.reset_device(0)
    assert not os.path.exists(path)
    # a holder's exit without a reset (the interpreter's exit) removes it too
    with Holder(0, 10) as h:
        assert os.path.exists(path)
        assert h.release() == 0
    assert not os.path.exists(path)


_CHURN = """
import os, sys
from runtime.memory import card
path = card.ledger_path(0)
for i in range(int(sys.argv[1])):
    c = card.Card(0, 1 << 30)
    c.charge(1 << 20)
    st, mine = os.stat(path), os.fstat(c.fd)
    # the ledger this process charges is the file everyone opens, never a removed one
    assert (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino) and mine.st_nlink == 1, i
    c.close()
print("ok")
"""


@pytest.mark.timeout(180)
def test_holders_that_come_and_go_at_once_never_charge_a_removed_ledger(card_dir):
    """Six processes open, charge and leave the card 60 times each, side by side: the last
    holder's removal races with every newcomer's open."""
    with reaped() as procs:
        for _ in range(6):
            procs.append(subprocess.Popen([sys.executable, "-c", _CHURN, "60"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = [p.communicate(timeout=150) for p in procs]
    assert [(p.returncode, o.strip()) for p, (o, _) in zip(procs, outs)] == [(0, "ok")] * 6, \
        [e[-1500:] for _, e in outs]
    assert not os.path.exists(card.ledger_path(0))
