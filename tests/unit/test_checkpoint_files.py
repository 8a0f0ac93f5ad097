"""examples/checkpoint.py: atomic checkpoints, refused damaged ones, refused mismatched ones.

The kill test forks a writer and SIGKILLs it at a random byte or step of a checkpoint write
(``tests.faults.killing_os`` counts the helper's bytes written, fsyncs and renames), many times:
the previous checkpoint must always load, and the next save must clean up what the killed one
left.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import random
import re
import signal
import sys

import numpy as np
import pytest

from tests.faults.killing_os import KillingOs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# loaded from its file under its own name: examples/ is not a package, "checkpoint" is generic
_spec = importlib.util.spec_from_file_location("examples_checkpoint",
                                               os.path.join(ROOT, "examples", "checkpoint.py"))
checkpoint = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = checkpoint
_spec.loader.exec_module(checkpoint)

META = {"world_size": 2, "shapes": {"W1": [4, 3], "b1": [3]}}


def payload(step: int, n: int = 1000) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, params=np.arange(n, dtype=np.float64) * step, step=np.int64(step))
    return buf.getvalue()


def parse(data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def save(d, step, **kw):
    return checkpoint.save(str(d), step, payload(step, **kw), ".npz", META)


def test_save_then_latest_round_trips_and_keeps_three(tmp_path):
    for step in (10, 20, 30, 40):
        save(tmp_path, step)
    assert sorted(os.listdir(tmp_path)) == [f"step-000000{s}.{e}" for s in (20, 30, 40)
                                            for e in ("json", "npz")]
    found = checkpoint.latest(str(tmp_path), META, parse)
    assert found.step == 40 and found.path.endswith("step-00000040.npz")
    np.testing.assert_array_equal(found.state["params"], np.arange(1000.0) * 40)
    manifest = json.loads((tmp_path / "step-00000040.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(payload(40)).hexdigest()
    assert manifest["bytes"] == len(payload(40)) and manifest["world_size"] == 2


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path):
    assert checkpoint.latest(str(tmp_path / "none"), META, parse) is None
    assert checkpoint.latest(str(tmp_path), META, parse) is None


@pytest.mark.parametrize("damage, why", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), r"truncated: 100 of \d+ bytes"),
    (lambda p: p.write_bytes(p.read_bytes() + b"x"), r"longer than the \d+ bytes"),
    (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]),
     r"corrupt: its sha256 differs"),
    (lambda p: p.unlink(), r"missing \(its manifest exists\)"),
])
def test_damaged_newest_payload_is_refused_and_the_older_used(tmp_path, capsys, damage, why):
    save(tmp_path, 10)
    save(tmp_path, 20)
    damage(tmp_path / "step-00000020.npz")
    found = checkpoint.latest(str(tmp_path), META, parse)
    assert found.step == 10
    err = capsys.readouterr().err
    assert f"checkpoint {tmp_path / 'step-00000020.npz'} refused: " in err
    assert re.search(why, err), err


def test_corrupt_manifest_is_refused_naming_it(tmp_path, capsys):
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / "step-00000020.json").write_text("{not json")
    assert checkpoint.latest(str(tmp_path), META, parse).step == 10
    err = capsys.readouterr().err
    assert f"checkpoint {tmp_path / 'step-00000020.json'} refused: corrupt manifest" in err


def test_manifest_pointing_outside_the_directory_is_refused(tmp_path, capsys):
    save(tmp_path, 10)
    save(tmp_path, 20)
    m = json.loads((tmp_path / "step-00000020.json").read_text())
    m["payload"] = "../step-00000020.npz"
    (tmp_path / "step-00000020.json").write_text(json.dumps(m))
    assert checkpoint.latest(str(tmp_path), META, parse).step == 10
    assert "corrupt manifest" in capsys.readouterr().err


def test_payload_that_does_not_load_is_refused(tmp_path, capsys):
    """Intact bytes (sha256 matches) that the format rejects: e.g. an .npz that needs pickle."""
    buf = io.BytesIO()
    np.savez(buf, obj=np.array([{"a": 1}], dtype=object))
    checkpoint.save(str(tmp_path), 10, payload(10), ".npz", META)
    checkpoint.save(str(tmp_path), 20, buf.getvalue(), ".npz", META)
    assert checkpoint.latest(str(tmp_path), META, parse).step == 10
    assert "corrupt: does not load (ValueError" in capsys.readouterr().err


def test_every_checkpoint_damaged_means_none(tmp_path, capsys):
    save(tmp_path, 10)
    (tmp_path / "step-00000010.npz").write_bytes(b"")
    assert checkpoint.latest(str(tmp_path), META, parse) is None
    assert "truncated: 0 of" in capsys.readouterr().err


def test_other_world_size_is_refused_with_the_numbers(tmp_path):
    checkpoint.save(str(tmp_path), 10, payload(10), ".npz", {**META, "world_size": 4})
    with pytest.raises(checkpoint.CheckpointMismatch,
                       match=r"step-00000010.json was written by a job of 4 ranks, this job has 2"):
        checkpoint.latest(str(tmp_path), META, parse)


def test_other_model_shape_is_refused_with_the_numbers(tmp_path):
    checkpoint.save(str(tmp_path), 10, payload(10), ".npz",
                    {**META, "shapes": {"W1": [4, 5], "b1": [5]}})
    with pytest.raises(checkpoint.CheckpointMismatch,
                       match=r"parameter 'W1' has shape \[4, 5\] there and \[4, 3\] in this model"):
        checkpoint.latest(str(tmp_path), META, parse)


def test_mismatch_stops_even_with_an_older_matching_checkpoint(tmp_path):
    """Mismatch is not damage: no silent fallback to an older checkpoint."""
    save(tmp_path, 10)
    checkpoint.save(str(tmp_path), 20, payload(20), ".npz", {**META, "world_size": 3})
    with pytest.raises(checkpoint.CheckpointMismatch, match="3 ranks, this job has 2"):
        checkpoint.latest(str(tmp_path), META, parse)


def _write_killed_at(directory: str, step: int, budget: int) -> int:
    """Fork a writer of checkpoint ``step`` that is SIGKILLed after ``budget`` units."""
    pid = os.fork()
    if pid == 0:           # the child: write, die (or finish if the budget outlasts the write)
        try:
            checkpoint.os = KillingOs(budget)
            checkpoint.save(directory, step, payload(step, n=4000), ".npz", META)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.timeout(120)
def test_writer_killed_anywhere_in_a_write_leaves_the_previous_checkpoint(tmp_path):
    """~40 kills at random bytes and at every operation boundary of the write."""
    d = str(tmp_path)
    save(d, 10, n=4000)
    total = len(payload(20, n=4000)) + 2000     # more than the write: some writers finish
    rng = random.Random(28)
    budgets = sorted({0, 1, 2, 3, *range(total - 2100, total - 1900, 25),
                      *(rng.randrange(total) for _ in range(25))})
    killed = 0
    for budget in budgets:
        status = _write_killed_at(d, 20, budget)
        found = checkpoint.latest(d, META, parse)
        if os.WIFSIGNALED(status):
            killed += 1
            assert os.WTERMSIG(status) == signal.SIGKILL
            assert found is not None and found.step in (10, 20), (budget, os.listdir(d))
            want = found.step
        else:                # the writer finished: the new checkpoint is complete
            assert found.step == 20, budget
            want = 20
        np.testing.assert_array_equal(found.state["params"], np.arange(4000.0) * want)
        if want == 20:       # back to one good checkpoint for the next kill
            for name in os.listdir(d):
                if name.startswith("step-00000020"):
                    os.unlink(os.path.join(d, name))
    assert killed >= 30, (killed, len(budgets))
    save(d, 30, n=4000)      # the resumed job's next save removes what the killed ones left
    assert sorted(os.listdir(d)) == ["step-00000010.json", "step-00000010.npz",
                                     "step-00000030.json", "step-00000030.npz"]
