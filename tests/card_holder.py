"""A process that holds memory on a simulated card until told to go (tests of runtime/memory/card.py).

``python tests/card_holder.py DEVICE MIB [torch]`` allocates MIB MiB on DEVICE (through torch's
npu device with ``torch``), prints ``held <pid>`` and waits for a line on stdin, then frees and
exits. ``Holder`` starts one from a test and waits for the line with a deadline.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Holder:
    """A card_holder.py process: ``pid``; ``release()`` lets it exit, ``kill()`` SIGKILLs it."""

    def __init__(self, device: int, mib: int, env: dict | None = None, torch: bool = False,
                 timeout: float = 60.0):
        e = dict(os.environ if env is None else env)
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
        args = [sys.executable, os.path.join(HERE, "card_holder.py"), str(device), str(mib)]
        self.proc = subprocess.Popen(args + (["torch"] if torch else []), env=e,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout
        line = ""
        while not line:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.poll() is not None else ""
                self.kill()
                raise AssertionError(f"holder did not report within {timeout:g} s: {err[-2000:]}")
            r, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if r:
                line = self.proc.stdout.readline()
        assert line.split() == ["held", str(self.pid)], line

    def release(self, timeout: float = 30.0) -> int:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def main() -> None:
    device, mib = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] == "torch":
        import torch
        import torch_npu  # noqa: F401
        torch.npu.set_device(device)
        held = torch.empty(mib << 20, dtype=torch.uint8, device="npu")
    else:
        import runtime
        runtime.set_device(device)
        held = runtime.malloc(mib << 20)
    print("held", os.getpid(), flush=True)
    sys.stdin.readline()
    del held


if __name__ == "__main__":
    main()
