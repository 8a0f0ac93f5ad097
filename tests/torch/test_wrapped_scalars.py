"""A Python number where an npu operator's schema has a Tensor (``a % 4``, ``t & 3``,
``fmod(t, 4.5)``): torch reaches the ``.Tensor`` overload through the ``.Scalar`` one's composite
and hands the wrapped number to Python as the number itself. The npu result must be the CPU's:
same values, same dtype (a wrapped number promotes as a scalar, not as a 0-dim tensor)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

CASES = {
    "remainder int": lambda x: x % 4,
    "remainder fn": lambda x: torch.remainder(x, 3),
    "fmod float": lambda x: torch.fmod(x, 4.5),
    "float remainder": lambda x: x.float() % 2.5,
    "bitwise_and": lambda x: x & 3,
    "bitwise_or fn": lambda x: torch.bitwise_or(x, 8),
    "bitwise_xor": lambda x: x ^ 5,
    "mul bool": lambda x: x * True,
    "int tensor / float promotes to default dtype": lambda x: x * 1.5,
    "where scalar": lambda x: torch.where(x > 2, x, 0),
    "in place": lambda x: x.float().add_(2).mul_(0.5),
    "double with float scalar keeps double": lambda x: x.double() % 0.3,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_python_number_as_tensor_argument_matches_cpu(name):
    f = CASES[name]
    cpu = torch.arange(-5, 7)
    npu = f(cpu.to("npu")).cpu()
    ref = f(cpu)
    assert npu.dtype == ref.dtype, (name, npu.dtype, ref.dtype)
    assert torch.equal(npu, ref), (name, npu, ref)


def test_the_number_takes_the_scalar_overload_not_the_packet():
    """The overload is found once per operator and position (no per-call resolution)."""
    from runtime.torch import ops as O
    t = torch.arange(6, device="npu")
    t % 4
    t & 3
    found = {i.name: ov for i in list(O._info.values()) if i.packet for ov in i.packet.values()}
    rem = [ov for name, ov in found.items() if name.startswith("aten::remainder")]
    band = [ov for name, ov in found.items() if name.startswith("aten::bitwise_and")]
    assert rem and band, found
    for ov in rem + band:
        assert isinstance(ov, torch._ops.OpOverload) and "Scalar" in ov._overloadname, ov
