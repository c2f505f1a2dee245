"""Rank-side program of the compressed fault-tolerant allreduce tests (``compression=`` on
:class:`bmlmpi.ft.FaultTolerantCommunicator`).

Started by ``tests/test_ft_compression.py`` as ``bmlmpi-run --ft -n 3 python
tests/ft/compression_ranks.py SPEC`` (never collected by pytest: it needs ULFM and, for the
failure case, a rank that really dies). ``SPEC`` is JSON::

    {"timeout": 30, "hang_timeout": 10, "algorithm": "bml", "kill": null | {"call": 1,
     "rank": 2, "step": 1, "before": false}}

Every rank runs compressed calls (fp16, bf16, TDF and top-k on the dense and sparse paths) on
the fault-tolerant communicator and, beside it, the same calls with fresh compressors on a
plain :class:`bmlmpi.Communicator` over the same ranks: without failures the results must be
the same bits. With ``kill``, the rank dies (SIGKILL) when the compressed call ``call``'s Run posts
schedule step ``step`` (``before``: just before the call); every survivor must then raise
FaultToleranceError, with its recvbuf untouched and its compressor's memory as before the
call, and end through ``ft.finish``.

Output, one JSON line each, prefixed ``FTC-JSON``: every survivor's outcome per call.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, ft
from bmlmpi.compression import bf16, fp16, tdf, topk

CALLS = [("fp16", fp16, "auto"), ("bf16", bf16, "auto"),
         ("tdf-dense", lambda: tdf(0.3, 1.0, 0.5, "fp16"), "dense"),
         ("tdf-sparse", lambda: tdf(0.3, 1.0, 0.5, None), "sparse"),
         ("topk-sparse", lambda: topk(300), "sparse"),
         ("topk-wire", lambda: topk(ratio=0.25, wire="bf16"), "dense")]


def emit(**record) -> None:
    print("FTC-JSON " + json.dumps(record), flush=True)


def rank_input(n: int, rank: int, call: int) -> np.ndarray:
    i = np.arange(n)
    return (((i * 7 + rank * 3 + call) % 11 - 5) * 0.37 + 0.01 * rank).astype(np.float32)


class Killer(execute.RunObserver):
    armed: dict | None = None

    def post(self, run: execute.Run, lane: int) -> None:
        if self.armed is not None and run.posting_step(lane) >= self.armed["step"]:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    world = MPI.COMM_WORLD
    try:
        comm = bmlmpi.Communicator(world, algorithm=spec["algorithm"], fault_tolerant=True,
                                   timeout=spec["timeout"], hang_timeout=spec["hang_timeout"])
    except ft.FaultToleranceUnavailable as exc:
        emit(unavailable=str(exc), rank=world.rank)
        return 0
    plain = bmlmpi.Communicator(world, algorithm=spec["algorithm"], timeout=spec["timeout"])
    me = comm.rank
    killer = Killer()
    kill = spec.get("kill")
    n = 3001
    with execute.observing(killer):
        for call, (name, make, path) in enumerate(CALLS):
            c = make()
            c.path = path
            x = rank_input(n, me, call)
            # one result buffer for both communicators: a direct call's error-feedback key is
            # its address (the same key, the same G-RP draw)
            out = np.full(n, -7.0, np.float32)
            if kill is None:
                ref = make()
                ref.path = path
                plain.Allreduce(x, out, MPI.SUM, compression=ref)
                want = out.copy()
                out[:] = -7.0
            residuals_before = dict(c.residuals)
            if kill is not None and kill["call"] == call and kill["rank"] == me:
                if kill.get("before"):
                    os.kill(os.getpid(), signal.SIGKILL)
                killer.armed = kill
            try:
                comm.Allreduce(x, out, MPI.SUM, compression=c)
            except ft.FaultToleranceError as exc:
                emit(rank=me, call=call, name=name, error="FaultToleranceError",
                     message=str(exc)[:300], untouched=bool((out == -7.0).all()),
                     memory_kept=c.residuals.keys() == residuals_before.keys())
                ft.finish(0, timeout=5)
            except Exception as exc:   # anything else is a test failure, reported
                emit(rank=me, call=call, name=name, error=type(exc).__name__,
                     message=str(exc)[:300])
                ft.finish(1, timeout=5)
            record = {"rank": me, "call": call, "name": name, "path": sorted(c.calls)}
            if kill is None:
                record["same_as_plain"] = out.tobytes() == want.tobytes()
                everyone = world.allgather(out.tobytes())
                record["same_on_every_rank"] = all(e == everyone[0] for e in everyone)
            emit(**record)
    plain.Free()
    emit(rank=me, done=True)
    ft.finish(0)


if __name__ == "__main__":
    main()
