"""A torch DDP peer SIGKILLed mid-backward under ``npurun --max-restarts 1`` (issue 40).

Every surviving rank ends with npusim's error naming the dead rank (never a SIGSEGV), the
verdict names the killed rank alone with a position that does not contradict the survivors',
every file the console points to exists, the attempts line is whole, and the restart
completes. One run here; ``python -m tests.faults.peerkill_torch --runs 20`` (and the slow
test) repeat it.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")

from tests.faults import peerkill_torch as harness  # noqa: E402

SLOW_RUNS = 20


def _assert_holds(o) -> None:
    assert all(o.ok[c] for c in harness.CHECKS), o.line() + "\n" + o.output[-5000:]


@pytest.mark.timeout(300)
def test_a_peer_killed_mid_backward_is_the_only_culprit_and_the_job_restarts(tmp_path):
    _assert_holds(harness.run_once(str(tmp_path)))


@pytest.mark.slow
@pytest.mark.timeout(20 * 300)
def test_twenty_peer_kills_never_segfault(tmp_path):
    failed = []
    for i in range(SLOW_RUNS):
        o = harness.run_once(str(tmp_path / f"run{i}"))
        if not all(o.ok[c] for c in harness.CHECKS):
            failed.append(f"run {i}: {o.line()}")
    assert not failed, "\n".join(failed)
