"""npurun's watcher decides, sample by sample, where crowded ranks run
(launcher/agent/schedwatch.py): the decisions alone, with a probe that replays other programs'
CPU use (no rank is moved: tests/procs/test_sched_procs.py moves real ones)."""
import pytest

from launcher.agent.schedwatch import Policy, Watcher, free_cores


@pytest.mark.parametrize("ncores, ranks, load, now, want", [
    (2, 4, 1.0, None, 1),      # one busy loop on 2 cores: the 4 ranks share the other core
    (2, 4, 2.0, None, 1),      # both busy: still one core, never none
    (2, 4, 0.8, None, 1),
    (2, 4, 0.4, None, 2),      # 1.6 cores free: round to 2
    (2, 3, 1.0, None, 1),
    (2, 6, 1.0, None, 2),      # 6 ranks on one core lose (SQUEEZE_RANKS_PER_CORE): every core
    (2, 8, 1.0, None, 2),
    (8, 16, 2.0, None, 6),
    (8, 16, 7.5, None, 8),     # 16 ranks on one core: every core
    (2, 4, 0.4, 1, 1),         # 1.6 free, 1 in force: within the band, kept
    (2, 4, 0.6, 2, 2),         # 1.4 free, 2 in force: kept
    (2, 4, 0.8, 2, 1),         # 1.2 free: 0.8 from 2, beyond the band
    (2, 4, 0.2, 1, 2),
])
def test_free_cores(ncores, ranks, load, now, want):
    assert free_cores(ncores, ranks, load, now) == want


class Replay:
    """A probe replaying (load, idle shares) samples; the watcher reads ``idle_share``."""

    def __init__(self, samples):
        self.samples = list(samples)
        self.idle_share = {}

    def __call__(self, pids, born=()):
        if not self.samples:
            return None
        load, self.idle_share = self.samples.pop(0)
        return load


def _watcher(samples, *, ranks=4, mask=(0, 1), watch_bind=True, threshold=0.3):
    probe = Replay([(None, {})] + list(samples))      # the first call is the baseline
    pol = Policy(ranks, len(mask), watch_batch=True, watch_bind=watch_bind, threshold=threshold)
    return Watcher(pol, mask, probe=probe, interval=60)


def _states(w, n):
    out = []
    for _ in range(n):
        w._step()
        out.append((w.quiet, tuple(sorted(w.cores))))
    return out


def test_a_busy_loop_moves_the_ranks_to_the_free_core_and_after_it_when_it_moves():
    idle = {0: 0.9, 1: 0.9}
    w = _watcher([(0.0, idle)] * 3                    # quiet: SCHED_BATCH, a core per pair
                 + [(1.0, {0: 0.0, 1: 0.4})]          # a busy loop on core 0
                 + [(1.0, {0: 0.0, 1: 0.1})]          # it stays there: the ranks stay
                 + [(1.0, {0: 0.8, 1: 0.0})]          # it moved to core 1, core 0 sat idle
                 + [(0.0, idle)] * 3)                 # it ended
    assert _states(w, 9) == [
        (False, (0, 1)), (False, (0, 1)), (True, (0, 1)),
        (False, (1,)), (False, (1,)), (False, (0,)),
        (False, (0, 1)), (False, (0, 1)), (True, (0, 1))]
    assert w.switches == 5


def test_a_load_near_a_half_does_not_move_the_ranks_back_and_forth():
    w = _watcher([(1.0, {0: 0.0, 1: 0.3})] + [(0.45, {0: 0.3, 1: 0.2}), (0.7, {0: 0.1, 1: 0.2})]
                 * 3)
    states = _states(w, 7)
    assert states[0] == (False, (1,))
    assert set(states) == {(False, (1,))}             # 1.3-1.55 cores free: one core kept
    assert w.switches == 1


def test_without_the_binding_half_busy_ranks_keep_every_core():
    """NPUSIM_BIND=0 (or =1) fixes the cores: the watcher moves the class only."""
    w = _watcher([(1.0, {0: 0.0, 1: 0.4})] * 2, watch_bind=False)
    assert _states(w, 2) == [(False, (0, 1))] * 2
    assert w.switches == 0


def test_too_many_ranks_for_the_free_cores_keep_every_core():
    w = _watcher([(1.0, {0: 0.0, 1: 0.4})] * 2, ranks=6)
    assert _states(w, 2) == [(False, (0, 1))] * 2


def test_the_announcement_says_where_busy_ranks_run():
    pol = Policy(4, 2, watch_batch=True, watch_bind=True)
    assert "in the default class on the cores the other programs leave free" in pol.announce()
    pol = Policy(4, 2, watch_batch=True, watch_bind=False)
    assert "in the default class on their cores" in pol.announce()
