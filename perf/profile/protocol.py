"""What the two-step allreduce costs at N = 2 without bmlmpi: the floor under ring and BML.

    bmlmpi-run -n 2 python perf/profile/protocol.py 65536 1048576 4194304 67108864

Ring and BML on two ranks are one exchange of half the buffer (reduce-scatter) and one of the
other half (allgather). The same protocol written directly in mpi4py, beside mpi4py's blocking
``comm.Allreduce`` and bmlmpi's ring and bml, in interleaved blocks (median of block means,
rank 0), tells what is the protocol's and what is bmlmpi's own:

- ``two-step``: ``Irecv``/``Isend`` of half the buffer, ``Waitall``, one ``np.add`` writing
  input + received into the result, then the allgather exchange;
- ``two-step, Testall spin``: the same waits as a ``Testall`` loop that yields the core (how
  bmlmpi waits, since it needs a deadline);
- ``two-step, early/late``: the allgather's receive posted with the first step and the first
  send completed with the second;
- ``two-step, 2 MiB pieces``: the reduce-scatter's half in successive 2 MiB pieces through one
  scratch (what ring does at N = 2, ``ring_pipeline``);
- ``one exchange``: the whole buffer exchanged once and reduced locally (another algorithm;
  what Open MPI does at small sizes).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

comm = MPI.COMM_WORLD.Dup()
rank, peer = comm.rank, 1 - comm.rank
PIECE = 2 << 20


def _halves(n: int) -> tuple[slice, slice]:
    half = n // 2
    mine, other = slice(half, n), slice(0, half)
    return (mine, other) if rank == 0 else (other, mine)


def _spin(reqs: list[MPI.Request]) -> None:
    while not MPI.Request.Testall(reqs):
        os.sched_yield()


def two_step(send, out, scratch, wait=MPI.Request.Waitall) -> None:
    mine, other = _halves(send.size)
    h = send.size // 2
    wait([comm.Irecv(scratch[:h], peer, 1), comm.Isend(send[other], peer, 1)])
    np.add(send[mine], scratch[:h], out=out[mine])
    wait([comm.Irecv(out[other], peer, 2), comm.Isend(out[mine], peer, 2)])


def two_step_spin(send, out, scratch) -> None:
    two_step(send, out, scratch, _spin)


def early_late(send, out, scratch) -> None:
    mine, other = _halves(send.size)
    h = send.size // 2
    r2 = comm.Irecv(out[other], peer, 2)
    r1, s1 = comm.Irecv(scratch[:h], peer, 1), comm.Isend(send[other], peer, 1)
    r1.Wait()
    np.add(send[mine], scratch[:h], out=out[mine])
    MPI.Request.Waitall([r2, s1, comm.Isend(out[mine], peer, 2)])


def pieces(send, out, scratch) -> None:
    mine, other = _halves(send.size)
    h = send.size // 2
    k = max(1, h * send.itemsize // PIECE)
    cut_m = [mine.start + h * j // k for j in range(k + 1)]
    cut_o = [other.start + h * j // k for j in range(k + 1)]
    for j in range(k):
        a, b = cut_m[j], cut_m[j + 1]
        MPI.Request.Waitall([comm.Irecv(scratch[:b - a], peer, 10 + j),
                             comm.Isend(send[cut_o[j]:cut_o[j + 1]], peer, 10 + j)])
        np.add(send[a:b], scratch[:b - a], out=out[a:b])
    MPI.Request.Waitall([comm.Irecv(out[other], peer, 2), comm.Isend(out[mine], peer, 2)])


def one_exchange(send, out, scratch) -> None:
    MPI.Request.Waitall([comm.Irecv(scratch, peer, 3), comm.Isend(send, peer, 3)])
    np.add(send, scratch, out=out)


def main(sizes: list[int]) -> None:
    if comm.size != 2:
        raise SystemExit("run on exactly 2 ranks")
    ctxs = {name: bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=name) for name in ("bml", "ring")}
    for nbytes in sizes:
        n = nbytes // 4
        send = ((np.arange(n) % 5) + rank).astype(np.float32)
        out, scratch = np.empty_like(send), np.empty_like(send)
        want = 2 * (np.arange(n) % 5).astype(np.float32) + 1
        rows = {"mpi4py comm.Allreduce": lambda s, o, _: comm.Allreduce(s, o),
                "two-step": two_step, "two-step, Testall spin": two_step_spin,
                "two-step, early/late": early_late, "two-step, 2 MiB pieces": pieces,
                "one exchange": one_exchange,
                "bmlmpi ring": lambda s, o, _: ctxs["ring"].Allreduce(s, o),
                "bmlmpi bml": lambda s, o, _: ctxs["bml"].Allreduce(s, o)}
        its = (200 if nbytes < 1 << 20 else 50 if nbytes < 2 << 20 else
               20 if nbytes < 8 << 20 else 5)
        times: dict[str, list[float]] = {}
        for call in rows.values():  # plans, first calls
            call(send, out, scratch)
        for _ in range(7):
            for name, call in rows.items():
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(its):
                    call(send, out, scratch)
                times.setdefault(name, []).append((time.perf_counter() - t) / its * 1e6)
                if not np.array_equal(out, want):
                    raise AssertionError(f"{name} {nbytes}: wrong result")
        if rank == 0:
            print(f"{nbytes} B, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}: "
                  + "; ".join(f"{k} {np.median(v):.1f} µs" for k, v in times.items()))
    for ctx in ctxs.values():
        ctx.Free()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [65536, 1 << 20, 4 << 20])
