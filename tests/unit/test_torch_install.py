"""Getting torch: the docs say where the CPU build comes from, and the torch job without torch
stops with one line naming the extra (this venv has no torch; the torch venv's tests run it)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_the_docs_say_how_to_get_the_cpu_build():
    for page in ("README.md", "docs/torch.md"):
        text = (ROOT / page).read_text()
        assert CPU_INDEX in " ".join(text.split()), page
        assert "CUDA build" in " ".join(text.split()), page


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed in this venv")
def test_the_torch_job_without_torch_says_which_extra_in_one_line():
    res = subprocess.run([sys.executable, "jobs/train_torch.py", "--epochs", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stdout == "", res
    assert res.stderr.splitlines() == [
        "train_torch: needs PyTorch, the torch extra: pip install '.[torch]' (the CPU build: "
        "see docs/torch.md)"], res.stderr
