"""LeakCheck, the leak check of every multi-process test: it counts (and removes) only the
segments of the test's own jobs, so suites running side by side do not fail (or break) each other."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from launcher.procs.shm import SHM_DIR
from tests.leakcheck import LeakCheck, wait_for

CHILD = """
import os, sys
path = os.path.join({shm!r}, "npusim-" + os.environ["NPUSIM_JOB_ID"] + "-hccl-r0-x")
open(path, "w").close()
print("ready", flush=True)
sys.stdin.read()          # until the test closes our stdin
"""


@pytest.mark.timeout(60)
def test_only_the_tests_own_jobs_segments_count_and_are_removed():
    mine, foreign = "lcmine" + uuid.uuid4().hex[:8], "lcforeign" + uuid.uuid4().hex[:8]
    foreign_seg = os.path.join(SHM_DIR, f"npusim-{foreign}-hccl-r0-x")
    mine_seg = os.path.join(SHM_DIR, f"npusim-{mine}-hccl-r0-x")
    try:
        with pytest.raises(AssertionError) as info:
            with LeakCheck(grace=0.5) as lc:
                env = dict(lc.env, NPUSIM_JOB_ID=mine)
                child = subprocess.Popen([sys.executable, "-c", CHILD.format(shm=SHM_DIR)],
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
                assert child.stdout.readline().strip() == "ready"
                open(foreign_seg, "w").close()          # another job's, created meanwhile
                wait_for(lambda: mine in lc.jobs, 30, what="the sampler to see the child")
                child.communicate("", timeout=30)       # the child exits; its segment stays
        text = str(info.value)
        assert f"npusim-{mine}-hccl-r0-x" in text and foreign not in text
        assert not os.path.exists(mine_seg)             # the test's own leak is removed
        assert os.path.exists(foreign_seg)              # another job's is left alone
    finally:
        for path in (foreign_seg, mine_seg):
            if os.path.exists(path):
                os.unlink(path)
