"""A short interleaved comparison of blocking allreduces: mpi4py's ``comm.Allreduce`` against
bmlmpi's schedules, for before/after measurements of an executor change.

    bmlmpi-run -n 2 python perf/profile/compare.py --write perf/profile --tag after

Rows: ``mpi4py`` or any algorithm name (a ``bmlmpi.Communicator`` with it: ``native`` and
``auto`` time the drop-in, e.g. ``--rows mpi4py,auto,native --sizes 8``). Per size,
``--blocks`` blocks; in each block every row runs ``iterations`` timed calls after a
barrier (the calls back to back, as ``osu_allreduce`` does), rows in turn, so a burst of load
hits them alike. A row's number is the median over blocks of the block's mean per call, rank 0's
clock (every rank checks the result against the exact sum). Far shorter than
``python -m perf.baseline`` (no C loop, no calibration, one rank count), so it fits a quiet-lock
window; the load average before and after is recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi

ITERATIONS = {8 << 10: 5000, 64 << 10: 200, 1 << 20: 50, 4 << 20: 20, 64 << 20: 5}


def _iterations(nbytes: int) -> int:
    return next((n for size, n in sorted(ITERATIONS.items()) if nbytes <= size), 3)


def measure(comm: MPI.Comm, rows: list[str], sizes: list[int], blocks: int) -> dict:
    ctxs = {name: bmlmpi.Communicator(comm, algorithm=name) for name in rows if name != "mpi4py"}
    out: dict[str, dict[int, list[float]]] = {name: {} for name in rows}
    for nbytes in sizes:
        n = nbytes // 4
        send = ((np.arange(n) % 5) + comm.rank).astype(np.float32)
        recv = np.empty_like(send)
        want = comm.size * (np.arange(n) % 5).astype(np.float32) + sum(range(comm.size))
        calls = {name: (lambda s, r: comm.Allreduce(s, r, MPI.SUM)) if name == "mpi4py"
                 else ctxs[name].Allreduce for name in rows}
        for name in rows:  # first calls: plans, kernels, argument checks
            for _ in range(2):
                calls[name](send, recv)
            assert np.array_equal(recv, want), f"{name} {nbytes}: wrong result"
        its = _iterations(nbytes)
        for _ in range(blocks):
            for name in rows:
                call = calls[name]
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(its):
                    call(send, recv)
                out[name].setdefault(nbytes, []).append((time.perf_counter() - t) / its * 1e6)
                if not np.array_equal(recv, want):
                    raise AssertionError(f"{name} {nbytes}: wrong result")
    for ctx in ctxs.values():
        ctx.Free()
    return {name: {str(b): float(np.median(v)) for b, v in per.items()}
            for name, per in out.items()}


def markdown(res: dict) -> str:
    rows, sizes = res["rows"], res["sizes"]
    lines = [f"# Blocking allreduce, µs per call ({res['tag']}): median of {res['blocks']} "
             f"interleaved blocks, rank 0", "",
             f"{res['ranks']} ranks, {res['machine']}; {res['time']}; load average "
             f"{res['load_before']} before, {res['load_after']} after.", "",
             "| size | " + " | ".join(rows) + " | best of bml/ring ÷ mpi4py |",
             "|---:|" + "---:|" * (len(rows) + 1)]
    for b in sizes:
        t = {name: res["us"][name][str(b)] for name in rows}
        best = min((t[n] for n in ("bml", "ring") if n in t), default=None)
        ratio = f"{t['mpi4py'] / best:.2f}" if best and "mpi4py" in t else "–"
        label = (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10
                 else f"{b} B")
        lines.append(f"| {label} | " + " | ".join(f"{t[n]:.1f}" for n in rows)
                     + f" | {ratio} |")
    lines += ["", "The last column is mpi4py's time over the faster schedule's: ≥ 1 means the "
              "schedule is at least as fast as mpi4py's blocking call."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="mpi4py,bml,ring")
    p.add_argument("--sizes", default="65536,1048576,4194304,67108864")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--tag", default="now")
    p.add_argument("--write", help="directory for compare-TAG.json and compare-TAG.md")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows, sizes = args.rows.split(","), [int(s) for s in args.sizes.split(",")]
    us = measure(comm, rows, sizes, args.blocks)
    if comm.rank != 0:
        return 0
    res = {"tag": args.tag, "blocks": args.blocks, "ranks": comm.size, "rows": rows,
           "sizes": sizes, "us": us,
           "machine": f"{platform.node()}, {os.cpu_count()} CPUs, "
                      f"{MPI.Get_library_version().splitlines()[0]}",
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_before": load_before,
           "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    text = markdown(res)
    print(text)
    if args.write:
        out = Path(args.write)
        (out / f"compare-{args.tag}.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / f"compare-{args.tag}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
