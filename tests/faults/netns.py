"""Nodes as plain network namespaces on this machine, joined pairwise by veth links.

``Mesh(n)`` makes ``n`` namespaces (no PID namespace: their processes share this machine's PID
namespace and boot id, as two containers with host PIDs would) and one veth pair per pair of
namespaces. Each namespace's node address (``addr[i]``, a /32 on its loopback device) is what
its npurun binds and advertises; namespace i reaches ``addr[j]`` over the veth pair (i, j) only,
so a link's qdisc acts on exactly the traffic between those two nodes, in one direction:
``limit(i, j, rate)`` puts a ``tbf`` on i's end of the pair (i's sends to j; netem is not in
this kernel). Every address is private (10.x.y.z) and exists only inside the namespaces.

``close`` deletes the namespaces (that deletes their veth ends, and so the pairs) whatever
state the set-up reached; ``Mesh`` is a context manager and tests use it through a fixture, so
nothing is left after a failed test. ``Unavailable`` says why namespaces cannot be made here (not
root, no iproute2, a sandbox that forbids ``ip netns``): tests skip with it.

Command line (the show case of issue 40): ``python -m tests.faults.netns`` is documented in
tests/faults/test_failslow_nodes.py.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid


class Unavailable(Exception):
    """Network namespaces (or veth, tc) cannot be used here; the message says why."""


def sh(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


class Mesh:
    """``n`` network namespaces, a veth pair between every two; see the module note."""

    def __init__(self, n: int):
        if n < 2:
            raise ValueError(f"n={n}: a mesh needs at least 2 namespaces")
        if os.geteuid() != 0:
            raise Unavailable("needs root to make network namespaces")
        for tool in ("ip", "tc"):
            if not shutil.which(tool):
                raise Unavailable(f"needs {tool} (iproute2) to make and shape network namespaces")
        self.n = n
        tag = uuid.uuid4().hex[:6]
        self.ns = [f"npm{tag}{i}" for i in range(n)]
        net = f"10.{random.randint(64, 250)}.{random.randint(0, 250)}"
        self.addr = [f"{net}.{i + 1}" for i in range(n)]
        self._made: list[str] = []
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def dev(self, i: int, j: int) -> str:
        """Namespace i's end of the veth pair to namespace j."""
        return f"{self.ns[i][-7:]}v{j}"

    def _run(self, *cmd: str) -> None:
        r = sh(*cmd)
        if r.returncode:
            raise Unavailable(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")

    def _build(self, tag: str) -> None:
        for ns in self.ns:
            self._run("ip", "netns", "add", ns)
            self._made.append(ns)
        for i, ns in enumerate(self.ns):
            self._run("ip", "-n", ns, "link", "set", "lo", "up")
            self._run("ip", "-n", ns, "addr", "add", f"{self.addr[i]}/32", "dev", "lo")
        for i in range(self.n):
            for j in range(i + 1, self.n):
                a, b = self.dev(i, j), self.dev(j, i)
                # made in namespace i, its peer moved to j: no interface ever sits in the root
                # namespace, so a failed set-up leaves nothing outside the namespaces
                self._run("ip", "-n", self.ns[i], "link", "add", a, "type", "veth", "peer",
                          "name", b, "netns", self.ns[j])
                for k, me, other, d in ((i, i, j, a), (j, j, i, b)):
                    ns = self.ns[k]
                    self._run("ip", "-n", ns, "link", "set", d, "up")
                    self._run("ip", "-n", ns, "route", "add", f"{self.addr[other]}/32", "dev", d,
                              "src", self.addr[me])

    def limit(self, i: int, j: int, rate: str = "40mbit") -> None:
        """Rate-limit namespace i's sends to namespace j (``tbf``, burst 64 KiB, 400 ms queue)."""
        self._run("ip", "netns", "exec", self.ns[i], "tc", "qdisc", "add", "dev", self.dev(i, j),
                  "root", "tbf", "rate", rate, "burst", "64kb", "latency", "400ms")

    def cmd(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace i (no PID namespace of its own)."""
        return ["ip", "netns", "exec", self.ns[i], *argv]

    def close(self) -> None:
        for ns in self._made:       # deleting a namespace deletes its veth ends, and the pairs
            sh("ip", "netns", "del", ns)
        self._made = []

    def __enter__(self) -> "Mesh":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
