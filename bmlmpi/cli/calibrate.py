"""``bmlmpi-calibrate`` (``python -m bmlmpi.cli.calibrate``): measure (or read) the cost-model
calibration of the ranks it runs on and print it, with the predicted time of every algorithm
``auto`` considers and its choice per size. Run it under the launcher, e.g.
``bmlmpi-run -n 4 bmlmpi-calibrate --fresh``. With ``--tune`` it fills the tuning table
instead (:mod:`bmlmpi.cli.tune`): ``bmlmpi-run -n 4 bmlmpi-calibrate --tune --sizes 8,1M
--collectives allreduce,bcast``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import selection
from ..api import Communicator
from ..calibrate import calibrate
from . import tune


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:12.1f}"


def main(argv: Sequence[str] | None = None,
         printer: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(prog="bmlmpi-calibrate",
                                 description="Measure (or read) the cost-model calibration "
                                             "and print what auto picks per size, with the "
                                             "predicted time of every algorithm it considers.")
    ap.add_argument("--fresh", action="store_true", help="ignore the cache and re-measure")
    ap.add_argument("--algorithms", default=None,
                    help="comma-separated algorithms to show, among those auto can run "
                         "(default: every candidate auto prices on these ranks; one it does "
                         "not price at a size shows -)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--itemsize", type=int, default=4)
    ap.add_argument("--tune", action="store_true",
                    help="fill the tuning table instead: time auto's candidates on each "
                         "collective and size through auto's own calls, commit, and merge the "
                         "choices into the table (BMLMPI_TUNING, else beside the cache); "
                         "signatures it holds already are measured again")
    ap.add_argument("--sizes", default=None,
                    help="with --tune: sizes of the work buffer, e.g. 8,64K,16M (default: 8 B "
                         "to 64 MiB, every fourth power of two)")
    ap.add_argument("--collectives", default="all",
                    help="with --tune: comma-separated among allreduce, reduce_scatter, "
                         "allgather, reduce, bcast, or all (the default)")
    ap.add_argument("--dtype", default="float32",
                    help="with --tune: the element type of the calls (default float32; the "
                         "table keys reducing collectives by dtype and op: SUM)")
    args = ap.parse_args(argv)
    if args.tune:
        try:
            sizes = (list(tune.DEFAULT_SIZES) if args.sizes is None
                     else tune.parse_sizes(args.sizes))
            collectives = tune.parse_collectives(args.collectives)
            dtype = np.dtype(args.dtype)
        except (ValueError, TypeError) as exc:
            ap.error(str(exc))
        return tune.tune(MPI.COMM_WORLD, collectives, sizes, dtype, printer)
    runnable = selection.algorithms()[1:]  # every allreduce algorithm but auto
    if args.algorithms is not None:
        asked = [a.strip().lower() for a in args.algorithms.split(",") if a.strip()]
        bad = [a for a in asked if a not in runnable]
        if bad:
            ap.error(f"not algorithms auto can run: {', '.join(bad)} (choose among "
                     f"{', '.join(runnable)})")
    comm = MPI.COMM_WORLD
    start = time.perf_counter()
    calib = calibrate(comm, use_cache=not args.fresh)
    took = time.perf_counter() - start
    # which ranks share a node and the topology's shape, as a Communicator on these ranks
    # sees them: auto prices shm and hierarchical with them (collective; no calibration of
    # its own for a named algorithm)
    ctx = Communicator(comm, algorithm="native")
    shape = ctx.shape
    try:
        nodes = ctx.nodes()
    except ValueError:
        nodes = None
    ctx.Free()
    if comm.Get_rank() != 0:
        return 0
    size = comm.Get_size()
    printer(f"# calibration ({calib.meta.get('source')}, {took:.2f} s): ranks={size} "
            f"host={calib.meta.get('host')} mpi={calib.meta.get('mpi')}")
    printer(f"alpha={calib.alpha * 1e6:.2f} us  beta={calib.beta * 1e9:.4f} ns/B "
            f"({1 / calib.beta / 1e9 if calib.beta else math.inf:.2f} GB/s)  "
            f"step_overhead={calib.step_overhead * 1e6:.2f} us  "
            f"msg_overhead={calib.msg_overhead * 1e6:.2f} us  gamma={calib.gamma * 1e9:.4f} ns/B")
    if calib.has_shm:
        printer(f"shared memory: sync={calib.shm_sync * 1e6:.2f} us/step  "
                f"copy={calib.shm_copy * 1e9:.4f} ns/B  reduce={calib.shm_reduce * 1e9:.4f} "
                f"ns/B read")
    printer("native: " + ", ".join(f"{b} B {s * 1e6:.1f} us" for b, s in calib.native))
    if calib.corrections:
        printer("measured / model: " + ", ".join(f"{a} {b} B {f:.2f}"
                                                  for a, b, f in calib.corrections))
    for coll in dict.fromkeys(c for c, _, _, _ in calib.family_corrections):
        printer(f"{coll} measured / model: " + ", ".join(
            f"{a} {b} B {f:.2f}" for c, a, b, f in calib.family_corrections if c == coll))
    if "phases" in calib.meta:
        printer("phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in calib.meta["phases"].items()))
    if size == 1:
        printer("one rank: auto runs native at every size (MPI_Allreduce on one rank is a "
                "copy, through the blocking fast path); nothing to price")
        return 0
    # each size's row: the candidates auto prices there and their predicted times (the
    # model with the calibration and its measured correction; native measured), exactly
    # what Communicator.explain gives on these ranks
    rows = []
    nbytes = args.itemsize
    while nbytes <= args.max_bytes:
        why = selection.explain(nbytes // args.itemsize, args.itemsize, size, calib, shape,
                                nodes)
        rows.append((nbytes, {c.name: c.predicted for c in why.candidates}, why.chosen))
        nbytes *= 4
    seen = {n for _, times, _ in rows for n in times}
    priced = [n for n in runnable if n in seen]
    names = priced if args.algorithms is None else [a for a in asked if a in priced]
    printer(f"{'bytes':>10} " + " ".join(f"{n:>12}" for n in names) + "  auto's choice   (us)")
    for nbytes, times, choice in rows:
        printer(f"{nbytes:>10} " + " ".join(_fmt(times[n]) if n in times else f"{'-':>12}"
                                            for n in names) + f"  {choice}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
