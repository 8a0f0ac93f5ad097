"""The agent's diagnosis hooks (what the hang detector builds on), and the janitor that cleans up
after a launcher that died."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import uuid

import pytest

from launcher.agent import Agent, StopRequest, WorkerSpec
from launcher.procs.env import worker_command
from launcher.procs.janitor import Janitor
from launcher.rendezvous import LocalRendezvous
from tests.leakcheck import LeakCheck, pid_gone, wait_for


@pytest.mark.timeout(60)
def test_tick_hook_takes_every_ranks_stacks_and_stops_the_job(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent(f"""
        import os, threading, time
        def waiting_in_user_code():
            open(os.path.join({str(tmp_path)!r}, "ready." + os.environ["RANK"]), "w").close()
            threading.Event().wait(120)
        waiting_in_user_code()
        """))
    taken, reasons = {}, []

    def on_tick(agent):
        if all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            taken.update(agent.collect_stacks(timeout=5))
            return StopRequest("diagnosed a hang", exitcode=3)
        return None

    with LeakCheck() as lc:
        spec = WorkerSpec(cmd=worker_command(str(script), []), nproc_per_node=2,
                          stop_grace=2, base_env=lc.env)
        agent = Agent(spec, LocalRendezvous(master_port=0, nproc_per_node=2, run_id="hooks",
                                            max_restarts=0))
        agent.on_tick.append(on_tick)
        agent.before_stop.append(lambda a, why: reasons.append((why, len(a.live_workers()))))
        result = agent.run()
    assert result.exitcode == 3 and result.message == "diagnosed a hang"
    assert reasons == [("diagnosed a hang", 2)]  # called while both ranks were still alive
    assert sorted(taken) == [0, 1]
    for rank in (0, 1):
        assert "waiting_in_user_code" in taken[rank], taken[rank]
        assert "most recent call first" in taken[rank]



@pytest.mark.timeout(60)
def test_before_stop_runs_when_every_rank_exited_before_the_failure_was_seen(tmp_path):
    """On a busy machine every rank of a failed collective can exit before npurun's loop sees
    the first failure; the diagnosis hooks must still run (they read states and error files)."""
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        d = {str(tmp_path)!r}
        if os.environ["RANK"] == "1":
            open(os.path.join(d, "pid.1.tmp"), "w").write(str(os.getpid()))
            os.rename(os.path.join(d, "pid.1.tmp"), os.path.join(d, "pid.1"))
            sys.exit(0)
        while not os.path.exists(os.path.join(d, "pid.1")):
            time.sleep(0.01)
        pid = int(open(os.path.join(d, "pid.1")).read())
        def gone():              # exited (a zombie until npurun reaps it) or reaped
            try:
                return open(f"/proc/{{pid}}/stat").read().split(")")[-1].split()[0] in "ZX"
            except OSError:
                return True
        while not gone():
            time.sleep(0.01)
        sys.exit(5)              # the failure, when no other rank is alive any more
        """))
    reasons = []
    with LeakCheck() as lc:
        spec = WorkerSpec(cmd=worker_command(str(script), []), nproc_per_node=2,
                          stop_grace=2, base_env=lc.env)
        agent = Agent(spec, LocalRendezvous(master_port=0, nproc_per_node=2, run_id="allgone",
                                            max_restarts=0))
        agent.before_stop.append(lambda a, why: reasons.append((why, len(a.live_workers()))))
        result = agent.run()
    assert result.exitcode == 5
    assert reasons == [("rank 0 failed", 0)]     # called although no rank was alive

@pytest.mark.timeout(30)
def test_janitor_cleans_up_when_the_launcher_vanishes(tmp_path):
    job = "janitortest" + uuid.uuid4().hex[:8]      # unique: suites may run side by side
    seg = f"/dev/shm/npusim-{job}-seg"
    open(seg, "w").close()
    tmpdir = tmp_path / "scratch"
    (tmpdir / "sub").mkdir(parents=True)
    group = subprocess.Popen(["sh", "-c", "sleep 120 & sleep 120 & wait"],
                             start_new_session=True)
    janitor = Janitor()
    janitor.watch_group(group.pid)
    janitor.watch_job(job)
    janitor.watch_dir(str(tmpdir))
    janitor.watch_job("bad job; rm -rf /")  # not a job id: ignored
    # the launcher "dies": its end of the pipe closes without "bye"
    janitor._proc.stdin.close()
    janitor._proc.wait(timeout=10)
    assert group.wait(timeout=10) == -signal.SIGKILL
    assert not os.path.exists(seg)
    assert not tmpdir.exists()


@pytest.mark.timeout(30)
def test_janitor_does_nothing_after_bye(tmp_path):
    group = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        janitor = Janitor()
        janitor.watch_group(group.pid)
        janitor.watch_dir(str(tmp_path))
        janitor.close()
        assert group.poll() is None and tmp_path.exists()
    finally:
        group.kill()
        group.wait()
    wait_for(lambda: pid_gone(group.pid), 5)
