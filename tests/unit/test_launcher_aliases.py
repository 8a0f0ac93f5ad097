"""launcher's rooms (issue 55): every old module path is an alias of the moved module itself,
the documented ``python -m`` commands of moved modules still run, and the names users import from
``launcher.agent`` and ``launcher.verdict`` are still there."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code_or_args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *code_or_args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("old", sorted(launcher._MOVED))
def test_an_old_path_is_the_moved_module_itself(old):
    module = importlib.import_module(f"launcher.{old}")
    assert module is sys.modules[f"launcher.{launcher._MOVED[old]}"]
    assert module.__name__ == module.__spec__.name == f"launcher.{launcher._MOVED[old]}"


def test_the_old_paths_point_into_the_rooms():
    rooms = {new.split(".")[0] for new in launcher._MOVED.values()}
    assert rooms == {"procs", "agent", "diagnosis", "profile"}
    for old, new in launcher._MOVED.items():
        assert not os.path.exists(os.path.join(ROOT, "launcher", f"{old}.py")), old
        assert os.path.exists(os.path.join(ROOT, "launcher", *new.split(".")) + ".py"), new


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["launcher.profsummary", "launcher.tracemerge"])
def test_the_documented_python_m_commands_still_run(command):
    res = _run(["-m", command, "--help"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: python -m {command} "), res.stdout


def test_the_names_users_import_are_where_they_were():
    from launcher.agent import Agent, RunResult, StopRequest, WorkerSpec, say
    from launcher.verdict import RankInfo, classify, cycle_key, find_cycle, wait_edges
    assert Agent.__module__ == "launcher.agent.supervisor"
    assert {c.__module__ for c in (RunResult, StopRequest, WorkerSpec)} == {"launcher.agent.api"}
    assert say.__module__ == "launcher.agent.api"
    assert RankInfo.__module__ == "launcher.diagnosis.rankinfo"
    assert find_cycle.__module__ == wait_edges.__module__ == cycle_key.__module__ == \
        "launcher.diagnosis.waitfor"
    assert classify.__module__ == "launcher.diagnosis.verdict"
    assert launcher.spawn.__module__ == "launcher.spawning"


@pytest.mark.timeout(120)
def test_the_aliases_do_not_run_runtimes_package():
    """A rank imports launcher before its own code: its alias table must not set up runtime."""
    res = _run(["-c", "import sys, launcher, launcher.forkserver as f\n"
                "print(f.__name__, 'runtime' in sys.modules, 'runtime.aliases' in sys.modules)"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["launcher.procs.forkserver", "False", "True"]
