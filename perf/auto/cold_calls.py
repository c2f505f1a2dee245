"""Single calls taken in turn against consecutive calls, per algorithm (run under
``bmlmpi-run -n N``): why ``auto``'s exploration blocks from 1 MiB start with a call that is
not counted (docs/tuning.md, "A leading call from 1 MiB").

``python perf/auto/cold_calls.py BYTES {allgather,allreduce}``: each named algorithm (bml,
ring, shm, native) and mpi4py's own blocking call, after three warm-up calls each; then 15
rounds of one call of each in turn (each call after another algorithm's, as a block of one
call explores), then 3 rounds of 8 consecutive calls of each (the first of each 8 dropped).
Every call is timed from a barrier, the MAX over ranks; rank 0 prints each one's median of
both. Every algorithm's result is checked against mpi4py's once before timing.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

NAMES = ("bml", "ring", "shm", "native")


def main() -> int:
    comm = MPI.COMM_WORLD
    nbytes, collective = int(sys.argv[1]), sys.argv[2]
    c = bmlmpi.Communicator(comm)
    total = nbytes // 4
    if collective == "allgather":
        send = (np.arange(total // comm.size) % 251 + comm.rank).astype(np.float32)
        recv, ref = np.empty(total, np.float32), np.empty(total, np.float32)

        def call(name):
            c.Allgather(send, recv, algorithm=name)

        def theirs():
            comm.Allgather(send, ref)
    else:
        send = (np.arange(total) % 251 + comm.rank).astype(np.float32)
        recv, ref = np.empty_like(send), np.empty_like(send)

        def call(name):
            c.Allreduce(send, recv, algorithm=name)

        def theirs():
            comm.Allreduce(send, ref)
    theirs()
    for name in NAMES:
        call(name)
        if not np.array_equal(recv, ref):
            raise SystemExit(f"{name}: result differs from mpi4py's")
        for _ in range(3):
            call(name)

    def one(f) -> float:
        comm.Barrier()
        t = time.perf_counter()
        f()
        return comm.allreduce(time.perf_counter() - t, op=MPI.MAX)

    rows = {**{n: (lambda n=n: call(n)) for n in NAMES}, "mpi4py": theirs}
    in_turn = {n: [] for n in rows}
    for _ in range(15):
        for n, f in rows.items():
            in_turn[n].append(one(f))
    consecutive = {n: [] for n in rows}
    for _ in range(3):
        for n, f in rows.items():
            consecutive[n] += [one(f) for _ in range(8)][1:]
    if comm.rank == 0:
        print(f"# {collective} {nbytes} B on {comm.size} ranks: median us")
        for n in rows:
            print(f"{n:>8} single calls in turn {statistics.median(in_turn[n]) * 1e6:8.0f}"
                  f"   consecutive {statistics.median(consecutive[n]) * 1e6:8.0f}")
    c.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
