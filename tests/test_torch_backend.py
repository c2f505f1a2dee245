"""The torch.distributed backend ``bmlmpi`` under real ranks, in the torch venv
(:mod:`torch_venv`: made once, skipped with the reason where torch cannot be installed).

One launch per N (2, 3, 4) of ``tests/frameworks/torch_ranks.py`` runs every check of the
backend: each collective against backend gloo on the same inputs (exact), async work objects
and their futures, refusals, a sub-group, DDP (against gloo, parameters identical on every
rank), the DDP hooks (fp16 against torch's fp16_compress_hook, bf16, the TDF filters with their
error feedback, the iBatch bucket plan), ZeRO and FSDP against plain DDP.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from torch_venv import python, torch_venv

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_TORCH_LAUNCH_TIMEOUT", "600"))


@pytest.fixture(scope="module")
def venv() -> Path:
    why = torch_venv()
    if why:
        pytest.skip(why)
    return python()


def launch(py: Path, n: int, args: list[str], *, ft: bool = False, timeout: float,
           env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(py), "-m", "bmlmpi.launch", *(["--ft"] if ft else []), "-n", str(n), str(py),
           *args]
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0",
            "BMLMPI_TIMEOUT": "120", **(env or {})}
    for name in ("BMLMPI_ALGORITHM", "BMLMPI_BCUBE", "BMLMPI_COMPRESSION",
                 "BMLMPI_FAULT_TOLERANT", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        if name not in (env or {}):
            full.pop(name, None)
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{n} ranks did not finish within {timeout} s (a hang):\n{out[-4000:]}")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_backend_against_gloo(venv, n):
    res = launch(venv, n, ["tests/frameworks/torch_ranks.py"], timeout=LAUNCH_TIMEOUT)
    out = res.stdout + res.stderr
    tail = out[-6000:]
    failed = [line for line in res.stdout.splitlines() if " FAIL" in line]
    assert not failed, "\n".join(failed[:40]) + "\n" + tail
    done = re.findall(r"TORCH-RANKS DONE (\d+) failed 0", res.stdout)
    assert len(done) == n, tail
    assert res.returncode == 0, tail
    checks = {line.split()[1] for line in res.stdout.splitlines() if line.startswith("CHECK ")}
    for name in ("ddp_equals_gloo", "fp16_hook_step1_gradient_matches_torch",
                 "tdf:0.002:0.5:0.5_error_feedback", "ibatch_hook_planned", "zero_equals_ddp",
                 "fsdp2_equals_ddp", "fsdp1_equals_ddp", "refused_band", "future_without_wait",
                 "reduce_scatter_list[4099,torch.int64]", "reduce[5,torch.float32,root1]"):
        assert name in checks, f"check {name} did not run\n{tail}"
    if n > 2:
        assert "subgroup_all_reduce" in checks
