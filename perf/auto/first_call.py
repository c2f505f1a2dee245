"""A job's first collective call, as a new user's job makes it (``python -m perf.auto`` runs
it in fresh jobs, under ``bmlmpi-run``, with an empty calibration cache and tuning table):

    bmlmpi-run -n 2 python perf/auto/first_call.py mpi4py 1048576
    bmlmpi-run -n 2 python perf/auto/first_call.py bmlmpi 1048576

``mpi4py``: ``COMM_WORLD.Allreduce``; ``bmlmpi``: ``bmlmpi.Communicator(COMM_WORLD)`` built
and its first ``auto`` ``Allreduce`` (the prices taken after it: the cache and the table
read) — both timed from after one barrier (both libraries imported before it, bmlmpi's API
included, which loads lazily), the MAX over ranks.
Prints one line ``FIRST-CALL <json>`` (rank 0).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi


def main(argv: list[str]) -> int:
    mode, nbytes = argv[0], int(argv[1])
    world = MPI.COMM_WORLD
    x = np.ones(max(1, nbytes // 4), np.float32)
    y = np.empty_like(x)
    communicator = bmlmpi.Communicator   # the library imported (its API loads lazily)
    world.Barrier()
    t0 = time.perf_counter()
    if mode == "mpi4py":
        world.Allreduce(x, y)
    elif mode == "bmlmpi":
        c = communicator(world)
        c.Allreduce(x, y)
    else:
        raise SystemExit(f"mode is mpi4py or bmlmpi, got {mode!r}")
    took = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if mode == "bmlmpi":
        c.Free()
    if world.rank == 0:
        print("FIRST-CALL", json.dumps({"mode": mode, "bytes": x.nbytes, "seconds": took,
                                        "ranks": world.size}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
