"""No private name (``_x``) is used outside the module that defines it.

An AST scan of the product (runtime/, hccl/, launcher/, examples/) for three forms:
``from m import _x``; ``m._x`` where ``m`` is a name bound by an import of a project module; and
``C._x`` / ``C(...)._x`` where ``C`` is a class imported from another project module. Dunders
(``__init__``) are not private. Run it alone: ``python -m pytest tests/unit/test_private_names.py``.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "hccl", "launcher", "examples")
PROJECT = ("runtime", "hccl", "launcher")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(mod: str, level: int, here: str, is_pkg: bool) -> str:
    if not level:
        return mod or ""
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([mod] if mod else []))


def _ours(mod: str) -> bool:
    return mod.split(".")[0] in PROJECT


def violations(path: pathlib.Path) -> list[str]:
    """``path:line: text`` for each private name of another module that ``path`` uses."""
    here = _module_of(path)
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}     # local name -> project module it is bound to
    classes: dict[str, str] = {}     # local name -> project module of an imported CapWord name
    out = []
    rel = path.relative_to(ROOT).as_posix()
    # attributes this module sets (``h._tag = 1``): reading them back by getattr is its own business
    own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(node.module or "", node.level, here, is_pkg)
            if not _ours(src):
                continue
            for a in node.names:
                if _private(a.name) and src != here:
                    out.append(f"{rel}:{node.lineno}: from {src} import {a.name}")
                local = a.asname or a.name
                if a.name[:1].isupper():
                    classes[local] = src
                else:
                    modules[local] = f"{src}.{a.name}"   # a submodule or a function: both count
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and modules.get(f.value.id, here) != here:
                for kw in node.keywords:
                    if kw.arg and _private(kw.arg):
                        out.append(f"{rel}:{node.lineno}: {f.value.id}.{f.attr}({kw.arg}=)")
            if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr", "setattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                    and node.args[1].value not in own \
                    and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")):
                out.append(f"{rel}:{node.lineno}: {f.id}(..., {node.args[1].value!r})")
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        v = node.value
        if isinstance(v, ast.Call):
            v = v.func
        if isinstance(v, ast.Name) and (v.id in modules or v.id in classes):
            src = modules.get(v.id) or classes[v.id]
            if src != here:
                out.append(f"{rel}:{node.lineno}: {v.id}.{node.attr} ({src})")
    return out


def scan() -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found += violations(path)
    return found


def test_the_scanner_sees_each_form():
    src = ("from hccl.wire import _check_secret\nfrom hccl import bench, collectives\n"
           "import hccl.init\nfrom hccl.comm import Comm\n"
           "bench._busbw_factor(1)\nhccl._env_secret()\nComm._enqueue\nComm()._lock\n"
           "collectives.all_reduce(1, _site=2)\ngetattr(comm, '_check_alive')\n"
           "x.__class__\nbench.__name__\nself._own\ngetattr(self, '_own')\nother._x\n")
    f = ROOT / "hccl" / "scanner_probe_of_test_private_names.py"
    f.write_text(src)
    try:
        got = [g.split(": ", 1)[1] for g in violations(f)]
    finally:
        f.unlink()
    assert sorted(got) == sorted([
        "from hccl.wire import _check_secret", "bench._busbw_factor (hccl.bench)",
        "hccl._env_secret (hccl)", "Comm._enqueue (hccl.comm)", "Comm._lock (hccl.comm)",
        "collectives.all_reduce(_site=)", "getattr(..., '_check_alive')"])


def test_no_private_name_crosses_a_module():
    assert scan() == []
