"""One typed table of environment variables per package: every knob read through it, parsed by
one rule per type, refused with one text everywhere, and docs/environment.md generated from it."""
from __future__ import annotations

import ast
import os

import pytest

from benchmarks import envdoc
from hccl import config as hconfig
from hccl.errors import InvalidArgumentError
from launcher import config as lconfig
from launcher.errors import ConfigError
from runtime import config as rconfig
from runtime.config import RULES, EnvError, Var

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_MODULES = {"runtime/config.py", "hccl/config.py", "launcher/config.py"}
TABLES = (rconfig.TABLE, hconfig.TABLE, lconfig.TABLE)


def environ_reads(source: str) -> list[int]:
    """Lines that read the process environment: any use of ``os.environ`` / ``os.environb`` but
    a store into it or a ``del``, and ``os.getenv`` / ``os.getenvb``, also when imported by name
    (``from os import environ``). A mapping handed to a child (``env["X"] = ...``) is not read."""
    tree = ast.parse(source)
    names = {"environ", "environb", "getenv", "getenvb"}
    aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and n.module == "os" for a in n.names if a.name in names}
    stores = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
              and isinstance(n.ctx, (ast.Store, ast.Del))}
    lines = []
    for n in ast.walk(tree):
        hit = (isinstance(n, ast.Attribute) and n.attr in names and isinstance(n.value, ast.Name)
               and n.value.id == "os") or (isinstance(n, ast.Name) and n.id in aliases)
        if hit and id(n) not in stores:
            lines.append(n.lineno)
    return sorted(lines)


def test_no_module_reads_the_environment_outside_its_packages_table():
    offenders = []
    for package in ("runtime", "hccl", "launcher"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                if rel in CONFIG_MODULES:
                    continue
                offenders += [f"{rel}:{ln}" for ln in
                              environ_reads(open(path, encoding="utf-8").read())]
    assert offenders == [], ("read these through the package's config table "
                             f"(runtime/hccl/launcher config.py): {offenders}")


def test_the_scan_sees_every_spelling_of_a_read_and_lets_writes_pass():
    src = ("import os\nfrom os import environ as E, getenv\n"
           "a = os.environ.get('X')\nb = os.environ['Y']\nc = dict(os.environ)\n"
           "d = os.getenv('Z')\ne = E.get('W')\nf = getenv('V')\ng = 'K' in os.environ\n"
           "os.environ['SET'] = '1'\ndel os.environ['SET']\nenv = {}\nenv['CHILD'] = '1'\n")
    assert environ_reads(src) == [3, 4, 5, 6, 7, 8, 9]


def test_every_variable_is_in_one_table_with_a_type_a_meaning_and_its_readers():
    seen = {}
    for table in TABLES:
        for var in table:
            assert var.name not in seen, f"{var.name} is in {seen[var.name]} and {table.package}"
            seen[var.name] = table.package
            assert var.type in RULES and var.meaning and var.readers, var
            assert var.default_text(), var
            if var.default is not None and var.type in ("int", "seconds", "number"):
                assert var.parse(var.default_text() if not var.shown else None) == var.default


@pytest.mark.parametrize("name,raw,expect", [
    ("NPUSIM_DEVICE_COUNT", " 4 ", 4), ("NPUSIM_DEVICE_COUNT", "", 8),
    ("HCCL_EXEC_TIMEOUT", "2.5", 2.5), ("NPUSIM_STOP_GRACE", "0", 0.0),
    ("NPUSIM_SHM", "off", False), ("NPUSIM_SHM", "YES", True), ("NPUSIM_BIND", None, None),
    ("NPUSIM_STREAM_CHECK", "on", "raise"), ("NPUSIM_STREAM_CHECK", "warn", "warn"),
    ("NPUSIM_JOB_ID", "a/b", "local"), ("NPUSIM_JOB_SECRET", "0aFF", b"\x0a\xff"),
    ("HCCL_IF_IP", "10.0.0.5", "10.0.0.5"), ("MASTER_PORT", "29500", 29500),
])
def test_one_rule_per_type(name, raw, expect):
    var = next(t.vars[name] for t in TABLES if name in t)
    assert var.parse(raw) == expect


@pytest.mark.parametrize("name,raw,words", [
    ("NPUSIM_DEVICE_COUNT", "0x8", "an integer >= 1"), ("NPUSIM_DEVICE_COUNT", "0", ">= 1"),
    ("ASCEND_GLOBAL_LOG_LEVEL", "5", "an integer in [0, 4]"),
    ("HCCL_EXEC_TIMEOUT", "0", "a positive number of seconds"),
    ("HCCL_CONNECT_TIMEOUT", "inf", "a positive number of seconds"),
    ("NPUSIM_STOP_GRACE", "-1", "a number of seconds >= 0"),
    ("NPUSIM_SHM", "2", "1 or 0"), ("NPUSIM_STREAM_CHECK", "2", "one of 0, off"),
    ("HCCL_IF_IP", "host", "an IP address"), ("MASTER_PORT", "70000", "in [1, 65535]"),
    ("NPUSIM_SHM_SLOT_BYTES", "1000", "a multiple of 64"),
    ("NPUSIM_SHM_SPIN_US", "1e6", "a number in [0, 1e+06)"),
])
def test_a_refused_value_has_one_text_in_every_package(monkeypatch, name, raw, words):
    """The runtime raises EnvError (a ValueError), hccl InvalidArgumentError, npurun ConfigError:
    the same text, naming the variable, the value, what is expected and the default."""
    var = next(t.vars[name] for t in TABLES if name in t)
    with pytest.raises(EnvError) as e:
        var.parse(raw)
    text = str(e.value)
    assert text.startswith(f"{name}={raw!r} is not ") and words in text, text
    assert text.endswith(f"; unset it for the default ({var.default_text()})"), text
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError) as lau:
        lconfig.get(name)
    assert str(lau.value) == text
    if name not in lconfig.TABLE:      # a knob of the ranks too
        with pytest.raises(InvalidArgumentError) as h:
            hconfig.get(name)
        assert str(h.value) == text


def test_the_job_secret_is_never_echoed(monkeypatch):
    monkeypatch.setenv("NPUSIM_JOB_SECRET", "s3cr3t-not-hex")
    with pytest.raises(InvalidArgumentError) as e:
        hconfig.job_secret()
    assert "s3cr3t" not in str(e.value) and "NPUSIM_JOB_SECRET (value not shown)" in str(e.value)


def test_a_value_is_parsed_once_while_its_text_stays(monkeypatch):
    calls = []
    var = Var("NPUSIM_TEST_KNOB", "int", 1, "a test knob", "this test",
              check=lambda v: calls.append(v) or "")
    table = rconfig.Table("test", [var])
    monkeypatch.setenv("NPUSIM_TEST_KNOB", "7")
    assert table.get("NPUSIM_TEST_KNOB") == table.get("NPUSIM_TEST_KNOB") == 7 and calls == [7]
    monkeypatch.setenv("NPUSIM_TEST_KNOB", "9")
    assert table.get("NPUSIM_TEST_KNOB") == 9 and calls == [7, 9]


def test_npurun_refuses_what_its_ranks_would_refuse(monkeypatch):
    """The launcher no longer falls back to 3 for a bad log level, nor shows a raw exec timeout
    that hccl would refuse: check() (npurun's start) refuses both, with hccl's text."""
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="HCCL_EXEC_TIMEOUT='soon' is not a positive number"):
        lconfig.check()
    with pytest.raises(ConfigError):
        lconfig.exec_timeout_text()
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "120")
    assert lconfig.exec_timeout_text() == "120"
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "9")
    with pytest.raises(ConfigError, match="ASCEND_GLOBAL_LOG_LEVEL='9'"):
        lconfig.check()
    monkeypatch.delenv("ASCEND_GLOBAL_LOG_LEVEL")
    monkeypatch.setenv("RANK", "not-a-rank")      # npurun sets RANK for its workers: not checked
    lconfig.check()


def test_the_environment_page_is_generated_from_the_tables():
    with open(envdoc.PAGE, encoding="utf-8") as f:
        page = f.read()
    assert page == envdoc.page(), "docs/environment.md is stale: python -m benchmarks.envdoc --write"
    for table in TABLES:
        for var in table:
            assert f"| `{var.name}` |" in page


def test_the_ranks_bootstrap_reads_its_variables_without_importing_runtime():
    """launcher.worker runs before the user's code: importing numpy there would delay every rank's
    stack dump and death guard by seconds on a loaded machine (launcher/config.py's note)."""
    import subprocess
    import sys
    code = ("import sys, launcher.worker as w, launcher.config as c\n"
            "assert c.stack_file() == '/tmp/x' and c.rank() == 3 and c.launcher_pid() is None\n"
            "print(sorted(m for m in ('runtime', 'numpy', 'hccl.config') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=ROOT, NPUSIM_STACK_FILE=" /tmp/x ", RANK="3",
               NPUSIM_LAUNCHER_PID="x")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
