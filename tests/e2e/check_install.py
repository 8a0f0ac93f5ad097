"""What README's `pip install -e '.[test]'` must have left in this interpreter's environment, checked
offline: npusim installed with the dependencies this checkout declares (base and the [test] extra),
each installed at a version its specifier accepts, and the `npurun` script beside the interpreter.

Run by tests/e2e/test_readme.py (`python tests/e2e/check_install.py`); prints one line per check
and exits 1 naming what is missing. It replaces `pip install --dry-run --no-build-isolation`,
which needs the `wheel` package that a fresh venv lacks and does not show the install happened.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import sys

from packaging.requirements import Requirement   # pytest's own dependency: present with [test]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def declared() -> list[str]:
    """The checkout's dependencies and [test] extra, from pyproject.toml."""
    import tomllib   # noqa: PLC0415 - Python >= 3.11; older ones compare with the installed list
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["test"])


def problems() -> list[str]:
    try:
        dist = md.distribution("npusim")
    except md.PackageNotFoundError:
        return ["npusim is not installed in this environment: pip install -e '.[test]'"]
    print(f"npusim {dist.version} installed ({dist.read_text('direct_url.json') or 'not editable'})")
    bad = []
    installed = [Requirement(r) for r in dist.requires or []]
    wanted = [r for r in installed if not r.marker or r.marker.evaluate({"extra": "test"})]
    try:
        names = {Requirement(r).name for r in declared()}
        if names != {r.name for r in wanted}:
            bad.append(f"the install is stale: it requires {sorted(r.name for r in wanted)}, "
                       f"pyproject.toml now {sorted(names)}: pip install -e '.[test]' again")
    except ImportError:
        pass
    for req in wanted:
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            bad.append(f"{req} is not installed")
            continue
        if not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req.name} {version} does not satisfy {req}")
        else:
            print(f"  {req.name} {version} ({req})")
    script = os.path.join(os.path.dirname(sys.executable), "npurun")
    if not os.access(script, os.X_OK):
        bad.append(f"no npurun script at {script}")
    else:
        print(f"  npurun: {script}")
    return bad


if __name__ == "__main__":
    bad = problems()
    for p in bad:
        print("MISSING:", p)
    print("install check: " + ("FAILED" if bad else "OK, with the [test] extra"))
    sys.exit(1 if bad else 0)
