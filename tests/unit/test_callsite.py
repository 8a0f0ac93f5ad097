"""Call sites: every malloc and enqueue records the user's file:line, past library frames."""
import os
import sys
import types

import runtime
from runtime import callsite as cs


def _line(offset: int = 0) -> int:
    return sys._getframe(1).f_lineno + offset


def test_each_malloc_line_is_its_own_site(device):
    here = os.path.abspath(__file__)
    sites = []
    for _ in range(3):                       # a hot loop: the second pass comes from the cache
        a = runtime.malloc(4096); la = _line()
        b = runtime.malloc(4096); lb = _line()
        sites.append((a._block.site, b._block.site))
        runtime.free(a)
        runtime.free(b)
    assert sites[0] == sites[1] == sites[2]
    assert sites[0] == (f"{here}:{la} in test_each_malloc_line_is_its_own_site",
                        f"{here}:{lb} in test_each_malloc_line_is_its_own_site")


def test_library_frames_are_skipped_and_registering_a_folder_takes_effect(device, tmp_path):
    lib = tmp_path / "mylib"
    lib.mkdir()
    src = "import runtime\ndef alloc(n):\n    return runtime.malloc(n)\n"
    (lib / "alloc.py").write_text(src)
    mod = types.ModuleType("mylib_alloc")
    exec(compile(src, str(lib / "alloc.py"), "exec"), mod.__dict__)
    p = mod.alloc(512)
    assert p._block.site.startswith(f"{lib / 'alloc.py'}:3 in alloc")    # a user file so far
    saved = cs._internal
    try:
        cs.add_internal(str(lib))            # after the file's verdict was cached
        q = mod.alloc(512); line = _line()
        assert q._block.site == f"{os.path.abspath(__file__)}:{line} in " \
            "test_library_frames_are_skipped_and_registering_a_folder_takes_effect"
    finally:
        cs._internal = saved
        cs._inside.clear()
        cs._cache.clear()
    runtime.free(p)
    runtime.free(q)
