"""Rank-side program of the compressed GradientBuckets fault-tolerance tests.

Started by ``tests/test_buckets_ft_compression.py`` as ``bmlmpi-run --ft -n 3 python
tests/ft/buckets_compression_ranks.py SPEC`` (needs ULFM; never collected by pytest). ``SPEC``
is JSON::

    {"algorithm": "bml", "compression": "tdf", "kill": false}

Every rank registers the same gradient arrays on a fault-tolerant communicator (op SUM,
threshold plan, small buckets) with a compressor, and beside them the same arrays on a plain
:class:`bmlmpi.Communicator` over the same ranks with a compressor of the same settings.
Without ``kill``: three iterations, and after each the fault-tolerant buckets must hold the
plain ones' results bit for bit (small-integer inputs: every path's sums are exact), on every
rank. With ``kill``: in iteration 1 every rank takes the back half's results, then the last
rank dies (SIGKILL); every survivor must raise FaultToleranceError from ``wait`` (the contract
of a compressed call on the fault-tolerant communicator), the front half holding its input,
(fp16) the back half the exact sums over all three ranks, and never a hang.

Output, one JSON line per rank, prefixed ``BUCKETS-FTC``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft
from bmlmpi.compression import fp16, tdf, topk

SHAPES = [(40,), (3, 7), (1,), (300,), (17,), (64,), (5, 5), (128,)]
COMPRESSORS = {"fp16": fp16,
               "tdf": lambda: tdf(4.5, 0.5, 0.5, "fp16"),
               "tdf-sparse": lambda: tdf(4.5, 0.5, 0.5, None),
               "topk-sparse": lambda: topk(ratio=0.25)}


def inputs(rank: int, it: int) -> list[np.ndarray]:
    return [(((np.arange(int(np.prod(s))) * 7 + rank * 3 + it * 5 + j) % 13) - 6.0
             ).astype(np.float32).reshape(s) for j, s in enumerate(SHAPES)]


def make(name: str):
    c = COMPRESSORS[name]()
    if name.endswith("-sparse"):
        c.path = "sparse"
    return c


def main() -> int:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    world = MPI.COMM_WORLD
    try:
        comm = bmlmpi.Communicator(world, algorithm=spec["algorithm"], fault_tolerant=True,
                                   timeout=60, hang_timeout=20)
    except ft.FaultToleranceUnavailable as exc:
        print("BUCKETS-FTC " + json.dumps({"rank": world.rank, "unavailable": str(exc)}),
              flush=True)
        return 0
    me, size = comm.original_rank, comm.original_size
    victim = size - 1 if spec.get("kill") else None
    grads = [np.zeros(s, np.float32) for s in SHAPES]
    comp = make(spec["compression"])
    buckets = bmlmpi.GradientBuckets(grads, comm=comm, op=MPI.SUM, plan="threshold",
                                     fusion_bytes=512, compression=comp)
    plain = None
    if victim is None:
        pcomm = bmlmpi.Communicator(world, algorithm=spec["algorithm"], timeout=60)
        pgrads = [np.zeros(s, np.float32) for s in SHAPES]
        plain = bmlmpi.GradientBuckets(pgrads, comm=pcomm, op=MPI.SUM, plan="threshold",
                                       fusion_bytes=512, compression=make(spec["compression"]))
    report: dict = {"rank": me, "buckets": buckets.buckets, "iterations": []}
    n = len(grads)
    # the death comes after the buckets from ``split`` on are reduced: a bucket start
    split = min((first for first, _ in buckets.buckets if first > 0),
                key=lambda f: abs(f - n // 2))
    exact_sums = not comp.filters      # fp16 alone: small-integer sums are exact
    try:
        for it in range(3):
            mine = inputs(me, it)
            if plain is not None:
                for i in reversed(range(n)):
                    np.copyto(pgrads[i], mine[i])
                    plain.mark_ready(i)
                plain.wait()
            whole = [sum(inputs(r, it)[j] for r in range(size)) for j in range(n)]
            for i in reversed(range(n)):
                np.copyto(grads[i], mine[i])
                buckets.mark_ready(i)
                if it == 1 and victim is not None and i == split:
                    for j in range(split, n):
                        buckets.wait(j)
                    if exact_sums:
                        report["back_half_exact"] = all(
                            np.array_equal(grads[j], whole[j]) for j in range(split, n))
                    if me == victim:
                        print(f"buckets_compression_ranks: rank {me} dies", file=sys.stderr,
                              flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)
            try:
                buckets.wait()
            except ft.FaultToleranceError as exc:
                report["error"] = "FaultToleranceError"
                report["message"] = str(exc)[:300]
                report["at_iteration"] = it
                # the buckets started after the death never completed: their arrays keep
                # this rank's input
                report["front_untouched"] = all(np.array_equal(grads[j], mine[j])
                                                for j in range(split))
                break
            record = {"it": it, "paths": sorted(comp.calls)}
            if exact_sums:
                record["exact"] = all(np.array_equal(g, w) for g, w in
                                      zip(grads, whole, strict=True))
            if plain is not None:
                record["same_as_plain"] = all(g.tobytes() == p.tobytes()
                                              for g, p in zip(grads, pgrads, strict=True))
                everyone = world.allgather(b"".join(g.tobytes() for g in grads))
                record["same_on_every_rank"] = all(e == everyone[0] for e in everyone)
            report["iterations"].append(record)
        if "error" not in report:
            buckets.close()
            if plain is not None:
                plain.close()
    except Exception as exc:   # anything else: reported, a test failure
        report["error"] = f"{type(exc).__name__}: {exc}"
    print("BUCKETS-FTC " + json.dumps(report), flush=True)
    ft.finish(0, timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
