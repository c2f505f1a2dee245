"""numba's compiled kernels are cached under the user's cache directory (BMLMPI_CACHE_DIR),
never beside the installed package: a file there that pip did not install survives an
uninstall and turns site-packages/bmlmpi into a namespace package shadowing the real one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from bmlmpi import kernels  # noqa: E402

PACKAGE = Path(kernels.__file__).resolve().parent

# Compiles (or loads) the one-thread float32 kernels and reports numba's cache statistics.
SCRIPT = """
import json, warnings
import numpy as np
warnings.simplefilter("error")   # the cache must work here: no fallback warning
from bmlmpi.kernels import numba_backend as nb
nb.warmup([np.float32], sources=(1,))
print(json.dumps({"file": nb.__file__, "stats": {
    name: [str(f.stats.cache_path), sum(f.stats.cache_hits.values()),
           sum(f.stats.cache_misses.values())]
    for name, f in (("pair", nb._pair_1), ("divide", nb._divide_1))}}))
"""


def _numba_files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in root.rglob("*") if p.suffix in (".nbi", ".nbc")}


def _run(cache: Path, script: str = SCRIPT) -> subprocess.CompletedProcess:
    env = {**os.environ, "BMLMPI_CACHE_DIR": str(cache), "BMLMPI_KERNEL_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd="/")


def test_kernels_cache_under_the_cache_dir_not_the_package(tmp_path):
    before = _numba_files(PACKAGE)
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    first = json.loads(res.stdout.splitlines()[-1])
    assert Path(first["file"]).resolve().parent == PACKAGE
    # nothing numba writes appeared or changed in the package
    assert _numba_files(PACKAGE) == before
    from bmlmpi.kernels.numba_cache import KernelCacheLocator

    folder = tmp_path / "numba" / KernelCacheLocator.get_suitable_cache_subpath(first["file"])
    written = {p.name for p in folder.iterdir()}
    for name in ("_pair_1", "_divide_1"):
        assert any(f.startswith(f"numba_backend.{name}-") and f.endswith(".nbi")
                   for f in written), written
        assert any(f.startswith(f"numba_backend.{name}-") and f.endswith(".nbc")
                   for f in written), written
    for path, _hits, _misses in first["stats"].values():
        assert Path(path) == folder
    # a second process loads every kernel from that cache instead of compiling it
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads(res.stdout.splitlines()[-1])
    for name, (_path, hits, misses) in again["stats"].items():
        assert hits >= 1 and misses == 0, (name, hits, misses)
    assert _numba_files(PACKAGE) == before


def test_unwritable_cache_dir_compiles_without_a_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    script = SCRIPT.replace('warnings.simplefilter("error")', 'warnings.simplefilter("always")')
    before = _numba_files(PACKAGE)
    res = _run(blocker / "cache", script)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "cannot write the kernel cache" in res.stderr
    assert "BMLMPI_CACHE_DIR" in res.stderr
    assert _numba_files(PACKAGE) == before


def test_two_copies_of_the_kernel_sources_share_one_cache_folder(tmp_path):
    """The README's two installs (site-packages, then the editable one) and a test's venv
    compile each kernel once between them: the cache folder is named after the sources, not
    after where they lie; a copy that differs in one byte gets a folder of its own."""
    import shutil

    from bmlmpi.kernels.numba_cache import KernelCacheLocator

    copies = [tmp_path / "one" / "kernels", tmp_path / "two" / "kernels"]
    for copy in copies:
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    name = KernelCacheLocator.get_suitable_cache_subpath
    here = name(str(PACKAGE / "numba_backend.py"))
    assert here.startswith("kernels_")
    assert {name(str(c / "numba_backend.py")) for c in copies} == {here}
    changed = tmp_path / "three" / "kernels"
    shutil.copytree(PACKAGE, changed, ignore=shutil.ignore_patterns("__pycache__"))
    limits = changed / "limits.py"
    limits.write_text(limits.read_text() + "\n")
    assert name(str(changed / "numba_backend.py")) != here
