"""The code passes the linter configured in pyproject.toml ([tool.ruff])."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff not installed (pip install -e '.[test]')")
def test_ruff_is_clean():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                          "bmlmpi", "kernels", "tests", "perf", "jobs"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
