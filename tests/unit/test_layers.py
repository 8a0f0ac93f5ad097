"""Layers point one way: runtime knows nothing of hccl or launcher, hccl never imports launcher,
and no installed package imports the tools (benchmarks/) or the test helpers (tests/)."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORBIDDEN = {"runtime": {"hccl", "launcher", "benchmarks", "tests"},
             "hccl": {"launcher", "benchmarks", "tests"},
             "launcher": {"benchmarks", "tests"}}


def imported_packages(path: str) -> set[str]:
    """Top-level names of every absolute import in the file (also inside functions)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_layers_below_it(package):
    bad = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                hits = imported_packages(path) & FORBIDDEN[package]
                bad += [f"{os.path.relpath(path, ROOT)} imports {h}" for h in sorted(hits)]
    assert not bad, bad


def test_the_scan_sees_imports_inside_functions(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import os\ndef f():\n    from launcher.testing import x\n    import hccl.bench\n"
                 "from . import sibling\n")
    assert imported_packages(str(p)) == {"os", "launcher", "hccl"}
