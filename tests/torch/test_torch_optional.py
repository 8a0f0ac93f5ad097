"""torch is optional: without it, importing hccl.torch_backend says how to install it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(60)
def test_import_without_torch_says_how_to_install_it():
    code = ("import sys; sys.modules['torch'] = None\n"        # as if torch were not installed
            "try:\n    import hccl.torch_backend\nexcept ImportError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=50)
    assert res.returncode == 0, res.stderr
    assert "ERR hccl.torch_backend needs torch" in res.stdout
    assert "pip install -e '.[torch]'" in res.stdout
