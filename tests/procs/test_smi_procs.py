"""``npusim-smi info`` (launcher/smi.py) while another process holds memory: its pid, MiB, job
and rank on its device; nothing once it has gone; the console script is declared."""
import os
import subprocess
import sys

import pytest

from tests.card_holder import ROOT, Holder

MiB = 1 << 20


def _smi(*args, env=None) -> str:
    out = subprocess.run([sys.executable, "-m", "launcher.smi", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(120)
def test_smi_info_shows_the_holder_on_its_device(tmp_path):
    env = dict(os.environ, NPUSIM_CARD_DIR=str(tmp_path / "cards"), NPUSIM_HBM_BYTES=str(1 << 30))
    with Holder(1, 300, env=dict(env, NPUSIM_JOB_ID="jobB", RANK="5")) as h:
        text = _smi("info", env=env)
        rows = [line for line in text.splitlines() if f" {h.pid} " in line]
        assert len(rows) == 1, text
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        assert cells[0].split() == ["1", "0", "0"]            # NPU 1, chip 0, node 0
        assert cells[1:] == [str(h.pid), "python", "300", "jobB / rank 5"], cells
        assert "No running processes found in NPU 0" in text
        usage = [line for line in text.splitlines() if "0000:01:00.0" in line]
        assert "300 / 1024" in usage[0], usage
        listed = _smi("info", "-l", env=env)
        blocks = listed.split("\tNPU ID")
        one = next(b for b in blocks if b.startswith("                         : 1\n"))
        assert "HBM Usage(MB)                  : 300" in one
        assert "Process Count                  : 1" in one
        h.release()
    text = _smi("info", env=env)
    assert "No running processes found in NPU 1" in text
    assert "0 / 1024" in [line for line in text.splitlines() if "0000:01:00.0" in line][0]


def test_the_console_script_is_declared():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'npusim-smi = "launcher.smi:main"' in f.read()
