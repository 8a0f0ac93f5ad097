"""Task-graph replays of a step of kernels and small AllReduces over processes at worlds 2-4
(shared memory; fused and not; some replays nobody waits for, which the stream's patrol runs:
runtime.Stream.enqueue_lazy) give the eager step's bytes."""
import pytest

import launcher

import graph_replay_cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_replayed_steps_are_bitwise_the_eager_ones(world):
    results = launcher.spawn(graph_replay_cases.replay_step, world, timeout=200)
    assert results == [{"plain": True, "fused": True}] * world
