"""The fail-slow detector (launcher.diagnosis.failslow) on synthetic timelines, and the flight recorder's
timeline that feeds it. Pure: no process, no socket."""
from __future__ import annotations

import time

import numpy as np
import pytest

from hccl.flight import FlightRecorder
from hccl.types import DataType, Fingerprint, OpType, ReduceOp
from launcher.diagnosis import failslow
from launcher.diagnosis.failslow import INSIDE, LATE, Tracker, detect

FP = Fingerprint.make(OpType.ALLREDUCE, 256, DataType.FP32, ReduceOp.SUM)


def timelines(n=3, m=240, *, late=None, delay=0.025, slow=None, transfer=0.02, jitter=0.001,
              base=0.002, offsets=None, seed=0, late_until=None):
    """``n`` ranks running ``m`` collectives in a loop with compute ``0.01`` s; rank ``late``
    arrives ``delay`` s late; the messages of rank ``slow`` take ``transfer`` s more; each rank's
    clock is off by ``offsets[r]`` s (nodes without a common clock); from seq ``late_until`` on,
    nobody is late."""
    rng = np.random.default_rng(seed)
    offsets = offsets or [0.0] * n
    out = {r: {"seq": [], "start": [], "end": [], "wait_peer": [], "wait": []} for r in range(n)}
    t = np.zeros(n)
    for q in range(1, m + 1):
        arrive = t + 0.01 + rng.exponential(jitter, n)
        if late is not None and (late_until is None or q < late_until):
            arrive[late] += delay
        last = arrive.max()
        finish = last + base + (transfer if slow is not None else 0.0) + rng.exponential(2e-4, n)
        for r in range(n):
            o = out[r]
            o["seq"].append(q)
            o["start"].append(arrive[r] + offsets[r])
            o["end"].append(finish[r] + offsets[r])
            if slow is not None and r != slow:
                peer, wait = slow, finish[r] - max(arrive[r], last - 1e-4) - base / 2
            else:
                others = [p for p in range(n) if p != r]
                peer = max(others, key=lambda p: arrive[p])
                wait = max(0.0, last - arrive[r]) + base / 4
            o["wait_peer"].append(peer)
            o["wait"].append(wait)
        t = finish
    return out


def test_late_rank_is_named_with_its_lateness():
    f = detect(timelines(late=1, delay=0.025), comm="world", comm_id=5)
    assert f is not None and f.kind == LATE and f.ranks == [1]
    assert 0.022 <= f.lateness <= 0.028
    assert f.last_share > 0.95
    assert 0.5 < f.waited_share < 0.8        # 25 ms of each ~37 ms step
    assert (f.first_seq, f.last_seq, f.collectives) == (41, 240, failslow.WINDOW)
    assert f.line().startswith("slow rank(s): [1] in comm world: late to arrive")
    assert f.to_dict()["comm_id"] == 5


def test_clock_offsets_between_nodes_change_nothing():
    plain = detect(timelines(late=2, seed=3))
    shifted = detect(timelines(late=2, seed=3, offsets=[0.0, 3.7, -120.0]))
    assert plain is not None and shifted is not None
    assert shifted.ranks == plain.ranks == [2]
    assert shifted.lateness == pytest.approx(plain.lateness, abs=1e-6)


def test_healthy_ranks_name_nobody():
    for seed in range(20):
        assert detect(timelines(seed=seed, jitter=0.002)) is None


def test_small_lateness_is_below_the_bound():
    # last every time, but 2 ms: not worth a word
    assert detect(timelines(late=0, delay=0.002)) is None


def test_slow_link_names_the_rank_waited_for_inside():
    f = detect(timelines(slow=2, transfer=0.03))
    assert f is not None and f.kind == INSIDE and f.ranks == [2]
    assert f.lateness > 0.025
    assert f.last_share > 0.9


def test_job_ranks_of_a_sub_communicator():
    tl = timelines(late=1)
    f = detect({10 + r: {**tl[r], "wait_peer": [10 + p for p in tl[r]["wait_peer"]]}
                for r in tl})
    assert f.ranks == [11]
    tl = timelines(slow=0, transfer=0.03)
    f = detect({10 + r: {**tl[r], "wait_peer": [10 + p for p in tl[r]["wait_peer"]]}
                for r in tl})
    assert f.kind == INSIDE and f.ranks == [10]


def test_too_few_or_disjoint_collectives():
    assert detect(timelines(late=1, m=failslow.MIN_SEQS - 1)) is None
    tl = timelines(late=1)
    tl[0] = {k: v[:100] for k, v in tl[0].items()}
    tl[1] = {k: v[100:] for k, v in tl[1].items()}
    assert detect(tl) is None
    assert detect({0: timelines()[0]}) is None


def test_bad_input_is_named():
    tl = timelines()
    tl[1]["end"] = tl[1]["end"][:-1]
    with pytest.raises(ValueError, match="rank 1.*'end': 239"):
        detect(tl)
    with pytest.raises(ValueError, match="window=1"):
        detect(timelines(), window=1)
    with pytest.raises(ValueError, match="keep=10 must be at least window=200"):
        Tracker(keep=10)


def published(tl, members, name="world", cid=9):
    """The states npurun reads, from comm-rank timelines: job rank -> state."""
    return {members[r]: {"timeline": {str(cid): {"comm": name, "rank": r, "members": members,
                                                 **tl[r]}}} for r in tl}


def test_tracker_episodes_and_summary():
    tr = Tracker()
    tl = timelines(late=1, m=800, late_until=301)
    members = [4, 5, 6]

    def cut(lo, hi):
        return published({r: {k: v[lo:hi] for k, v in tl[r].items()} for r in tl}, members)

    tr.add(cut(0, 70))
    assert tr.check() == []                          # too few yet: 50 after the warm-up
    tr.add(cut(0, 150))
    assert tr.check() == [] and tr.summary() == []   # found once: not told yet
    tr.add(cut(140, 200))
    new = tr.check()
    assert [f.ranks for f in new] == [[5]] and new[0].comm_id == 9
    assert new[0].first_seq == failslow.WARMUP + 1
    tr.add(cut(190, 300))
    assert tr.check() == []                          # the same episode: no second notice
    assert tr.summary()[0].last_seq == 300
    for lo in range(300, 800, 100):                  # the rank recovers: the episode ends
        tr.add(cut(lo, lo + 100))
        assert tr.check() == []
    assert 9 not in tr.active
    assert len(tr.history[9][4]) == 800 - failslow.WARMUP
    assert [f.ranks for f in tr.summary()] == [[5]] and tr.episodes == {(9, LATE, (5,)): 1}


def test_a_finding_of_one_poll_is_not_told():
    tr = Tracker()
    tl = timelines(late=0, m=300, late_until=200)
    members = [0, 1, 2]
    tr.add(published({r: {k: v[:200] for k, v in tl[r].items()} for r in tl}, members))
    assert tr.check() == []
    tr.add(published(timelines(m=600, seed=4), members))      # the window is healthy now
    assert tr.check() == [] and tr.summary() == [] and tr.active == {}


def test_tracker_keeps_a_bounded_history():
    tr = Tracker(window=50, keep=60)
    tr.add(published(timelines(m=200), [0, 1, 2]))
    assert all(sorted(h) == list(range(141, 201)) for h in tr.history[9].values())


def test_flight_timeline_has_waits_per_peer():
    class Comm:
        name, comm_id, rank, ranks = "world", 3, 0, [0, 1, 2]

    rec = FlightRecorder(100)
    for seq in range(1, 4):
        r = rec.enqueue(Comm, seq, FP, stream="s", site="x")
        rec.start(r)
        rec.waiting(r, 1)
        time.sleep(0.001)
        rec.waiting(r, 2)
        time.sleep(0.02 if seq == 2 else 0.0)
        rec.complete(r)
    p2p = rec.enqueue(Comm, 1, FP, stream="s", site="x", peer=1)     # not a collective
    rec.start(p2p)
    rec.complete(p2p)
    rec.start(rec.enqueue(Comm, 4, FP, stream="s", site="x"))         # still running
    t = rec.timeline(50)[3]
    assert (t["comm"], t["rank"], t["members"], t["seq"]) == ("world", 0, [0, 1, 2], [1, 2, 3])
    assert t["wait_peer"][1] == 2 and t["wait"][1] >= 0.02
    assert all(e >= s for s, e in zip(t["start"], t["end"]))
    assert rec.timeline(2) == {}                      # the last 2 records are not completed ones


# -- a slow link at worlds 3-5 -----------------------------------------------------------------

def exchanges(n, m=240, *, pattern="direct", link=None, transfer=0.03, jitter=0.001,
              base=0.002, own_send=False, late=None, seed=0):
    """``n`` ranks of a loop of ``m`` collectives as the flight recorder times them, with the
    waits' ends and the receivers of send waits: ``direct`` (every rank sends to every other and
    waits for all: the mesh, one-shot) or ``star`` (the leaves send to rank 0, which answers each
    once it has them all). Messages over ``link`` = (src, dst) take ``transfer`` s more. With
    ``own_send`` the sender of the slow link waits for that send's delivery (a full queue), so
    it names itself with the receiver in ``wait_to``. Rank ``late`` arrives 25 ms late."""
    rng = np.random.default_rng(seed)
    keys = ("seq", "start", "end", "wait_peer", "wait", "wait_end", "wait_to")
    out = {r: {k: [] for k in keys} for r in range(n)}
    t = np.zeros(n)

    def hop(src, dst, at):
        slow = link is not None and (src, dst) == tuple(link)
        return at + base + rng.exponential(2e-4) + (transfer if slow else 0.0)

    for q in range(1, m + 1):
        arrive = t + 0.01 + rng.exponential(jitter, n)
        if late is not None:
            arrive[late] += 0.025
        end = np.zeros(n)
        waits = {}               # rank -> (peer, wait, end, to): its longest wait
        if pattern == "direct":
            for r in range(n):
                got = {p: hop(p, r, arrive[p]) for p in range(n) if p != r}
                p = max(got, key=got.get)
                end[r] = max(arrive[r], got[p]) + 1e-4
                waits[r] = (p, max(0.0, got[p] - arrive[r]), got[p], -1)
        else:
            got = {p: hop(p, 0, arrive[p]) for p in range(1, n)}
            p = max(got, key=got.get)
            ready = max(arrive[0], got[p])
            waits[0] = (p, ready - arrive[0], ready, -1)
            end[0] = ready + 1e-4
            for leaf in range(1, n):
                answer = hop(0, leaf, ready)
                waits[leaf] = (0, answer - arrive[leaf], answer, -1)
                end[leaf] = answer + 1e-4
        if own_send and link is not None:
            src, dst = link
            sent = hop(src, dst, arrive[src])
            if sent - arrive[src] > waits[src][1]:
                waits[src] = (src, sent - arrive[src], sent, dst)
            end[src] = max(end[src], sent)
        for r in range(n):
            peer, wait, wend, to = waits[r]
            for k, v in zip(keys, (q, arrive[r], end[r], peer, wait, wend, to)):
                out[r][k].append(v)
        t = end
    return out


@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("pattern", ["direct", "star"])
def test_healthy_exchanges_name_nobody(n, pattern):
    for seed in range(5):
        assert detect(exchanges(n, pattern=pattern, seed=seed, jitter=0.002)) is None


@pytest.mark.parametrize("n", [3, 4, 5])
def test_slow_link_of_a_direct_exchange_names_its_sender_and_the_link(n):
    src, dst = 1, n - 1
    f = detect(exchanges(n, link=(src, dst), transfer=0.03), comm="world")
    assert f is not None and f.kind == INSIDE and f.ranks == [src], f
    # the receiver ends each collective late and so arrives late at the next one, which the
    # link's next message overlaps: about half of the 30 ms is a wait inside (the rest, the
    # others' wait for the late receiver's start, is not the link's)
    assert 0.012 <= f.lateness <= 0.034, f
    assert [(x["src"], x["dst"]) for x in f.links] == [(src, dst)], f.links
    assert f.links[0]["lateness"] == f.lateness and f.links[0]["share"] > 0.9
    assert f.line().endswith(f"slow link(s): {src}->{dst} (median "
                             f"{f.links[0]['lateness'] * 1e3:.1f} ms, "
                             f"{f.links[0]['share']:.0%} of the waits)")


@pytest.mark.parametrize("n", [3, 4, 5])
def test_slow_leaf_of_a_star_is_named_not_cancelled_by_its_wait_for_the_answer(n):
    # The slow leaf waits for the hub's answer about as long as the hub waits for its data:
    # the wait that ended first (the hub's) is the cause, the leaf's passes on.
    leaf = n - 1
    f = detect(exchanges(n, pattern="star", link=(leaf, 0), transfer=0.03))
    assert f is not None and f.kind == INSIDE and f.ranks == [leaf], f
    assert 0.027 <= f.lateness <= 0.034, f
    assert [(x["src"], x["dst"]) for x in f.links] == [(leaf, 0)], f.links


@pytest.mark.parametrize("n", [3, 4, 5])
def test_one_slow_link_of_the_hub_is_told_from_its_other_links(n):
    f = detect(exchanges(n, pattern="star", link=(0, 2), transfer=0.03))
    assert f is not None and f.kind == INSIDE and f.ranks == [0], f
    assert [(x["src"], x["dst"]) for x in f.links] == [(0, 2)], f.links


@pytest.mark.parametrize("n", [3, 5])
def test_a_wait_on_the_delivery_of_its_own_send_names_the_receiver(n):
    f = detect(exchanges(n, link=(2, 0), transfer=0.03, own_send=True))
    assert f is not None and f.kind == INSIDE and f.ranks == [2], f
    assert f.links[0]["src"] == 2 and f.links[0]["dst"] == 0, f.links


@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("pattern", ["direct", "star"])
def test_a_late_rank_at_worlds_3_to_5_is_late_not_a_slow_link(n, pattern):
    f = detect(exchanges(n, pattern=pattern, late=n - 2))
    assert f is not None and f.kind == LATE and f.ranks == [n - 2] and f.links == [], f
    assert 0.022 <= f.lateness <= 0.028, f


def test_tracker_passes_wait_ends_and_receivers_in_job_ranks():
    tl = exchanges(4, link=(3, 0), own_send=True)
    members = [10, 11, 12, 13]
    for r in tl:                          # the flight recorder speaks comm ranks
        assert set(tl[r]) >= {"wait_end", "wait_to"}
    tr = Tracker()
    state = published(tl, members)
    tr.add(state)
    tr.check()
    (f,) = tr.check()
    assert f.ranks == [13] and f.links[0]["src"] == 13 and f.links[0]["dst"] == 10, f
    assert tr.history[9][13][200][5] == 10           # the receiver of rank 13's send wait


def test_flight_timeline_has_wait_ends_and_send_receivers():
    class Comm:
        name, comm_id, rank, ranks = "world", 3, 0, [0, 1, 2]

    rec = FlightRecorder(10)
    r = rec.enqueue(Comm, 1, FP, stream="s", site="x")
    rec.start(r)
    rec.waiting(r, 2, sending=True)
    time.sleep(0.01)
    t_end = time.time()
    rec.waiting(r, 1)
    rec.complete(r)
    t = rec.timeline(10)[3]
    assert t["wait_peer"] == [0] and t["wait_to"] == [2]       # its own send, to rank 2
    assert t_end - 0.005 <= t["wait_end"][0] <= t["end"][0]
    r = rec.enqueue(Comm, 2, FP, stream="s", site="x")
    rec.start(r)
    rec.complete(r)                                            # no wait at all
    t = rec.timeline(10)[3]
    assert (t["wait_peer"][1], t["wait_to"][1], t["wait_end"][1]) == (-1, -1, 0.0)
