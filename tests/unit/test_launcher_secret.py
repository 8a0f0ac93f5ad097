"""The job secret: who may run without NPUSIM_JOB_SECRET, and the loopback secret file."""
from __future__ import annotations

import os
import stat

import pytest

from launcher import secret
from launcher.errors import ConfigError


@pytest.mark.timeout(10)
def test_single_node_always_gets_a_fresh_secret(monkeypatch):
    monkeypatch.delenv("NPUSIM_JOB_SECRET", raising=False)
    a, b = secret.for_job(1, 0, "127.0.0.1"), secret.for_job(1, 0, "127.0.0.1")
    assert a != b and len(bytes.fromhex(a)) == 32


@pytest.mark.timeout(10)
def test_multi_node_uses_the_shared_token_or_refuses(monkeypatch):
    token = "ab" * 16
    monkeypatch.setenv("NPUSIM_JOB_SECRET", token.upper())
    assert secret.for_job(4, 3, "10.1.2.3") == token
    monkeypatch.setenv("NPUSIM_JOB_SECRET", "not-hex")
    with pytest.raises(ConfigError, match="hexadecimal"):
        secret.for_job(2, 1, "10.1.2.3")
    monkeypatch.setenv("NPUSIM_JOB_SECRET", "abcd")
    with pytest.raises(ConfigError, match="at least 128"):
        secret.for_job(2, 1, "10.1.2.3")
    monkeypatch.delenv("NPUSIM_JOB_SECRET")
    with pytest.raises(ConfigError, match="NPUSIM_JOB_SECRET"):
        secret.for_job(2, 0, "10.1.2.3")
    # all on loopback: node 0 makes one, the others read node 0's file
    assert len(secret.for_job(2, 0, "127.0.0.1")) == 64
    assert secret.for_job(2, 1, "localhost") is None


@pytest.mark.timeout(10)
def test_loopback_secret_file_is_private(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    value = secret.generate()
    path = secret.publish(4242, value)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert secret.read_published(4242) == value
    assert secret.read_published(4243) is None
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="0600"):
        secret.read_published(4242)
    os.chmod(path, 0o600)
    secret.unpublish(4242, "00" * 32)  # not ours: kept
    assert os.path.exists(path)
    secret.unpublish(4242, value)
    assert not os.path.exists(path)


@pytest.mark.timeout(10)
def test_a_shared_runtime_dir_is_refused(tmp_path, monkeypatch):
    run = tmp_path / "open"
    run.mkdir()
    os.chmod(run, 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    with pytest.raises(ConfigError, match="0700"):
        secret.publish(1, secret.generate())
