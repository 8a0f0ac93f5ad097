"""The shared-memory channel runs only on x86-64: its ordering argument is x86-64's (shm.py)."""
import pytest

import hccl
from hccl.transport import shm


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le", "riscv64"])
def test_no_channel_on_another_cpu(monkeypatch, machine):
    monkeypatch.setattr(shm.platform, "machine", lambda: machine)
    monkeypatch.delenv("NPUSIM_SHM", raising=False)
    assert not shm.available()
    with pytest.raises(shm.ChannelError, match=f"x86-64 Linux only .this is {machine}"):
        shm.Channel(0, 2, "gatetest")                  # nor can anyone build one by hand
    comm = hccl.comm_init_root_info(1, hccl.get_root_info(), 0)   # what a communicator gets
    try:
        t = comm.world.transport
        assert t.channel is None and t.segment == ""
    finally:
        comm.destroy()


def test_the_channel_on_x86_64(monkeypatch):
    monkeypatch.setattr(shm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(shm.sys, "platform", "linux")
    monkeypatch.delenv("NPUSIM_SHM", raising=False)
    assert shm.available() == shm.os.path.isdir("/dev/shm")
    if shm.available():
        comm = hccl.comm_init_root_info(1, hccl.get_root_info(), 0)
        try:
            assert comm.world.transport.channel is not None   # the gate is what turned it off
        finally:
            comm.destroy()
