"""A venv holding this checkout installed the way README command 1 installs it: ``pip install .``,
not editable. Tests run its programs from the repository root, where Python finds the source
folder ``bmlmpi/`` before site-packages, so a source tree that differs from the installed
package (a module mapped in only at install time) fails there.

Building it costs about a minute (the dependencies come from pip's cache), so it is made once
per source tree and kept under /tmp, keyed by a hash of what the wheel is built from; those of
other trees unused for an hour are removed (the two most recent stay). A lock file keeps
concurrent test sessions from building the same venv twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the wheel is built from (README.md is the long description).
SOURCES = ("bmlmpi", "kernels", "setup.cfg", "pyproject.toml", "README.md")
BASE = Path(os.environ.get("TMPDIR", "/tmp"))
PREFIX = "bmlmpi-installed-"
#: Venvs of other source trees are removed once unused this long, except the most recent few
#: (another test session may be using one).
STALE_S = 3600
KEEP_RECENT = 2
BUILD_TIMEOUT_S = 900


def _files() -> Iterator[Path]:
    for name in SOURCES:
        top = ROOT / name
        if top.is_file():
            yield top
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path


def source_key() -> str:
    """A hash of every file the wheel is built from (and of how bmlmpi/kernels is linked)."""
    digest = hashlib.sha256()
    for path in _files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes())
    link = ROOT / "bmlmpi" / "kernels"
    digest.update(os.readlink(link).encode() if link.is_symlink() else b"no link")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(keep: Path) -> None:
    others = sorted((p for p in BASE.glob(PREFIX + "*")
                     if p != keep and p.suffix != ".lock" and p.is_dir()),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP_RECENT:]:
        if time.time() - old.stat().st_mtime < STALE_S:
            continue
        with _locked(old.with_suffix(".lock"), blocking=False) as mine:
            if mine:
                shutil.rmtree(old, ignore_errors=True)


def _build(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # Built from a copy: pip builds in the source tree and would leave build/ behind in it.
    with tempfile.TemporaryDirectory(prefix="bmlmpi-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in SOURCES:
            origin = ROOT / name
            if origin.is_dir():
                shutil.copytree(origin, src / name, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(origin, src / name)
        res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                              "--disable-pip-version-check", str(src)],
                             capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr)[-3000:]
        raise RuntimeError(f"pip install . into {venv} failed:\n{tail}")
    (venv / "ready").write_text(source_key())


def installed_venv() -> Path:
    """The venv for the current source tree, built now if it is missing."""
    key = source_key()
    venv = BASE / f"{PREFIX}{key}"
    with _locked(BASE / f"{PREFIX}{key}.lock"):
        if not (venv / "ready").exists():
            _build(venv)
        os.utime(venv)
    _remove_stale(venv)
    return venv


def bare_env(**extra: str) -> dict[str, str]:
    """The environment of a new user's shell: no venv activated (PATH without any venv's bin
    folder, no VIRTUAL_ENV), none of bmlmpi's or MPI's variables from the test session."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BMLMPI_", "OMPI_", "PMIX_", "PRTE_", "SLURM_"))
           and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    if "OMPI_MCA_btl_sm_backing_directory" in os.environ:  # tests/conftest.py
        env["OMPI_MCA_btl_sm_backing_directory"] = os.environ["OMPI_MCA_btl_sm_backing_directory"]
    here = Path(sys.executable).parent
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":")
                           if p and Path(p) != here and not (Path(p) / "activate").exists())
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
