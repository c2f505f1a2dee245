"""Rank-side program of ``tests/test_trace_launch.py::test_trace_names_the_rank_that_skipped_a_
call_and_ended``: rank 1 skips one call and ends normally while the others wait for it.

Started as ``bmlmpi-run -n 4 python tests/ft/skip_end_ranks.py SPEC`` (``SPEC``: JSON
``{"timeout": T}``; ``BMLMPI_TRACE_DIR`` names the folder). Native allreduces alternating SUM and
MAX, each signature's first call checked: MPI matches rank 1's later calls with the others'
whatever their ops, so rank 1 makes its calls, one fewer than the others, and ends (its clean
end writes its recorder, then waits in ``MPI_Finalize``); the others wait in their last call
until the watchdog ends the job at the deadline (their recorders written first). Output, one
line per rank that finished its calls, prefixed ``SKIP-JSON``: the rank and its calls.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi


def main() -> int:
    spec = json.loads(sys.argv[1])
    world = MPI.COMM_WORLD
    comm = bmlmpi.Communicator(world, algorithm="native", timeout=float(spec["timeout"]))
    a = np.arange(1000, dtype=np.float64) + world.rank
    b = np.empty_like(a)
    for op in (MPI.SUM, MPI.MAX):  # each signature's checked first call: calls 1 and 2
        comm.Allreduce(a, b, op)
    for i in range(6):             # calls 3 to 8; rank 1 skips the fourth (call 6, MAX)
        if world.rank == 1 and i == 3:
            continue
        comm.Allreduce(a, b, MPI.SUM if i % 2 == 0 else MPI.MAX)
    print("SKIP-JSON " + json.dumps({"rank": world.rank, "calls": comm.recorder.next - 1}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
