"""docs/coverage.md is current: rebuilt from the stored wheel and usage data
(benchmarks/npu_coverage_*.json, no download) and npusim's own names (issue 51)."""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_npu")

from benchmarks import npu_coverage as cov  # noqa: E402

FIX = "rebuild it: python -m benchmarks.npu_coverage page --write"


@pytest.fixture(scope="module")
def pages():
    with open(cov.PAGE_JSON, encoding="utf-8") as f:
        stored = json.load(f)
    text, now = cov.page()
    return stored, now, text


@pytest.mark.timeout(600)
def test_the_page_matches_npusims_names(pages):
    stored, now, _ = pages
    for key in ("torch_npu_version", "wheel", "used", "sources", "used_names"):
        assert stored[key] == now[key], f"docs/coverage.json's {key} is stale: {FIX}"
    for g in cov.GROUPS:
        old = {r["name"]: r for r in stored["groups"][g]}
        new = {r["name"]: r for r in now["groups"][g]}
        assert {n: r["npusim"] for n, r in old.items()} == \
            {n: r["npusim"] for n, r in new.items()}, f"group {g} is stale: {FIX}"
        # tests only grow: what the page calls tested still is (new tests may add names)
        assert {n for n, r in old.items() if r["tested"]} <= \
            {n for n, r in new.items() if r["tested"]}, f"group {g}: {FIX}"
        for k in ("names", "yes", "raises"):
            assert stored["counts"][g][k] == now["counts"][g][k]


def test_the_page_is_its_json(pages):
    stored, _, _ = pages
    with open(cov.PAGE, encoding="utf-8") as f:
        assert f.read() == cov._render(stored, sorted(stored["sources"])), FIX


def test_counts_and_the_used_names(pages):
    stored, now, _ = pages
    with open(cov.WHEEL_JSON, encoding="utf-8") as f:
        wheel = json.load(f)
    with open(cov.USAGE_JSON, encoding="utf-8") as f:
        usage = json.load(f)
    assert wheel["torch_npu_version"] == usage["torch_npu_version"] == "2.14.0"
    sizes = {g: len(n) for g, n in wheel["groups"].items()}
    assert sizes["torch.npu"] == 200 and sizes["npu_* operators"] == 119
    assert sizes["torch_npu.profiler"] == 14 and sizes["transfer_to_npu"] > 250
    assert {g: now["counts"][g]["names"] for g in cov.GROUPS} == sizes
    assert len(usage["sources"]) == 10
    u = now["used"]
    assert u["used"] == len(usage["names"]) >= 190
    assert u["present"] / u["used"] >= 0.90, \
        f"npusim has {u['present']} of the {u['used']} names real code uses"
    # every torch.npu.__all__ name works or says why not; the most used names all work
    assert all(r["npusim"] != "no" for r in now["groups"]["torch.npu"])
    top = [n for n, v in usage["names"].items() if len(v) >= 4]
    assert top and all(now["used_names"][n]["npusim"] == "yes" for n in top), \
        [n for n in top if now["used_names"][n]["npusim"] != "yes"]


def test_the_grep_for_tested():
    texts = ["x = torch.npu.get_rng_state_all()\nfrom torch_npu import npu_rms_norm\n"]
    assert cov.tested("torch.npu.get_rng_state_all", texts)
    assert cov.tested("torch.npu.random.get_rng_state_all", texts) is False
    assert cov.tested("torch_npu.npu_rms_norm", texts)
    assert not cov.tested("torch_npu.npu_swiglu", texts)
    texts = ["from torch_npu import profiler as tp\nx = tp.schedule(1)\n",
             "from torch_npu.distributed import is_hccl_available\n"]
    assert cov.tested("torch_npu.profiler.schedule", texts)
    assert cov.tested("torch_npu.distributed.is_hccl_available", texts)
    assert not cov.tested("torch_npu.profiler.HostSystem", texts)
    assert os.path.exists(cov.PAGE)
