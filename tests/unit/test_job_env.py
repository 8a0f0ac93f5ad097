"""The job environment, read in one place into one typed record; one log-level parser."""
import ast
import logging
import pathlib

import pytest

from hccl import config as hconfig, diag
from hccl.errors import InvalidArgumentError
from launcher import config as lconfig
from launcher.errors import ConfigError
from runtime import config as rconfig
from runtime.config import Job

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHED = {"NPUSIM_JOB_ID": "a1b2c3d4e5f6", "TORCHELASTIC_RESTART_COUNT": "2", "RANK": "3",
            "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500"}


@pytest.fixture
def env(monkeypatch):
    for k in rconfig.JOB_VARS + ("ASCEND_GLOBAL_LOG_LEVEL",):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_a_launched_process_gets_every_field_typed():
    j = Job.from_env(LAUNCHED)
    assert j == Job("a1b2c3d4e5f6", 2, 3, 1, 4, "10.0.0.1", 29500)
    assert j.launched and j.key_prefix == "npusim/a1b2c3d4e5f6/2"


def test_an_unlaunched_process_has_one_default():
    j = Job.from_env({})
    assert j == Job("local", 0, None, None, None, None, None) and not j.launched
    # a job id unsafe in a segment name or a store key is replaced by the same default
    assert Job.from_env({"NPUSIM_JOB_ID": "../x y"}).job_id == "local"
    assert Job.from_env({"NPUSIM_JOB_ID": "  "}).key_prefix == "npusim/local/0"


@pytest.mark.parametrize("name,value", [("RANK", "x"), ("WORLD_SIZE", "-1"), ("MASTER_PORT", "1.5"),
                                        ("TORCHELASTIC_RESTART_COUNT", "one")])
def test_a_bad_integer_is_named(env, name, value):
    with pytest.raises(ValueError, match=f"{name}={value!r}"):
        Job.from_env({name: value})
    env.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match=name):
        hconfig.job()


def test_job_is_parsed_once_while_the_environment_is_unchanged(env):
    for k, v in LAUNCHED.items():
        env.setenv(k, v)
    a = rconfig.job()
    assert rconfig.job() is a and hconfig.job() is a and a.rank == 3
    env.setenv("RANK", "0")
    assert rconfig.job().rank == 0 and rconfig.rank() == 0


def test_diag_keys_come_from_the_record(env):
    env.setenv("NPUSIM_JOB_ID", "j1")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert diag.abort_key() == "npusim/j1/1/abort"
    assert diag.state_key(2, env={"NPUSIM_JOB_ID": "j2"}) == "npusim/j2/0/state/2"
    env.delenv("NPUSIM_JOB_ID")
    env.delenv("TORCHELASTIC_RESTART_COUNT")
    assert diag.abort_key() == diag.abort_key({}) == "npusim/local/0/abort"


@pytest.mark.parametrize("raw,level", [("", 3), ("0", 0), ("2", 2), ("4", 4), (" 1 ", 1)])
def test_one_log_level_rule_for_every_package(env, raw, level):
    env.setenv("ASCEND_GLOBAL_LOG_LEVEL", raw)
    assert rconfig.log_level() == hconfig.log_level() == lconfig.log_level() == level
    if level == 4:
        assert hconfig.logging_level() > logging.CRITICAL


@pytest.mark.parametrize("raw", ["5", "-1", "debug", "3.0"])
def test_a_bad_log_level_is_refused_the_same_way_by_every_package(env, raw):
    env.setenv("ASCEND_GLOBAL_LOG_LEVEL", raw)
    with pytest.raises(ValueError, match=f"ASCEND_GLOBAL_LOG_LEVEL={raw!r}") as r:
        rconfig.log_level()
    with pytest.raises(InvalidArgumentError, match="ASCEND_GLOBAL_LOG_LEVEL") as h:
        hconfig.log_level()
    with pytest.raises(ConfigError, match="ASCEND_GLOBAL_LOG_LEVEL") as lau:
        lconfig.log_level()
    assert str(r.value) == str(h.value) == str(lau.value)


def _env_names_read(path):
    """Job and log-level variable names a module mentions as a string constant."""
    names = set(rconfig.JOB_VARS) - {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                     "MASTER_PORT"} | {"ASCEND_GLOBAL_LOG_LEVEL"}
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}


def test_no_library_module_but_the_config_modules_names_the_job_id_or_the_log_level():
    offenders = {}
    for pkg in ("runtime", "hccl"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() in ("runtime/config.py", "hccl/config.py"):
                continue
            found = _env_names_read(path)
            if found:
                offenders[path.relative_to(ROOT).as_posix()] = sorted(found)
    assert offenders == {}
