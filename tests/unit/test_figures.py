"""benchmarks.compare's medians and the figures page rendered from its JSON."""
from __future__ import annotations

import json

from benchmarks import compare, figures

GOT = {("npusim", 2, "all_reduce", 1 << 20): [(100.0, 2.0, 0)],
       ("ceiling", 2, "all_reduce", 1 << 20): [(50.0, 4.0, 0), (60.0, 5.0, 0), (40.0, 3.0, 0)],
       ("npusim", 2, "all_reduce", 1024): [(80.0, 0.0, 0), (120.0, 0.0, 0), (90.0, 0.0, 0)]}


def _run(**over) -> dict:
    systems = ["npusim", "ceiling"]
    run = {"command": "python -m benchmarks.compare --worlds 2", "commit": "abc123def456",
           "utc": "2026-12-02 04:00", "rounds": 3, "target_s": 0.2, "systems": systems,
           "machine": {"cpu": "Test CPU 9000", "cores": 2, "python": "3.11.7", "numpy": "2.0",
                       "empty_call_ns": 41.5, "numpy_add_GBps": 12.5, "load_average": 1.5,
                       "torch": "2.13.0+cpu"},
           "wrong": 0, "notes": ["mpi w2: mpirun not found"],
           "rows": compare.medians(GOT, [2], ["all_reduce"], [1024, 1 << 20], systems)}
    run.update(over)
    return json.loads(json.dumps(run))      # the page is rendered from JSON: same types


def test_medians_take_time_below_1_mib_and_busbw_from_1_mib():
    rows = _run()["rows"]
    assert rows == [{"world": 2, "coll": "all_reduce", "bytes": 1024, "unit": "us",
                     "npusim": 90.0, "ceiling": None},
                    {"world": 2, "coll": "all_reduce", "bytes": 1 << 20, "unit": "busbw GB/s",
                     "npusim": 2.0, "ceiling": 4.0}]


def test_table_puts_the_ceiling_beside_npusim_with_its_ratio():
    lines = figures.table(_run()).splitlines()
    assert lines[0] == "| world | collective | size | unit | npusim | ceiling | npusim / ceiling |"
    assert lines[2] == "| 2 | all_reduce | 1 KiB | us | 90.0 | — | — |"
    assert lines[3] == "| 2 | all_reduce | 1 MiB | busbw GB/s | 2.00 | 4.00 | 0.50x |"


def test_page_records_command_commit_machine_and_notes():
    page = figures.render(_run())
    assert "`python -m benchmarks.compare --worlds 2`" in page
    assert "`abc123def456`" in page and "Test CPU 9000, 2 cores" in page
    assert "an empty Python call 42 ns" in page and "torch 2.13.0+cpu" in page
    assert "- mpi w2: mpirun not found" in page
    assert "bash benchmarks/compare.sh" in page
    assert figures.table(_run()) in page
    assert "not measured" in figures.render(_run(machine=dict(_run()["machine"],
                                                               empty_call_ns=None)))


def test_figures_main_renders_a_saved_run(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run()))
    assert figures.main([str(path)]) == 0
    assert capsys.readouterr().out == figures.render(_run())
    assert figures.main([]) == 2


def test_other_benchmarks_sections_render_after_compares_table(tmp_path):
    docs = tmp_path
    (docs / "figures.json").write_text(json.dumps(_run()))
    figures.write_section("zz-demo", "A demo section", "python -m benchmarks.demo",
                          ["world", "us"], [[2, 12.5], [4, 30]], text="Why it matters.",
                          docs=str(docs))
    page = (docs / "figures.md").read_text()
    saved = json.loads((docs / "figures-zz-demo.json").read_text())
    assert saved["rows"] == [["2", "12.5"], ["4", "30"]]
    assert "## A demo section" in page and "`python -m benchmarks.demo`" in page
    assert "| world | us |" in page and "| 4 | 30 |" in page
    assert page.index("## A demo section") > page.index("Notes from the run")
