"""npurun end to end, successful runs: every rank's environment, console prefixes, -m,
--no-python, and the --log-dir layout with --redirects / --tee."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.leakcheck import LeakCheck, run_npurun

ENV_SCRIPT = """
import json, os, sys
r = os.environ["RANK"]
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().decode()
info = dict(os.environ)
info["__name__"] = __name__
info["argv"] = sys.argv
info["cmdline"] = cmdline
with open(os.path.join({out!r}, f"env.{{r}}.json"), "w") as f:
    json.dump(info, f)
print(f"hello from {{r}}")
print(f"oops from {{r}}", file=sys.stderr)
"""


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def load_envs(tmp_path, n: int) -> list[dict]:
    return [json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(n)]


@pytest.mark.timeout(60)
def test_every_rank_gets_its_environment_and_prefixed_console(tmp_path):
    script = write(tmp_path, "env_dump.py", ENV_SCRIPT.format(out=str(tmp_path)))
    with LeakCheck() as lc:
        res = run_npurun("--nproc-per-node", "3", script, "a1", "--flag", env=lc.env,
                         cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    envs = load_envs(tmp_path, 3)
    job_ids = {e["NPUSIM_JOB_ID"] for e in envs}
    secrets_ = {e["NPUSIM_JOB_SECRET"] for e in envs}
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(job_ids) == len(secrets_) == len(ports) == 1
    secret = secrets_.pop()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert 0 < int(ports.pop()) < 65536
    for r, e in enumerate(envs):
        assert e["RANK"] == e["RANK_ID"] == e["ROLE_RANK"] == str(r)
        assert e["LOCAL_RANK"] == e["DEVICE_ID"] == e["ASCEND_DEVICE_ID"] == str(r)
        assert e["WORLD_SIZE"] == e["RANK_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0" and e["NPUSIM_NODE_COUNT"] == "1"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == e["NPUSIM_JOB_ID"]
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{r}/error.json")
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["__name__"] == "__main__"
        assert e["argv"] == [script, "a1", "--flag"]
        assert secret not in e["cmdline"]  # the secret travels in the environment only
        # the rank's command line reads as torchrun's ranks' (launcher.procs.proctitle.show_command)
        assert e["cmdline"].rstrip("\0").split("\0")[1:] == ["-u", script, "a1", "--flag"]
    for r in range(3):
        assert f"[rank {r}]: hello from {r}\n" in res.stdout
        assert f"[rank {r}]: oops from {r}\n" in res.stderr
        assert f"oops from {r}" not in res.stdout


@pytest.mark.timeout(60)
def test_module_mode_and_no_python(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "entry.py", """
        import os, sys
        print("module", __name__, os.environ["LOCAL_RANK"], sys.argv[1:], flush=True)
        """)
    prog = write(tmp_path, "prog.sh", """\
        #!/bin/sh
        echo "shell rank $RANK of $WORLD_SIZE arg $1"
        """)
    os.chmod(prog, 0o755)
    with LeakCheck() as lc:
        res = run_npurun("--nproc_per_node=2", "-m", "mypkg.entry", "x", env=lc.env,
                         cwd=str(tmp_path))
        res2 = run_npurun("--nproc-per-node", "2", "--no-python", prog, "y", env=lc.env,
                          cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "[rank 0]: module __main__ 0 ['x']" in res.stdout
    assert "[rank 1]: module __main__ 1 ['x']" in res.stdout
    assert res2.returncode == 0, res2.stderr
    assert "[rank 1]: shell rank 1 of 2 arg y" in res2.stdout


@pytest.mark.timeout(60)
def test_log_dir_layout_redirects_and_tee(tmp_path):
    script = write(tmp_path, "talk.py", """
        import os, sys
        r = os.environ["LOCAL_RANK"]
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
        """)
    logs = tmp_path / "logs"
    with LeakCheck() as lc:
        # rank 0: stdout to file only, stderr tee'd; rank 1: stdout to file only
        res = run_npurun("--nproc-per-node", "2", "--log-dir", str(logs), "--run-id", "exp1",
                         "--redirects", "1", "--tee", "0:2", script, env=lc.env)
    assert res.returncode == 0, res.stderr
    base = logs / "exp1" / "attempt_0"
    assert sorted(os.listdir(base)) == ["0", "1"]
    for r in (0, 1):
        assert (base / str(r) / "stdout.log").read_text() == f"out {r}\n"
        assert f"out {r}" not in res.stdout  # redirected: not on the console
    assert (base / "0" / "stderr.log").read_text() == "err 0\n"
    assert "[rank 0]: err 0" in res.stderr   # tee: file and console
    assert not (base / "1" / "stderr.log").exists()
    assert "[rank 1]: err 1" in res.stderr
    assert not (base / "0" / "error.json").exists()
