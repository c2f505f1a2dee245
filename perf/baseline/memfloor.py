"""The memory floor of an allreduce on one shared-memory node, measured with every rank at once.

    bmlmpi-run -n 2 python perf/baseline/memfloor.py --bytes 67108864 [--json out.json]

An allreduce of S bytes over N ranks of one node cannot move less than a reduce-scatter plus
an allgather in which each rank reads its peers' memory directly (single copy, no staging):

* reduce its 1/N slice: read the slice of every rank (its own and N−1 peers': S bytes),
  write the sum (S/N bytes) — an N-source add over S/N bytes;
* gather the other N−1 reduced slices: read (N−1)·S/N bytes from the peers, write as many
  into its receive buffer — a copy of (N−1)·S/N bytes.

Per rank: S + (N−1)·S/N bytes read, S bytes written (N = 2, S = 64 MiB: 96 MiB read,
64 MiB written). The floor is the time of that add plus that copy, measured here with numpy
(one thread per rank, as the ranks run) on all ranks at the same moment, so the ranks share
the memory bandwidth as they do in an allreduce: median of the repetitions, slowest rank.
Write-allocate traffic is not counted in the bandwidths printed (it is in the times).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI


def measure(comm: MPI.Comm, nbytes: int, reps: int) -> dict:
    size = comm.Get_size()
    slice_elems = max(nbytes // 4 // size, 1)
    gather_elems = slice_elems * (size - 1)
    sources = [np.full(slice_elems, float(i), dtype=np.float32) for i in range(size)]
    acc = np.empty(slice_elems, dtype=np.float32)
    src = np.ones(max(gather_elems, 1), dtype=np.float32)
    dst = np.empty_like(src)

    def add() -> None:
        np.add(sources[0], sources[1 % size], out=acc)
        for s in sources[2:]:
            np.add(acc, s, out=acc)

    def copy() -> None:
        np.copyto(dst, src)

    def timed(fn) -> float:
        fn()  # first touch
        out = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return float(np.median(out))

    mine = np.array([timed(add), timed(copy)])
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, MPI.MAX)
    t_add, t_copy = float(worst[0]), float(worst[1])
    add_read = size * slice_elems * 4  # N sources over the slice (the first add reads two)
    add_write = slice_elems * 4 * max(size - 1, 1)  # each pass writes the slice
    copy_bytes = gather_elems * 4
    return {
        "ranks": size, "bytes": nbytes, "reps": reps,
        "read_bytes_per_rank": nbytes + copy_bytes, "written_bytes_per_rank": nbytes,
        "add_seconds": t_add, "copy_seconds": t_copy,
        "add_GBps": (add_read + add_write) / t_add / 1e9 if t_add else 0.0,
        "copy_GBps": 2 * copy_bytes / t_copy / 1e9 if t_copy else 0.0,
        "floor_us": (t_add + t_copy) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", help="write the result here (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    res = measure(comm, args.bytes, args.reps)
    if comm.Get_rank() == 0:
        print(f"# memory floor, {res['ranks']} ranks at once, {res['bytes']} B allreduce: "
              f"read {res['read_bytes_per_rank']} B, write {res['written_bytes_per_rank']} B "
              f"per rank; add {res['add_seconds'] * 1e6:.0f} us ({res['add_GBps']:.2f} GB/s), "
              f"copy {res['copy_seconds'] * 1e6:.0f} us ({res['copy_GBps']:.2f} GB/s); "
              f"floor {res['floor_us']:.0f} us")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
