"""The rooms of every installed package (runtime, hccl, launcher, torch_npu): no package
directory holds more than 20 modules, no module has more than 600 lines, and no two modules of a
package import each other, counting imports inside functions (issue 55). Old module paths are
aliases of the moved modules (runtime/aliases.py; hccl/__init__.py's ``_ALIASES``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_layers import cycles, import_graph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_MODULES = 20
MAX_LINES = 600


def rooms(package: str) -> dict[str, list[str]]:
    """Package directory (relative to ROOT) -> its modules (.py files side by side)."""
    out = {}
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out[os.path.relpath(dirpath, ROOT).replace(os.sep, "/")] = sorted(
            f for f in files if f.endswith(".py"))
    return out


def long_modules(room: str, mods: list[str]) -> list[str]:
    found = []
    for f in mods:
        with open(os.path.join(ROOT, room, f), encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            found.append(f"{room}/{f}: {n} lines")
    return found


PACKAGES = ("runtime", "hccl", "launcher", "torch_npu")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_room_holds_more_than_20_modules(package):
    found = rooms(package)
    crowded = {room: len(mods) for room, mods in found.items() if len(mods) > MAX_MODULES}
    assert crowded == {}
    assert sum(len(m) for m in found.values()) > MAX_MODULES      # the walk sees the package


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines(package):
    bad = [m for room, mods in rooms(package).items() for m in long_modules(room, mods)]
    assert bad == []


def test_the_rooms_are_the_ones_the_architecture_page_names():
    assert set(rooms("hccl")) >= {"hccl", "hccl/algo", "hccl/transport", "hccl/torch"}
    assert set(rooms("runtime")) >= {"runtime", "runtime/acl", "runtime/memory", "runtime/torch"}
    assert set(rooms("launcher")) >= {"launcher", "launcher/procs", "launcher/agent",
                                      "launcher/diagnosis", "launcher/profile"}


def test_the_room_checks_see_a_crowded_room_and_a_long_module(tmp_path, monkeypatch):
    (tmp_path / "pk" / "sub").mkdir(parents=True)
    for i in range(MAX_MODULES + 1):
        (tmp_path / "pk" / f"m{i}.py").write_text("")
    (tmp_path / "pk" / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    found = rooms("pk")
    assert len(found["pk"]) == MAX_MODULES + 1 and found["pk/sub"] == ["big.py"]
    assert long_modules("pk/sub", found["pk/sub"]) == [f"pk/sub/big.py: {MAX_LINES + 1} lines"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_modules_of_a_package_import_each_other_even_inside_functions(package):
    graph = import_graph(package, inside_functions=True)
    assert cycles(graph) == []
    mutual = sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))
    assert mutual == []


def test_the_import_graph_is_the_real_one():
    graph = import_graph("hccl", inside_functions=True)
    assert "hccl.algo.executor" in graph["hccl.call"]
    assert "hccl.transport.base" in graph["hccl.algo.executor"]


def test_old_module_paths_are_the_moved_modules():
    code = ("import importlib, sys, hccl\n"
            "names = ['schedule', 'plan', 'executor', 'fusion', 'steps', 'rooted', 'reduction']\n"
            "for name in names:\n"
            "    old, new = 'hccl.' + name, 'hccl.algo.' + name\n"
            "    m = importlib.import_module(old)\n"
            "    assert m is sys.modules[new] and m.__name__ == m.__spec__.name == new, old\n"
            "from hccl.schedule import Send\n"
            "from hccl.algo.steps import Send as S2\n"
            "assert Send is S2 and hccl.plan is sys.modules['hccl.algo.plan']\n"
            "from hccl.store import StoreClient, StoreError, StoreServer, StoreTimeout\n"
            "from hccl.transport.base import DONE, Pair, SendHandle\n"
            "from hccl.transport.pair import DONE as D2\n"
            "assert DONE is D2\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_an_unknown_old_path_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        __import__("hccl.no_such_module")
