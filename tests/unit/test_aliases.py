"""runtime/aliases.py: the one finder that imports an old module path as the moved module itself
(runtime's and hccl's old paths), and the lazy-name step of the packages' ``__getattr__``."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types

import pytest

from runtime import aliases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A throwaway package ``alias_pkg`` with a moved module ``alias_pkg.room.mod``."""
    root = tmp_path / "alias_pkg"
    (root / "room").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "room" / "__init__.py").write_text("")
    (root / "room" / "mod.py").write_text("LOADS = []\nLOADS.append(1)\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "alias_pkg"
    for name in [m for m in sys.modules if m == "alias_pkg" or m.startswith("alias_pkg.")]:
        del sys.modules[name]
    for old in [o for o in aliases.ALIASES if o.startswith("alias_pkg.")]:
        del aliases.ALIASES[old]


def test_an_old_path_is_the_moved_module_itself(pkg):
    aliases.install(pkg, {"mod": "room.mod", "old_room": "room"})
    old = importlib.import_module("alias_pkg.mod")
    new = sys.modules["alias_pkg.room.mod"]
    assert old is new
    assert old.__name__ == old.__spec__.name == "alias_pkg.room.mod"
    assert old.LOADS == [1]                       # ran once, not once per path
    assert sys.modules["alias_pkg.mod"] is new
    from alias_pkg.mod import VALUE               # noqa: PLC0415
    assert VALUE == 42
    room = importlib.import_module("alias_pkg.old_room")   # a moved package works the same
    assert room is sys.modules["alias_pkg.room"] and room.__spec__.name == "alias_pkg.room"


def test_the_new_path_first_then_the_old_one(pkg):
    aliases.install(pkg, {"mod": "room.mod"})
    new = importlib.import_module("alias_pkg.room.mod")
    assert importlib.import_module("alias_pkg.mod") is new
    assert new.LOADS == [1] and new.__spec__.name == "alias_pkg.room.mod"


def test_an_unknown_old_path_still_fails(pkg):
    aliases.install(pkg, {"mod": "room.mod"})
    with pytest.raises(ModuleNotFoundError) as e:
        importlib.import_module("alias_pkg.no_such_module")
    assert e.value.name == "alias_pkg.no_such_module"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("runtime.no_such_module")


def test_an_alias_to_a_missing_module_names_the_new_path(pkg):
    aliases.install(pkg, {"gone": "room.gone"})
    with pytest.raises(ModuleNotFoundError) as e:
        importlib.import_module("alias_pkg.gone")
    assert e.value.name == "alias_pkg.room.gone"
    assert "alias_pkg.gone" not in sys.modules


def test_bad_declarations_are_refused():
    with pytest.raises(TypeError, match="package"):
        aliases.install("", {"a": "b"})
    with pytest.raises(TypeError, match="moves"):
        aliases.install("alias_pkg", [("a", "b")])
    with pytest.raises(ValueError, match="moves"):
        aliases.install("alias_pkg", {"a": "a"})
    with pytest.raises(ValueError, match="moves"):
        aliases.install("alias_pkg", {"a": ""})


def test_one_finder_on_meta_path_even_after_a_reload():
    import hccl                                   # noqa: F401,PLC0415 - declares its moves
    before = [f for f in sys.meta_path if type(f).__name__ == "_Finder"]
    table = aliases.ALIASES
    importlib.reload(aliases)
    after = [f for f in sys.meta_path if type(f).__name__ == "_Finder"]
    assert len(before) == len(after) == 1 and before[0] is after[0]
    assert aliases.ALIASES is table and "hccl.schedule" in table


def test_bind_caches_the_name_in_the_package():
    ns = {"__name__": "runtime"}
    value = aliases.bind(ns, "NpuError", "errors")
    from runtime.errors import NpuError           # noqa: PLC0415
    assert value is NpuError and ns["NpuError"] is NpuError
    with pytest.raises(AttributeError):
        aliases.bind(ns, "no_such_name", "errors")


def test_runtime_and_hccl_declare_through_the_one_table():
    import hccl                                   # noqa: F401,PLC0415 - declares its moves
    assert aliases.ALIASES["hccl.schedule"] == "hccl.algo.schedule"
    assert isinstance(sys.modules["runtime"], types.ModuleType)


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)


@pytest.mark.timeout(150)
def test_old_hccl_paths_in_a_fresh_process():
    out = _fresh("import sys, hccl.steps as w; import hccl.schedule as s\n"     # no torch needed
                 "assert w is sys.modules['hccl.algo.steps'] and w.__spec__.name == 'hccl.algo.steps'\n"
                 "assert s is sys.modules['hccl.algo.schedule']\nprint('ok')")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


RUNTIME_MOVES = {"runtime.acl_codes": "runtime.acl.codes", "runtime.acl_data": "runtime.acl.data",
                 "runtime.acl_mdl": "runtime.acl.capture", "runtime.acl_ptr": "runtime.acl.pointers"}


@pytest.mark.parametrize("old,new", sorted(RUNTIME_MOVES.items()))
def test_old_acl_paths_are_the_acl_room_modules(old, new):
    m = importlib.import_module(old)
    assert m is sys.modules[new] is importlib.import_module(new)
    assert m.__name__ == m.__spec__.name == new


def test_the_acl_namespace_keeps_every_name_of_its_users():
    from runtime import acl                       # noqa: PLC0415
    from runtime.acl_codes import ACL_SUCCESS, AclError   # noqa: PLC0415
    from runtime.acl_mdl import mdl               # noqa: PLC0415
    from runtime.acl_ptr import util              # noqa: PLC0415
    assert acl.ACL_SUCCESS == ACL_SUCCESS == 0 and acl.AclError is AclError
    assert acl.mdl is mdl and acl.util is util and acl.SOC_NAME == "Ascend910B1"
    assert callable(acl.rt.malloc) and callable(acl.create_data_buffer)
    assert acl.stream_of is sys.modules["runtime.acl.handles"].stream_of
    assert logging_name(acl) == "runtime.acl"


def logging_name(acl) -> str:
    return acl.log.name


@pytest.mark.timeout(150)
def test_old_runtime_paths_in_a_fresh_process():
    out = _fresh("import sys, runtime.acl_mdl as m\n"
                 "assert m is sys.modules['runtime.acl.capture'] and m.__name__ == 'runtime.acl.capture'\n"
                 "from runtime.acl_codes import ACL_ERROR_RT_INVALID_HANDLE as c\n"
                 "import runtime.acl as acl\n"
                 "assert acl.init() == 0 and acl.rt.set_device(0) == 0\n"
                 "s, ret = acl.rt.create_stream(); assert ret == 0, ret\n"
                 "assert acl.mdl.ri_capture_begin(s, 0) == 0\n"
                 "model, ret = acl.mdl.ri_capture_end(s); assert ret == 0, ret\n"
                 "assert m.mdl.ri_destroy(model) == 0 and m.mdl.ri_destroy(model) == c\n"
                 "assert acl.finalize() == 0\nprint('ok')")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
