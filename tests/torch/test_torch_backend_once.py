"""The "hccl" backend's collectives are written once (hccl/torch/ops.py): CPU tensors staged,
npu tensors on their own memory, the same bits for every collective; gather, scatter, bitwise
reductions and all_to_all now run on npu tensors without staging. The npu all_reduce's late
Works are deferred (work.py, ``Completer.defer``): completed by the group's next call, by
``is_completed()`` or through their future, without waking the completer thread."""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed: pip install torch "
                    "--index-url https://download.pytorch.org/whl/cpu (docs/torch.md)")
pytest.importorskip("torch_npu")

import launcher  # noqa: E402

import torch_once_cases  # noqa: E402


@pytest.mark.timeout(180)
def test_cpu_and_npu_tensors_give_the_same_bits_through_one_path():
    r0, r1 = launcher.spawn(torch_once_cases.every_collective, 2, timeout=150)
    for rank, r in enumerate((r0, r1)):
        assert r["cpu"] == r["npu"], rank
        assert r["staged npu"] == 4, r["staged npu"]     # the two all_to_alls' counts only
        res = r["cpu"]
        assert res["BAND"] == [3 & 8, 12 & 11, 255] and res["BOR"] == [3 | 8, 12 | 11, 255]
        assert res["BXOR"] == [3 ^ 8, 12 ^ 11, 0] and res["bool band"] == [False, True, False]
        assert res["scatter"] == [[10.0 * rank + 1] * 2] * 2
        assert res["a2a even"] == [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]][rank]
        assert res["a2a list"] == [[float(k * 10 + rank)] * (k + 1) for k in range(2)]
        # rank s sends s + 1 rows to every rank (its rows start at 100 s)
        rows = [[100.0 * s + 2 * i, 100.0 * s + 2 * i + 1] for s in range(2)
                for i in range((rank) * (s + 1), (rank + 1) * (s + 1))]
        assert res["a2a uneven"] == rows
    assert r1["cpu"]["reduce bxor"] == [1 ^ 2, 0] and r0["cpu"]["reduce bxor"] == [1, 6]
    assert len(r0["cpu"]["gather"]) == 2 and r1["cpu"]["gather"] == []
    assert r0["cpu"]["broadcast"] == r1["cpu"]["broadcast"]


@pytest.mark.timeout(180)
def test_late_npu_all_reduce_works_are_deferred_and_completed():
    r0, r1 = launcher.spawn(torch_once_cases.deferred_works, 2, timeout=150)
    assert r0["deferred"] == 1 and r0["queued"] == 0      # the thread was not woken
    assert not r0["finished_before_next"]
    for r in (r0, r1):
        assert r["finished_after_next"] and r["x"] == [6.0, 6.0]
        assert r["future"] == [12.0, 12.0] and r["completed"]
        assert r["polled"] and r["left"] == 0
        assert r["freed"]


@pytest.mark.timeout(30)
def test_a_completed_untouched_work_stands_for_the_same_tensors_next_call():
    import torch

    from hccl.torch.work import Completer, Work
    c = Completer("once")
    t = torch.ones(2)
    w = Work("allreduce", [t])
    assert c.finished(w) and w.is_success() and w.is_completed()
    assert c.again(w, t)
    assert not c.again(w, torch.ones(2))        # another tensor: a Work of its own
    w.get_future()                              # someone holds its futures: never again
    assert not c.again(w, t)
    c.close()
