"""What one small call costs on bmlmpi's blocking path, against mpi4py's own call (run under
``bmlmpi-run``):

    bmlmpi-run -n 2 python perf/auto/percall.py --bytes 8 --calls 20000
    BMLMPI_BLOCKING=polled bmlmpi-run -n 2 python perf/auto/percall.py --bytes 8

For each collective (allreduce, reduce_scatter, allgather, reduce, bcast; float32 of
position- and rank-dependent values, as ``perf/auto/ranks.py``'s cases): a fresh ``auto``
signature's calls until every rank committed it, then three rows, interleaved in rounds of
``--calls`` / ``--rounds`` calls each: ``mpi4py`` (its blocking call on COMM_WORLD),
``native`` (bmlmpi's call with the algorithm named) and ``auto`` (the committed signature).
Each call is timed alone; a row's p10 and median are over all its calls, each the MAX over
ranks of that call's time. Then each row's calls counted by cProfile over ``--profile``
calls (every Python function and builtin called, per call; load does not change it). Every
row's result is checked against mpi4py's. Prints one table (rank 0) and, with ``--json``,
writes it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import Case  # noqa: E402  (the rank program's cases, one module beside this)

ROWS = ("mpi4py", "native", "auto")


def commit(ctx: bmlmpi.Communicator, case: Case, most: int = 1000) -> str:
    """Run the case's ``auto`` signature until every rank committed it; its choice."""
    call = case.call("auto")
    key = ctx.tuning.key(case.collective, case.total, np.dtype(np.float32), "sum", 0)
    for _ in range(most):
        call()
        chosen = ctx.tuning.tuner.committed(key)
        if chosen is not None:
            call()   # the next call opens the committed signature's fast-path entry
            return chosen
    raise SystemExit(f"{case.collective}: not committed after {most} calls")


def timed(case: Case, calls: int, rounds: int) -> dict[str, np.ndarray]:
    """Each row's per-call times (the MAX over ranks), the rows interleaved round by round."""
    fns = {r: case.call(r) for r in ROWS}
    per = max(1, calls // rounds)
    got = {r: np.empty(per * rounds) for r in ROWS}
    clock = time.perf_counter
    for k in range(rounds):
        for r, fn in fns.items():
            out = got[r]
            MPI.COMM_WORLD.Barrier()
            for i in range(k * per, (k + 1) * per):
                t0 = clock()
                fn()
                out[i] = clock() - t0
    for r in ROWS:
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, got[r], MPI.MAX)
    return got


def counted(case: Case, calls: int) -> dict[str, float]:
    """Each row's function calls per call (cProfile: Python functions and builtins, the
    row's own lambda left out)."""
    out = {}
    for r in ROWS:
        fn = case.call(r)
        fn()
        MPI.COMM_WORLD.Barrier()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        stats = pstats.Stats(prof)
        out[r] = (stats.total_calls - calls) / calls   # (less the lambda itself)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perf/auto/percall.py")
    ap.add_argument("--collectives", default="allreduce,reduce_scatter,allgather,reduce,bcast")
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", type=int, default=10000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(world, timeout=120)
    ctx.Allreduce(np.ones(1), np.empty(1))   # the job's first auto call takes the prices
    results = []
    for collective in args.collectives.split(","):
        case = Case(ctx, collective, args.bytes)
        chosen = commit(ctx, case)
        times = timed(case, args.calls, args.rounds)
        calls = counted(case, args.profile)
        exact = {}
        for r in ROWS:
            case.out[:] = 0
            case.call(r)()
            exact[r] = case.exact()
        results.append({
            "collective": collective, "bytes": case.total * 4, "auto": chosen,
            "p10_us": {r: float(np.percentile(t, 10) * 1e6) for r, t in times.items()},
            "median_us": {r: float(np.median(t) * 1e6) for r, t in times.items()},
            "calls_per_call": calls, "exact": exact})
    ctx.Free()
    if world.rank == 0:
        mode = os.environ.get("BMLMPI_BLOCKING", "watchdog")
        print(f"N = {world.size}, BMLMPI_BLOCKING={mode}, load {os.getloadavg()[0]:.2f}")
        print(f"{'collective':>14} {'B':>5} {'auto':>8} | " + " | ".join(
            f"{r:>6} p10 med calls" for r in ROWS))
        for e in results:
            print(f"{e['collective']:>14} {e['bytes']:>5} {e['auto']:>8} | " + " | ".join(
                f"{e['p10_us'][r]:6.2f} {e['median_us'][r]:6.2f} {e['calls_per_call'][r]:5.1f}"
                + ("" if e["exact"][r] else " NOT EXACT") for r in ROWS), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"ranks": world.size, "blocking": mode, "load": os.getloadavg(),
                 "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
