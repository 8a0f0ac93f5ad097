"""ml_dtypes (0.75-0.9 s of CPU to import here) loads only when one of its dtypes is first used,
and ``import runtime`` pulls in neither numpy nor ml_dtypes (runtime/dtypes.py, #39)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.timeout(180)
def test_import_runtime_loads_neither_numpy_nor_ml_dtypes():
    assert _run("import sys, runtime, runtime.sched, runtime.config; "
                "print('numpy' in sys.modules, 'ml_dtypes' in sys.modules)") == "False False"


@pytest.mark.timeout(180)
def test_collectives_and_float32_buffers_never_import_ml_dtypes():
    code = ("import sys, numpy as np, runtime, hccl, hccl.comm, hccl.collectives, hccl.reduction\n"
            "from hccl.types import DataType\n"
            "runtime.set_device(0)\n"
            "a = runtime.to_device(np.ones(4, np.float32)); b = runtime.zeros(4, 'float16')\n"
            "assert DataType.of(a) is DataType.FP32 and DataType.of('fp16') is DataType.FP16\n"
            "x = np.ones(3, np.float16); hccl.reduction.reduce_into(x, x.copy(), 'SUM')\n"
            "print('ml_dtypes' in sys.modules)\n")
    assert _run(code) == "False"


@pytest.mark.timeout(180)
def test_first_bfloat16_name_imports_ml_dtypes():
    code = ("import sys, runtime\nfrom hccl.types import DataType\n"
            "assert DataType.of('bfloat16') is DataType.BFP16 and 'ml_dtypes' not in sys.modules\n"
            "runtime.set_device(0); a = runtime.zeros(4, 'bfloat16')\n"
            "import ml_dtypes\n"
            "print(a.dtype == ml_dtypes.bfloat16, DataType.BFP16.numpy == a.dtype)\n")
    assert _run(code) == "True True"


def test_dtype_objects_made_by_the_user_resolve_without_a_name():
    import ml_dtypes

    from hccl.reduction import WIDENED
    from hccl.types import DataType
    from runtime import as_dtype, dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert DataType.of(ml_dtypes.bfloat16) is DataType.BFP16
    assert DataType.of(np.zeros(2, bf16)) is DataType.BFP16
    assert bf16 in WIDENED and np.dtype(np.float16) in WIDENED
    assert np.dtype(np.float32) not in WIDENED
    assert as_dtype(bf16) == bf16 and as_dtype("float8_e4m3fn") == np.dtype(ml_dtypes.float8_e4m3fn)
    assert dtypes.is_extra(np.dtype(ml_dtypes.float8_e5m2)) and not dtypes.is_extra(np.dtype("V2"))


def test_bad_names_are_refused_naming_the_argument():
    from runtime import as_dtype, dtypes
    from runtime.errors import NpuError
    with pytest.raises(NpuError, match="dtype='bfloat17'"):
        as_dtype("bfloat17")
    with pytest.raises(KeyError, match="float8_e9m9"):
        dtypes.get("float8_e9m9")
