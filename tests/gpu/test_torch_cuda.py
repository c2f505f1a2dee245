"""The torch backend ``bmlmpi`` on CUDA tensors (tests/frameworks/torch_cuda_ranks.py) under
mpiexec, where torch sees a CUDA device and cupy is installed in this Python; skipped
otherwise. The two ranks share the device."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_mpi_launch import run_ranks  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)


def test_cuda_tensors_through_the_backend():
    res = run_ranks(2, ["tests/frameworks/torch_cuda_ranks.py"], timeout=600)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, tail
    assert res.stdout.count("CUDA-RANKS DONE failed 0") == 2, tail
    assert " FAIL" not in res.stdout, tail
