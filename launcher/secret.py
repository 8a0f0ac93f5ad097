"""The job secret: where it comes from, and how the nodes of one job come to share it.

Every connection of a job (the rendezvous store, the transport) is authenticated with one secret,
which travels to the workers in ``NPUSIM_JOB_SECRET`` (hex), never on a command line.

- One node: the launcher generates a fresh 256-bit secret for every run.
- Several nodes: the launcher takes ``NPUSIM_JOB_SECRET`` from its own environment; the user sets
  the same value on every node, like a shared token (under SLURM: export it in the batch script
  before ``srun``, which hands the environment to every node). It must be hex, >= 128 bits.
- Several nodes all on loopback (``--master-addr`` 127.x / ::1 / localhost) without that variable:
  node 0 generates the secret and writes it to ``<dir>/npurun-secret-<master_port>`` with mode
  0600, in ``$XDG_RUNTIME_DIR`` or else ``/tmp/npusim-<uid>`` (0700, must be owned by the user);
  the other nodes, necessarily the same machine and the same user, read it there. Node 0 removes
  the file when it exits.
- Several nodes on a network without ``NPUSIM_JOB_SECRET``: refused, with the command to fix it.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat
import time

from launcher import config
from launcher.errors import ConfigError

MIN_BYTES = 16
HOWTO = ("export NPUSIM_JOB_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') "
         "with the same value on every node")


def generate() -> str:
    """A fresh secret: 64 hex digits (256 bits)."""
    return secrets.token_hex(32)


def check(value: str, source: str = "NPUSIM_JOB_SECRET") -> str:
    """Return ``value`` if it is a hex secret of >= 128 bits; raise ConfigError otherwise."""
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ConfigError(f"{source} is not hexadecimal; {HOWTO}") from None
    if len(raw) < MIN_BYTES:
        raise ConfigError(f"{source} has {len(raw) * 8} bits, at least {MIN_BYTES * 8} are "
                          f"needed; {HOWTO}")
    return value.lower()


def as_bytes(value: str) -> bytes:
    """The key used by every connection: the bytes the hex secret spells."""
    return bytes.fromhex(value)


def is_loopback(host: str) -> bool:
    """True if ``host`` names this machine's loopback interface."""
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def secure_dir() -> str:
    """The per-user 0700 directory of the launcher's secret and status files (created once)."""
    base = config.runtime_dir()
    path = base if base and os.path.isdir(base) else f"/tmp/npusim-{os.getuid()}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(f"{path} must be a directory owned by you with mode 0700 to hold the "
                          f"job secret; fix it or set NPUSIM_JOB_SECRET ({HOWTO})")
    return path


def secret_file(master_port: int) -> str:
    """Where node 0 of a loopback multi-node job publishes the secret."""
    return os.path.join(secure_dir(), f"npurun-secret-{int(master_port)}")


def publish(master_port: int, value: str) -> str:
    """Node 0: write the secret file (0600, atomically); return its path."""
    path = secret_file(master_port)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read_published(master_port: int) -> str | None:
    """Other nodes: the secret in the file, or None if there is none (yet)."""
    path = secret_file(master_port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigError(f"{path} is not a 0600 file of yours; remove it")
        value = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return check(value, path) if value else None


def unpublish(master_port: int, value: str) -> None:
    """Node 0 at exit: remove the file if it still holds our secret."""
    try:
        if read_published(master_port) == value:
            os.unlink(secret_file(master_port))
    except (OSError, ConfigError):
        pass


def wait_published(master_port: int, deadline: float, should_stop=lambda: False) -> str | None:
    """Wait (until ``deadline``, a ``time.monotonic()`` value) for node 0's secret file."""
    while True:
        value = read_published(master_port)
        if value or time.monotonic() >= deadline or should_stop():
            return value
        time.sleep(0.05)  # a file has no wake-up; this runs only while a loopback job starts


def for_job(nnodes: int, node_rank: int, master_addr: str) -> str | None:
    """The secret to use, or None when this node must read node 0's published file.

    Raises ConfigError for a network multi-node job without NPUSIM_JOB_SECRET.
    """
    env = config.job_secret()
    if nnodes == 1:
        return generate()
    if env:
        return check(env)
    if not is_loopback(master_addr):
        raise ConfigError(
            f"a job over {nnodes} nodes (--master-addr {master_addr}) needs a secret shared by "
            f"all nodes: {HOWTO}")
    return generate() if node_rank == 0 else None
