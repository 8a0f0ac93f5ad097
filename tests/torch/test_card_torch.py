"""One card, several processes, seen from torch (runtime/memory/card.py): torch.npu.mem_get_info counts
the other process, an allocation past the card or past the fraction raises
torch.OutOfMemoryError naming the holder, and torch.npu.OutOfMemoryError is torch's."""
import pickle

import pytest

torch = pytest.importorskip("torch", reason="torch is optional: pip install torch --index-url "
                                            "https://download.pytorch.org/whl/cpu")
torch_npu = pytest.importorskip("torch_npu")

import runtime  # noqa: E402
from runtime import errors  # noqa: E402
from tests.card_holder import Holder  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def card0(tmp_path, monkeypatch):
    """Device 0 as a fresh 1 GiB card of this test's own card directory."""
    if 0 in runtime.context.contexts_by_device:
        runtime.reset_device(0)
    monkeypatch.setenv("NPUSIM_CARD_DIR", str(tmp_path / "cards"))
    monkeypatch.setenv("NPUSIM_HBM_BYTES", str(GiB))
    torch.npu.set_device(0)
    yield 0
    runtime.reset_device(0)


@pytest.mark.timeout(120)
def test_torch_sees_the_other_process_and_its_oom_is_torchs(card0):
    with Holder(0, 700) as first:
        free, total = torch.npu.mem_get_info(0)
        assert (free, total) == (GiB - 700 * MiB, GiB)
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(500 * MiB, dtype=torch.uint8, device="npu")
        e = ei.value
        assert isinstance(e, errors.OutOfMemoryError) and e.code == 207001
        assert f"pid {first.pid} of job local: 700.00 MiB" in str(e)
        from accelerate.utils.memory import should_reduce_batch_size
        assert should_reduce_batch_size(e)           # accelerate's batch-size finder sees it
        again = pickle.loads(pickle.dumps(e))        # crosses processes (error files) intact
        assert isinstance(again, torch.OutOfMemoryError) and again.holders == e.holders
        x = torch.empty(300 * MiB, dtype=torch.uint8, device="npu")
        assert torch.npu.mem_get_info(0)[0] == GiB - 1000 * MiB
        del x
        first.release()
    torch.npu.empty_cache()
    assert torch.npu.mem_get_info(0)[0] == GiB


@pytest.mark.timeout(120)
def test_a_torch_holder_is_seen_by_a_runtime_process(card0):
    with Holder(1, 256, torch=True) as first:
        [h] = runtime.card.survey(1)
        assert (h.pid, h.reserved) == (first.pid, 256 * MiB)
        first.release()


@pytest.mark.timeout(60)
def test_the_fraction_refuses_with_torchs_error(card0):
    torch.npu.set_per_process_memory_fraction(0.1)
    try:
        with pytest.raises(torch.OutOfMemoryError, match="limit 102.40 MiB"):
            torch.empty(150 * MiB, dtype=torch.uint8, device="npu")
        y = torch.empty(50 * MiB, dtype=torch.uint8, device="npu")
        del y
    finally:
        torch.npu.set_per_process_memory_fraction(1.0)


def test_torch_npu_out_of_memory_error_is_torchs():
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError
