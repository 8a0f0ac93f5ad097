"""A rank's exit never unmaps shared memory that one of its threads still touches.

The fork server's ranks and big failing jobs end while a daemon thread (ZeroMQ's monitor handling
a peer's disconnect) can still ring a pair's bell; an unmap at exit made that a SIGSEGV (seen at
world 128). The script below makes the race certain: a daemon thread writes the mapping in a
loop while the interpreter runs its exit handlers, one of them after the mapping's own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import atexit, time
    atexit.register(time.sleep, 0.05)       # registered first, so it runs after the mapping's
    import os, sys, threading
    from hccl.transport import shm
    fd = os.memfd_create("npusim-exit-probe")
    os.ftruncate(fd, 1 << 16)
    arr = shm._map(fd, 1 << 16)
    busy = threading.Event()
    def ring():
        busy.set()
        while True:
            arr[0] = (arr[0] + 1) & 0xFF
    threading.Thread(target=ring, daemon=True).start()
    busy.wait(10)
    sys.exit(0)
""")


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs os.memfd_create (Linux)")
def test_exit_with_a_thread_on_the_mapping_is_clean():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    codes = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, timeout=30).returncode
             for _ in range(3)]
    assert codes == [0, 0, 0], f"exit codes {codes} (-11: SIGSEGV, an unmap at exit)"
