"""Every program starts under each name it has had: the console script, ``python -m
bmlmpi.cli.NAME``, and the earlier ``python -m bmlmpi.bench`` / ``python -m bmlmpi.calibrate``
that scripts written before the programs moved to ``bmlmpi.cli`` still use."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module,prog", [("bmlmpi.bench", "bmlmpi-bench"),
                                         ("bmlmpi.calibrate", "bmlmpi-calibrate"),
                                         ("bmlmpi.cli.bench", "bmlmpi-bench"),
                                         ("bmlmpi.cli.calibrate", "bmlmpi-calibrate")])
def test_module_names_start_the_program(module, prog):
    res = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {prog} "), res.stdout[:500]
    assert "RuntimeWarning" not in res.stderr, res.stderr
