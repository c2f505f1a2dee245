"""The rank program of ``python -m perf.auto`` (run under ``bmlmpi-run``): for each collective
and size, a fresh ``auto`` signature's first calls timed one by one (its exploration), then
``auto`` after its tuning calls against every algorithm named and mpi4py's own blocking call
on COMM_WORLD, interleaved in blocks (the rows in an order that changes from block to
block: :func:`orders`). Every row's result is checked against mpi4py's.

    bmlmpi-run -n 2 python perf/auto/ranks.py --collectives all --sizes 8,1M --json out.json

Each number is the MAX over ranks (a collective ends when its slowest rank does); a row's
time is the median of its block means. Writes one JSON document (rank 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi.cli.tune import parse_collectives, parse_sizes

SMALL = 64 << 10   # up to this many bytes a block is SMALL_ITERS calls, else LARGE_ITERS
SMALL_ITERS, LARGE_ITERS = 200, 10


class Case:
    """One collective at one size: float32 buffers of position- and rank-dependent values
    (sums exact), the call of each row, and mpi4py's result to check them against."""

    def __init__(self, ctx: bmlmpi.Communicator, collective: str, nbytes: int):
        world = MPI.COMM_WORLD
        rank, size = world.rank, world.size
        per = max(1, nbytes // 4 // size)
        self.total = total = per * size
        self.collective = collective
        self.x = ((np.arange(total) * 7 + rank * 13) % 101).astype(np.float32)
        self.out = np.zeros(per if collective == "reduce_scatter" else total, np.float32)
        ref = np.zeros_like(self.out)
        self.mine = {"allreduce": ctx.Allreduce, "reduce_scatter": ctx.Reduce_scatter_block,
                     "allgather": ctx.Allgather, "reduce": ctx.Reduce,
                     "bcast": ctx.Bcast}[collective]
        self.theirs = {"allreduce": world.Allreduce,
                       "reduce_scatter": world.Reduce_scatter_block,
                       "allgather": world.Allgather, "reduce": world.Reduce,
                       "bcast": world.Bcast}[collective]
        self.per = per
        if collective == "bcast":
            ref[:] = self.x   # the root's values, which every rank must end with
        else:
            self.theirs(*self.args(ref))
        self.ref = ref

    def args(self, out: np.ndarray) -> tuple:
        """mpi4py's positional arguments of the call (not a broadcast's)."""
        c = self.collective
        if c == "allgather":
            return (self.x[:self.per], out)
        if c == "reduce":
            return (self.x, out, MPI.SUM, 0)
        return (self.x, out)

    def call(self, row: str) -> Callable[[], None]:
        """The call a row times (``mpi4py``, ``auto``, or an algorithm named)."""
        if self.collective == "bcast":
            buf = self.out
            if MPI.COMM_WORLD.rank == 0:
                np.copyto(buf, self.ref)
            if row == "mpi4py":
                return lambda: self.theirs(buf, 0)
            if row == "auto":
                return lambda: self.mine(buf, root=0)
            return lambda: self.mine(buf, root=0, algorithm=row)
        args = self.args(self.out)
        if row == "mpi4py":
            return lambda: self.theirs(*args)
        if self.collective == "reduce":
            if row == "auto":
                return lambda: self.mine(args[0], args[1], MPI.SUM, 0)
            return lambda: self.mine(args[0], args[1], MPI.SUM, 0, algorithm=row)
        if row == "auto":
            return lambda: self.mine(*args)
        return lambda: self.mine(*args, algorithm=row)

    def exact(self) -> bool:
        if self.collective == "reduce" and MPI.COMM_WORLD.rank != 0:
            return True
        return bool(np.array_equal(self.out, self.ref))


def worst(values: list[float]) -> list[float]:
    """Each entry's MAX over the ranks."""
    mine = np.array(values, dtype=np.float64)
    out = np.empty_like(mine)
    MPI.COMM_WORLD.Allreduce(mine, out, MPI.MAX)
    return out.tolist()


def first_calls(ctx: bmlmpi.Communicator, case: Case, most: int) -> dict:
    """A fresh signature's first calls, one by one (no barrier between: a user's loop),
    until ten calls after its commit, at most ``most``."""
    call = case.call("auto")
    key = ctx.tuning.key(case.collective, case.total, np.dtype(np.float32), "sum", 0)
    times, after = [], None
    MPI.COMM_WORLD.Barrier()
    for i in range(most):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if after is None and ctx.tuning.tuner.committed(key) is not None:
            after = i + 1
        # every rank stops at the same call: the commit is agreed
        if after is not None and i + 1 >= after + 10:
            break
    return {"times": worst(times), "committed_after": after, "exact": case.exact()}


def orders(n: int) -> list[list[int]]:
    """The orders of ``n`` rows, block after block: a Williams design (a Latin square whose
    first order is 0, 1, n-1, 2, n-2, ... and each next one adds 1 mod n; for an odd ``n``
    the same ``n`` reversed after them). Over ``n`` blocks every row runs once in every
    position; over all of them (``n``, or ``2n`` for an odd ``n``) it runs once right after
    every other row (twice for an odd ``n``), so that no row always follows the same one."""
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    square = [[(r + i) % n for r in first] for i in range(n)]
    return square + ([order[::-1] for order in square] if n % 2 else [])


def blocks(case: Case, rows: list[str], nblocks: int, iters: int) -> dict[str, list[float]]:
    """Each row's block means, the rows interleaved block by block, block ``b`` in the
    order ``orders(len(rows))[b]`` (cyclically)."""
    calls = {r: case.call(r) for r in rows}
    for call in calls.values():   # warm-up: plans compiled, fast paths opened
        for _ in range(2):
            call()
    got: dict[str, list[float]] = {r: [] for r in rows}
    design = orders(len(rows))
    for b in range(nblocks):
        for r in (rows[i] for i in design[b % len(design)]):
            call = calls[r]
            MPI.COMM_WORLD.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            got[r].append((time.perf_counter() - t0) / iters)
    return {r: worst(v) for r, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perf/auto/ranks.py")
    ap.add_argument("--collectives", default="all")
    ap.add_argument("--sizes", default="8,64,1K,16K,64K,256K,1M,4M,16M,64M")
    # 0: one block per row, each row in every position once
    ap.add_argument("--blocks", type=int, default=0)
    # an exploration takes up to 294 calls (6 candidates, blocks of 16) and a runoff of two
    # 130 more, then ten more
    ap.add_argument("--first", type=int, default=450)
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    collectives, sizes = parse_collectives(args.collectives), parse_sizes(args.sizes)
    world = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(world, timeout=120)
    # the job's first auto call takes the prices (cache, table) and starts exploring afresh:
    # made here on a signature of its own, so that each signature below is a job's later one
    one = np.ones(1)
    ctx.Allreduce(one, np.empty(1))
    results = []
    for collective in collectives:
        for nbytes in sizes:
            started = time.perf_counter()
            case = Case(ctx, collective, nbytes)
            first = first_calls(ctx, case, args.first)
            why = ctx.explain(case.total, np.float32, collective=collective)
            rows = ["mpi4py", "auto"] + [a for a in bmlmpi.algorithms(collective)
                                         if a != "auto"]
            iters = SMALL_ITERS if case.total * 4 <= SMALL else LARGE_ITERS
            timed = blocks(case, rows, args.blocks or len(rows), iters)
            exact = {}
            for r in rows:
                case.out[:] = 0
                case.call(r)()
                exact[r] = case.exact()
            tuning = why.tuning
            results.append({
                "collective": collective, "bytes": case.total * 4, "iters": iters,
                "rows": {r: statistics.median(v) for r, v in timed.items()},
                # the case's wall time on rank 0 (exploration, rows, checks): what sizes a run
                "seconds": time.perf_counter() - started,
                "blocks": timed, "exact": exact, "first": first,
                "chosen": why.chosen, "why": why.rule,
                "candidates": [] if tuning is None else [
                    {"name": t.name, "predicted": t.predicted, "measured": t.measured,
                     "samples": t.samples} for t in tuning.candidates]})
            if world.rank == 0:
                best = min((v, r) for r, v in results[-1]["rows"].items() if r != "auto")
                print(f"{collective:>14} {case.total * 4:>9} B  auto {why.chosen:<10} "
                      f"{results[-1]['rows']['auto'] * 1e6:10.1f} us  best {best[1]:<10} "
                      f"{best[0] * 1e6:10.1f} us", flush=True)
    ctx.Free()
    if world.rank == 0:
        Path(args.json).write_text(json.dumps({"ranks": world.size, "results": results},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
