"""Rank-side program of ``tests/test_leftovers.py``: a job that goes well, with refused calls.

``bmlmpi-run -n N python tests/ft/leftover_ranks.py MODE``. Every rank prints the Open MPI
shared-memory segments it maps (``LEFTOVER-SEGMENTS``), then, by ``MODE``:

``clean``    allreduces that complete, a call that every rank refuses (an op bmlmpi does not
             take) and one that rank 0 refuses (a read-only ``recvbuf``: the others get
             ``RemoteArgumentError``), each caught; then more allreduces, and the end.
``kill``     (under ``--ft``) a fault-tolerant communicator; rank 1 is killed (SIGKILL) before
             its second call; the survivors recover and finish.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft
from bmlmpi.finalize import mapped_sm_segments


def main() -> int:
    mode = sys.argv[1]
    world = MPI.COMM_WORLD
    print("LEFTOVER-SEGMENTS", world.rank, *mapped_sm_segments(), flush=True)
    a = np.arange(1000, dtype=np.float64) * (world.rank + 1)
    b = np.empty_like(a)
    expected = np.arange(1000, dtype=np.float64) * (world.size * (world.size + 1) // 2)
    if mode == "kill":
        ft.install_exit_handlers()
        c = bmlmpi.Communicator(world, fault_tolerant=True, timeout=60, hang_timeout=30)
        c.Allreduce(a, b)
        if world.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        c.Allreduce(a, b)
        print("LEFTOVER-DONE", world.rank, flush=True)
        ft.finish(0)
    c = bmlmpi.Communicator(world, algorithm="ring", timeout=60)
    c.Allreduce(a, b)
    refused = []
    try:
        c.Allreduce(a, b, MPI.LAND)
    except ValueError as exc:
        refused.append(type(exc).__name__)
    out = np.empty_like(a)
    if world.rank == 0:
        out.flags.writeable = False
    try:
        c.Allreduce(a, out)
    except ValueError as exc:
        refused.append(type(exc).__name__)
    for _ in range(3):
        c.Allreduce(a, b)
    assert np.array_equal(b, expected)
    print("LEFTOVER-DONE", world.rank, *refused, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
