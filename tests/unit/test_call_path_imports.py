"""The call path's modules import one way (no cycles inside hccl), and the rendezvous store stays
light: ``import hccl.store`` loads no numpy and no runtime (hccl/__init__.py's note)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hccl_imports() -> dict[str, set[str]]:
    """hccl module -> the hccl modules it imports (also inside functions, relative or not)."""
    graph = {}
    base = os.path.join(ROOT, "hccl")
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
            mod = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            pkg = mod if f == "__init__.py" else mod.rsplit(".", 1)[0]
            deps = set()
            for node in ast.walk(ast.parse(open(os.path.join(dirpath, f)).read())):
                if isinstance(node, ast.Import):
                    deps |= {(a.name, a.name) for a in node.names if a.name.startswith("hccl")}
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                        target = ".".join(up + ([node.module] if node.module else []))
                    else:
                        target = node.module or ""
                    if target.startswith("hccl"):    # a submodule, else the module itself
                        deps |= {(target, f"{target}.{a.name}") for a in node.names}
            graph[mod] = deps
    return {m: {sub if sub in graph else target for target, sub in deps} - {m} & set(graph)
            for m, deps in graph.items()}


def test_no_import_cycle_inside_hccl():
    graph = _hccl_imports()
    graph.pop("hccl", None)          # the package's lazy __getattr__ imports on demand only
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if d == "hccl":
                continue
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_importing_the_store_loads_no_numpy_and_no_runtime():
    # of the runtime only its light package: hccl's old paths use runtime's alias finder
    light = "('runtime', 'runtime.aliases', 'runtime.config', 'runtime.hooks', 'runtime.log')"
    code = ("import sys, hccl.store; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'runtime', 'ml_dtypes') and m not in " + light + " or "
            "m in ('hccl.plan', 'hccl.comm')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
