"""benchmarks.ringfloor: two processes swap bytes through the rings and report a median each."""
import math
import os

import pytest

from hccl.transport import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="the rings run on x86-64 Linux only")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin_us", [0.0, 200.0])
def test_ringfloor_swaps_and_leaves_nothing(spin_us):
    from benchmarks import ringfloor
    medians = ringfloor.measure(1024, 300, spin_us)
    assert len(medians) == 2 and all(0 < m < 1e6 and math.isfinite(m) for m in medians)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("npusim-ringfloor-")]
