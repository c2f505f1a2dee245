"""Cost of fault tolerance on healthy calls: the plain and the fault-tolerant communicator
side by side (median of 200 calls, the slowest rank's), bml, float64.

    bmlmpi-run --ft -n 4 python perf/ft/overhead.py

The difference is the per-call agreement (``MPI_Comm_iagree``) that commits a call on every
survivor or on none.
"""

import statistics
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft

CALLS = 200


def median_call(comm: bmlmpi.Communicator, n: int) -> float:
    world = MPI.COMM_WORLD
    x, out = np.ones(n), np.empty(n)
    for _ in range(20):
        comm.Allreduce(x, out)
    times = []
    for _ in range(CALLS):
        world.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(x, out)
        times.append(time.perf_counter() - t0)
    return world.allreduce(statistics.median(times), op=MPI.MAX)


def main() -> None:
    world = MPI.COMM_WORLD
    for n in (1024, 65_536):
        plain = median_call(bmlmpi.Communicator(world, algorithm="bml"), n)
        tolerant = median_call(bmlmpi.Communicator(world, algorithm="bml",
                                                   fault_tolerant=True), n)
        if world.rank == 0:
            print(f"{n:7d} float64: plain {plain * 1e6:8.1f} us, fault-tolerant "
                  f"{tolerant * 1e6:8.1f} us, ratio {tolerant / plain:.2f}", flush=True)


if __name__ == "__main__":
    main()
    ft.finish(0)
