"""Layers point one way: runtime knows nothing of hccl or launcher, hccl never imports launcher,
and no installed package imports the tools (benchmarks/) or the test helpers (tests/)."""
from __future__ import annotations

import ast
import os
import sys

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


# -- no import cycles inside a package ---------------------------------------------------------------
def package_modules(package: str) -> dict[str, str]:
    """Dotted name -> path of every module of ``package`` (a package is named by its __init__)."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def import_graph(package: str, inside_functions: bool) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports: at module level (what runs when it
    is imported), or anywhere (also inside functions: a deferred import is still a dependency).
    ``from pkg import sub`` is an edge to ``pkg.sub``; imports under ``if TYPE_CHECKING`` and of
    a module's own parent packages (always imported first) are not edges."""
    mods = package_modules(package)
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        skip = {id(n) for top in ast.walk(tree) if isinstance(top, ast.If)
                and "TYPE_CHECKING" in ast.dump(top.test) for n in ast.walk(top)}
        nodes = ast.walk(tree) if inside_functions else (
            n for top in tree.body if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                            ast.ClassDef)) for n in ast.walk(top))
        base = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in nodes:
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = node.module or ""
                if node.level:
                    anchor = base
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    src = f"{anchor}.{src}" if src else anchor
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src
                           for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in mods and t != mod
                           and not mod.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


@pytest.mark.parametrize("package,inside_functions", [
    ("hccl", False),
    ("hccl", True),
    ("runtime", False),
    ("runtime", True),
    ("launcher", False),
    ("launcher", True),
], ids=["hccl-module-level", "hccl-anywhere", "runtime-module-level", "runtime-anywhere",
        "launcher-module-level", "launcher-anywhere"])
def test_no_import_cycle_inside_a_package(package, inside_functions):
    assert cycles(import_graph(package, inside_functions)) == []


def test_the_cycle_finder_sees_relative_deferred_and_package_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from pk import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")           # deferred: b -> a
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom pk import sub\n"
                                      "from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from pk.sub import d\n")
    (pkg / "sub" / "d.py").write_text("import pk.sub.c\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert cycles(import_graph("pk", inside_functions=False)) == []
    assert cycles(import_graph("pk", inside_functions=True)) == [["pk.a", "pk.b"]]
    graph = import_graph("pk", inside_functions=True)
    assert graph["pk.sub.c"] == {"pk.a"} and graph["pk.sub.d"] == {"pk.sub.c"}
