"""How many calls an algorithm takes to settle after another algorithm's calls (run under
``bmlmpi-run -n N``): how many leading calls of each exploration block ``auto`` leaves
uncounted (docs/tuning.md, "Settling calls").

``python perf/auto/cold_calls.py COLLECTIVE BYTES [BYTES ...]`` (COLLECTIVE: allreduce,
reduce_scatter or allgather; float32, position- and rank-dependent values): for each size,
the candidates an empty cache's exploration times (bml, ring, shm, native; tree and
multitree too for the allreduce) and mpi4py's own blocking call, each checked against
mpi4py's result and warmed up with three calls; then ``--rounds`` (8) rounds in which each of
them in turn runs ``--calls`` (8) consecutive calls, so that each run of calls starts right
after another algorithm's, as an exploration block does. Every call is timed from a barrier,
the MAX over ranks. Rank 0 prints, per algorithm, the median over the rounds of the k-th
call of its run (k = 1 .. calls), its steady time (the median of the run's last three
calls' medians) and from which call on every median is within ``--within`` (10 %) of it.
``--checked`` adds each algorithm called with ``[buffer, MPI.FLOAT]`` specs (the checked
path on every call, as an exploring call runs) beside its plain calls (the fast path once
its signature is open).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import bmlmpi

NAMES = {"allreduce": ("bml", "ring", "tree", "multitree", "shm", "native"),
         "reduce_scatter": ("bml", "ring", "shm", "native"),
         "allgather": ("bml", "ring", "shm", "native")}


def calls(c: bmlmpi.Communicator, collective: str, nbytes: int, checked: bool
          ) -> tuple[dict[str, Callable[[], None]], Callable[[], bool]]:
    """Each row's call (the named algorithms, their checked forms where asked, mpi4py's) and
    a check of the last call's result against mpi4py's."""
    comm = MPI.COMM_WORLD
    per = max(1, nbytes // 4 // comm.size)
    total = per * comm.size
    send = ((np.arange(total) * 7 + comm.rank * 13) % 101).astype(np.float32)
    out = np.empty(per if collective == "reduce_scatter" else total, np.float32)
    ref = np.empty_like(out)
    mine = {"allreduce": c.Allreduce, "reduce_scatter": c.Reduce_scatter_block,
            "allgather": c.Allgather}[collective]
    theirs = {"allreduce": comm.Allreduce, "reduce_scatter": comm.Reduce_scatter_block,
              "allgather": comm.Allgather}[collective]
    src = send[:per] if collective == "allgather" else send
    theirs(src, ref)
    rows: dict[str, Callable[[], None]] = {}
    for name in NAMES[collective]:
        rows[name] = lambda name=name: mine(src, out, algorithm=name)
        if checked:
            rows[f"{name}/checked"] = lambda name=name: mine(
                [src, MPI.FLOAT], [out, MPI.FLOAT], algorithm=name)
    rows["mpi4py"] = lambda: theirs(src, out)
    return rows, lambda: bool(np.array_equal(out, ref))


def settled_from(medians: list[float], within: float) -> tuple[float, int]:
    """The steady time (median of the last three positions' medians) and the first call
    (1-based) from which every median is within ``within`` of it."""
    steady = statistics.median(medians[-3:])
    first = len(medians)
    while first > 1 and medians[first - 2] <= steady * (1 + within):
        first -= 1
    return steady, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perf/auto/cold_calls.py")
    ap.add_argument("collective", choices=sorted(NAMES))
    ap.add_argument("sizes", nargs="+", type=int, help="bytes of the work buffer")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--within", type=float, default=0.10)
    ap.add_argument("--checked", action="store_true")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    c = bmlmpi.Communicator(comm)

    def one(f: Callable[[], None]) -> float:
        comm.Barrier()
        t = time.perf_counter()
        f()
        return comm.allreduce(time.perf_counter() - t, op=MPI.MAX)

    for nbytes in args.sizes:
        rows, exact = calls(c, args.collective, nbytes, args.checked)
        for name, f in rows.items():
            f()
            if not exact():
                raise SystemExit(f"{name}: result differs from mpi4py's")
            for _ in range(3):
                f()
        runs: dict[str, list[list[float]]] = {n: [] for n in rows}
        for _ in range(args.rounds):
            for name, f in rows.items():
                runs[name].append([one(f) for _ in range(args.calls)])
        if comm.rank == 0:
            print(f"# {args.collective} {nbytes} B on {comm.size} ranks: median us of the "
                  f"k-th consecutive call after another algorithm's ({args.rounds} rounds)")
            for name, got in runs.items():
                medians = [statistics.median(r[k] for r in got) for k in range(args.calls)]
                steady, first = settled_from(medians, args.within)
                print(f"{name:>16} " + " ".join(f"{m * 1e6:8.0f}" for m in medians)
                      + f"   steady {steady * 1e6:8.0f}, first call / steady "
                        f"{medians[0] / steady:4.2f}, within {args.within:.0%} from call "
                        f"{first}", flush=True)
    c.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
