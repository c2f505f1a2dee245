"""Reproducible allreduce on real ranks: where one call's time goes, and the same-run
comparison with the non-reproducible calls.

Run under ``bmlmpi-run -n N`` (the driver, :mod:`perf.reproducible.compare`, does that for
each rank count). Two modes:

``--profile``: the stages of one reproducible call, each timed alone with the format's public
functions and the communicator's plain calls of the words (so their sum is what a call costs
without the pipeline's own overhead): the block exponents, their MAX (mpi4py's blocking
``Allreduce`` on a duplicate), the encode, the words' integer SUM by each algorithm (the
plain int64 allreduce, and its reduce-scatter half), the decode of the whole result and of
one rank's block, then the whole reproducible call and the plain call of the values.

``--compare`` (the default): rows taking turns in every block of every size: mpi4py's own
``comm.Allreduce`` of the values, bmlmpi's plain allreduce by each algorithm, and the
reproducible allreduce by each algorithm; each row's time is the median call of a block, then
the median over the blocks. Every reproducible row's result is checked bitwise equal to the
others' at each size (the mode's guarantee); a plain row's against mpi4py's within the
dtype's rounding.

Output: one JSON line per (dtype, size, row) prefixed ``REPRO-JSON``, printed by rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi.reproducible import format as rf

ALGORITHMS = ("bml", "ring", "tree", "multitree", "shm", "native")


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def values(n: int, dtype: str, rank: int) -> np.ndarray:
    """This rank's contribution: mixed magnitudes, position- and rank-dependent."""
    rng = np.random.default_rng(rank + 1)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype)


def timed(comm: MPI.Comm, fn, iters: int) -> float:
    """The median of ``iters`` calls of ``fn`` (after a barrier), the slowest rank's."""
    times = []
    for _ in range(iters):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return comm.allreduce(float(np.median(times)), MPI.MAX)


def iterations(nbytes: int, scale: int) -> int:
    """Calls per block: fewer for large arrays."""
    return max(2, min(50, (scale << 20) // max(nbytes, 1)))


def emit(comm: MPI.Comm, **row) -> None:
    if comm.rank == 0:
        print("REPRO-JSON " + json.dumps(row), flush=True)


def profile(comm: MPI.Comm, c, dtype: str, nbytes: int, algorithms, blocks: int,
            scale: int) -> None:
    n = nbytes // np.dtype(dtype).itemsize
    x = values(n, dtype, comm.rank)
    fmt = rf.format_for(x.dtype)
    agreed = np.empty((rf.blocks(n, fmt), 2), np.int16)
    mine = rf.block_exponents(x)
    comm.Allreduce(mine, agreed, MPI.MAX)
    words = rf.encode(x, agreed)
    flat = words.reshape(-1)
    out = np.empty_like(x)
    summed = np.empty_like(flat)
    counts = [(n // comm.size + (r < n % comm.size)) * fmt.words for r in range(comm.size)]
    block = np.empty(counts[comm.rank], np.int64)
    first = sum(counts[:comm.rank]) // fmt.words
    mine_out = np.empty(counts[comm.rank] // fmt.words, x.dtype)
    it = iterations(nbytes, scale)
    stages = {
        "exponents": lambda: rf.block_exponents(x),
        "exponents MAX": lambda: comm.Allreduce(mine, agreed, MPI.MAX),
        "encode": lambda: rf.encode(x, agreed, out=words),
        "decode": lambda: rf.decode(words, agreed, x.dtype, out=out),
        "decode one block": lambda: rf.decode(
            block.reshape(-1, fmt.words) if fmt.words > 1 else block, agreed, x.dtype,
            out=mine_out, start=first),
    }
    for name in algorithms:
        stages[f"words {name}"] = (lambda name=name: c.Allreduce(flat, summed,
                                                                  algorithm=name))
        if name in ("bml", "ring", "native", "shm"):
            stages[f"words reduce-scatter {name}"] = (
                lambda name=name: c.Reduce_scatter(flat, block, counts, algorithm=name))
        stages[f"reproducible {name}"] = (
            lambda name=name: c.Allreduce(x, out, algorithm=name, reproducible=True))
        stages[f"plain {name}"] = lambda name=name: c.Allreduce(x, out, algorithm=name)
    stages["mpi4py"] = lambda: comm.Allreduce(x, out, MPI.SUM)
    for fn in stages.values():
        fn()   # warm: plans, kernels, fast-path entries
    times: dict[str, list[float]] = {k: [] for k in stages}
    for _ in range(blocks):
        for name, fn in stages.items():
            times[name].append(timed(comm, fn, it))
    for name, ts in times.items():
        emit(comm, mode="profile", ranks=comm.size, dtype=dtype, bytes=nbytes, row=name,
             ms=float(np.median(ts)) * 1e3, blocks=[t * 1e3 for t in ts],
             load=os.getloadavg()[0])


def compare(comm: MPI.Comm, c, dtype: str, nbytes: int, algorithms, blocks: int,
            scale: int) -> None:
    n = nbytes // np.dtype(dtype).itemsize
    x = values(n, dtype, comm.rank)
    rows = {"mpi4py": lambda out: comm.Allreduce(x, out, MPI.SUM)}
    for name in algorithms:
        rows[f"plain {name}"] = lambda out, name=name: c.Allreduce(x, out, algorithm=name)
    for name in algorithms:
        rows[f"reproducible {name}"] = (
            lambda out, name=name: c.Allreduce(x, out, algorithm=name, reproducible=True))
    outs = {k: np.empty_like(x) for k in rows}
    for name, fn in rows.items():
        fn(outs[name])   # warm, and the results checked
    ref = outs["mpi4py"]
    tol = 64 * np.finfo(x.dtype).eps * comm.size * np.max(np.abs(ref))
    valid = {}
    repro = [outs[k] for k in rows if k.startswith("reproducible")]
    for name in rows:
        got = outs[name]
        if name.startswith("reproducible"):
            ok = got.tobytes() == repro[0].tobytes()
        else:
            ok = bool(np.max(np.abs(got - ref)) <= tol)
        valid[name] = comm.allreduce(ok, MPI.LAND)
    it = iterations(nbytes, scale)
    times: dict[str, list[float]] = {k: [] for k in rows}
    loads = []
    for _ in range(blocks):
        loads.append(os.getloadavg()[0])
        for name, fn in rows.items():
            out = outs[name]
            times[name].append(timed(comm, lambda fn=fn, out=out: fn(out), it))
    for name, ts in times.items():
        emit(comm, mode="compare", ranks=comm.size, dtype=dtype, bytes=nbytes, row=name,
             ms=float(np.median(ts)) * 1e3, low=min(ts) * 1e3, high=max(ts) * 1e3,
             iterations=it, blocks=blocks, valid=valid[name], load=max(loads))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M",
                        help="bytes of values per rank, comma separated")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--scale", type=int, default=64,
                        help="calls per block: this many MiB over the size (2 to 50)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    c = bmlmpi.Communicator(MPI.COMM_WORLD, "native", timeout=300)
    algorithms = [a for a in args.algorithms.split(",") if a != "shm" or comm.size > 1]
    run = profile if args.profile else compare
    for dtype in args.dtypes.split(","):
        for nbytes in (size(s) for s in args.sizes.split(",")):
            run(comm, c, dtype, nbytes, algorithms, args.blocks, args.scale)
    c.Free()
    comm.Free()


if __name__ == "__main__":
    main()
