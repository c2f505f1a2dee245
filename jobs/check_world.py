"""Checks that the MPI world has the size the job asked for, and reports where the ranks run.

A launcher whose process-management interface does not match the MPI library does not fail:
`srun --mpi=pmi2` (or `none`) with Open MPI starts N separate worlds of one rank each, and every
one of them runs the whole job on its own, exit code 0. This check turns that into a failed job.

Usage: python jobs/check_world.py [--expect-size N]   (or env BMLMPI_EXPECT_SIZE=N)
Exit status 2 when the size differs.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections import Counter

from mpi4py import MPI

PMI_HINT = (
    "under srun, --mpi must match the MPI library mpi4py uses (Open MPI: pmix; "
    "MPICH, Intel MPI: pmi2): set BMLMPI_SRUN_MPI, or launch with mpiexec "
    "(BMLMPI_LAUNCHER=mpiexec)"
)


def expected_size(arg: int | None) -> int | None:
    if arg is not None:
        return arg
    env = os.environ.get("BMLMPI_EXPECT_SIZE", "").strip()
    if not env:
        return None
    try:
        return int(env)
    except ValueError:
        raise SystemExit(f"check_world: BMLMPI_EXPECT_SIZE={env!r} is not an integer") from None


def mismatch_message(size: int, expected: int) -> str:
    msg = f"world size is {size}, expected {expected}"
    if size == 1 and expected > 1:
        msg += f" (the launcher started separate one-rank worlds; {PMI_HINT})"
    return msg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-size", type=int, default=None, metavar="N")
    args = parser.parse_args(argv)
    expected = expected_size(args.expect_size)

    comm = MPI.COMM_WORLD
    hosts = comm.gather(socket.gethostname(), root=0)
    if comm.rank == 0:
        per_host = ", ".join(f"{h}: {n}" for h, n in sorted(Counter(hosts).items()))
        library = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
        print(f"check_world: {comm.size} ranks ({per_host}); {library}", flush=True)
    if expected is not None and comm.size != expected:
        if comm.rank == 0:
            print(f"check_world: error: {mismatch_message(comm.size, expected)}", file=sys.stderr,
                  flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
