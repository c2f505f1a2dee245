"""The venv the torch tests run in: torch 2.13, scikit-learn and this checkout (editable, with
its ``torch`` and ``train`` extras), made once and kept under /tmp, keyed by the checkout's
path and the hash of its packaging files (setup.cfg, pyproject.toml): a change to the
dependencies makes a new venv, a change to the code needs none (the install is editable).

``pip install -e '.[torch,train]'`` is also the test of the ``torch`` extra: its spec must
take the CPU build on this machine's disk (torch 2.13.0+cpu) and no other release. Where the
venv cannot be made (no package index, no wheel) :func:`torch_venv` returns why, and the tests
skip with that reason. ``BMLMPI_TORCH_VENV=PATH`` names a ready venv instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_VERSION = "2.13."


def venv_path() -> Path:
    given = os.environ.get("BMLMPI_TORCH_VENV")
    if given:
        return Path(given)
    h = hashlib.blake2b(str(ROOT).encode(), digest_size=8)
    for name in ("setup.cfg", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return Path(f"/tmp/bmlmpi-torch-venv-{h.hexdigest()}")


def python() -> Path:
    return venv_path() / "bin" / "python"


def _ready() -> str | None:
    """None when the venv imports torch 2.13 and this checkout's bmlmpi, else why not."""
    if not python().exists():
        return f"no venv at {venv_path()}"
    probe = ("import torch, sklearn, bmlmpi, bmlmpi.kernels; print(torch.__version__); "
             "print(bmlmpi.__file__)")
    res = subprocess.run([str(python()), "-c", probe], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    lines = res.stdout.split()
    if res.returncode != 0 or len(lines) < 2:
        return f"the venv at {venv_path()} does not import torch and bmlmpi: {res.stderr[-600:]}"
    if not lines[0].startswith(TORCH_VERSION):
        return f"the venv at {venv_path()} has torch {lines[0]}, not {TORCH_VERSION}x"
    if not lines[1].startswith(str(ROOT)):
        return f"the venv at {venv_path()} imports bmlmpi from {lines[1]}, not {ROOT}"
    return None


def torch_venv() -> str | None:
    """Make the venv if it is missing (once: a lock keeps concurrent tests from racing);
    None when it is ready, else the reason the torch tests skip."""
    path = venv_path()
    lock = Path(f"{path}.lock")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if _ready() is None:
            return None
        if os.environ.get("BMLMPI_TORCH_VENV"):
            return _ready()
        try:
            if not python().exists():
                subprocess.run([sys.executable, "-m", "venv", str(path)], check=True,
                               timeout=300, capture_output=True)
            subprocess.run([str(python()), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", "-e", f"{ROOT}[torch,train,test]"],
                           check=True, timeout=1500, capture_output=True, text=True, cwd=ROOT)
        except subprocess.CalledProcessError as exc:
            return (f"could not install torch into {path} (pip install -e '.[torch,train]'): "
                    f"{(exc.stderr or '')[-800:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not make the torch venv at {path}: {exc}"
        return _ready()
