"""The seeds' environment names with a meaning here: ASCEND_MEM_CHECK turns on the stream
sanitizer as NPUSIM_STREAM_CHECK does (which wins when both are set); the card knobs."""
import os
import subprocess
import sys

import pytest

from runtime import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("env,mode", [
    ({}, "off"),
    ({"ASCEND_MEM_CHECK": "1"}, "raise"),
    ({"ASCEND_MEM_CHECK": "warn"}, "warn"),
    ({"ASCEND_MEM_CHECK": "1", "NPUSIM_STREAM_CHECK": "0"}, "off"),
    ({"ASCEND_MEM_CHECK": "0", "NPUSIM_STREAM_CHECK": "warn"}, "warn"),
])
def test_ascend_mem_check_is_the_stream_sanitizer(monkeypatch, env, mode):
    for name in ("ASCEND_MEM_CHECK", "NPUSIM_STREAM_CHECK"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert config.stream_check() == mode


def test_ascend_mem_check_refuses_a_bad_value_by_name(monkeypatch):
    monkeypatch.delenv("NPUSIM_STREAM_CHECK", raising=False)
    monkeypatch.setenv("ASCEND_MEM_CHECK", "2")
    with pytest.raises(config.EnvError, match=r"ASCEND_MEM_CHECK='2' is not one of 0, off"):
        config.stream_check()


@pytest.mark.timeout(60)
def test_a_process_started_with_ascend_mem_check_1_checks_its_streams():
    env = {k: v for k, v in os.environ.items() if k != "NPUSIM_STREAM_CHECK"}
    env.update(ASCEND_MEM_CHECK="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", "import runtime; "
                          "print(runtime.stream_check_enabled())"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_the_card_knobs_are_in_the_table(monkeypatch):
    monkeypatch.setenv("NPUSIM_CARD_SHARE", "off")
    assert config.card_share() is False
    monkeypatch.setenv("NPUSIM_CARD_DIR", "/tmp/x")
    assert config.card_dir() == "/tmp/x"
    assert {"NPUSIM_CARD_DIR", "NPUSIM_CARD_SHARE", "ASCEND_MEM_CHECK"} <= set(config.TABLE.vars)
