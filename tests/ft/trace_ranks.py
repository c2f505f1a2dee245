"""Rank-side program of the flight-recorder tests: four broken jobs in one launch.

Started by ``tests/test_trace_launch.py`` as ``bmlmpi-run --ft -n 4 python
tests/ft/trace_ranks.py SPEC`` (``--ft`` so that the job outlives the killed rank). ``SPEC`` is
JSON: ``{"timeout": T, "dir": BASE}``. Each scenario runs on a fresh communicator whose
flight recorder dumps into ``BASE/<scenario>``, in this order:

``skip``      ring allreduces alternating SUM and MAX; rank 1 skips loop call 3, so its next
              call (SUM) meets the others' MAX: each signature's messages have tags of their
              own, so every rank waits in that call until its deadline.
``count``     rank 2 passes 999 elements instead of 1000 on loop call 2, after the signature's
              first call: rank 2 waits in the argument check, the others in the ring.
``stop``      rank 3 stops itself (SIGSTOP) before loop call 2; rank 0, once its call has
              raised, sends it SIGCONT; rank 3 then enters the call the others left and
              learns of the revocation (before or after its first step's transfers
              complete: both orderings happen, and bmlmpi-trace must name rank 3 in each).
``kill``      a fault-tolerant communicator; rank 2 is killed (SIGKILL) before loop call 2:
              the survivors notice, dump, recover and finish (``recovered_in``: seconds from
              the start of that call to the end of the last one).

Between scenarios the ranks meet in a barrier of ``MPI.COMM_WORLD``. Output, one JSON line
per rank and scenario, prefixed ``TRACE-JSON``: the exception the rank's call raised (type,
message, its notes), the seconds from the start of that call to the exception, and the
files in the scenario's folder.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft


def emit(**record) -> None:
    print("TRACE-JSON " + json.dumps(record), flush=True)


def scenario(name: str, base: Path, timeout: float, body, **kwargs) -> None:
    world = MPI.COMM_WORLD
    folder = base / name
    os.environ["BMLMPI_TRACE_DIR"] = str(folder)
    started = [time.monotonic()]
    record: dict = {"scenario": name, "rank": world.rank}
    try:
        body(started, timeout, **kwargs)
        record["raised"] = None
    except Exception as exc:  # noqa: BLE001 - the test checks what was raised
        record["raised"] = type(exc).__name__
        record["message"] = str(exc)[:600]
        record["notes"] = list(getattr(exc, "__notes__", []))
        record["seconds"] = time.monotonic() - started[0]
    emit(**record)


def skip(started: list[float], timeout: float) -> None:
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, algorithm="ring", timeout=timeout)
    a = np.arange(1000, dtype=np.float64) + world.rank
    b = np.empty_like(a)
    for op in (MPI.SUM, MPI.MAX):  # each signature's checked first call
        c.Allreduce(a, b, op)
    for i in range(6):
        if world.rank == 1 and i == 3:
            continue
        started[0] = time.monotonic()
        c.Allreduce(a, b, MPI.SUM if i % 2 == 0 else MPI.MAX)
    started[0] = time.monotonic()
    c.Allreduce(a[:500], b[:500])


def count(started: list[float], timeout: float) -> None:
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, algorithm="ring", timeout=timeout)
    a = np.arange(1000, dtype=np.float64) + world.rank
    b = np.empty_like(a)
    c.Allreduce(a, b)
    for i in range(4):
        n = 999 if (world.rank == 2 and i == 2) else 1000
        started[0] = time.monotonic()
        c.Allreduce(a[:n], b[:n])


def stop(started: list[float], timeout: float, pids: list[int]) -> None:
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, algorithm="ring", timeout=timeout)
    a = np.arange(1000, dtype=np.float64) + world.rank
    b = np.empty_like(a)
    c.Allreduce(a, b)
    try:
        for i in range(4):
            if world.rank == 3 and i == 2:
                os.kill(os.getpid(), signal.SIGSTOP)
            started[0] = time.monotonic()
            c.Allreduce(a, b)
    finally:
        if world.rank == 0:
            os.kill(pids[3], signal.SIGCONT)


def kill(started: list[float], timeout: float) -> None:
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, algorithm="ring", fault_tolerant=True, timeout=timeout,
                            hang_timeout=timeout / 2)
    a = np.arange(1000, dtype=np.float64) + world.rank
    b = np.empty_like(a)
    c.Allreduce(a, b)
    for i in range(4):
        if world.rank == 2 and i == 2:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        started[0] = time.monotonic()
        if i == 2:
            failed_call = started[0]
        c.Allreduce(a, b)
    # from the start of the call the killed rank never made to the end of the last call
    emit(scenario="kill", rank=world.rank, survivors=list(c.survivors),
         dumps=c.recorder.dumps, recovered_in=time.monotonic() - failed_call)


def main() -> int:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    base = Path(spec["dir"])
    timeout = float(spec["timeout"])
    world = MPI.COMM_WORLD
    pids = world.allgather(os.getpid())
    for name, body, kwargs in (("skip", skip, {}), ("count", count, {}),
                               ("stop", stop, {"pids": pids})):
        scenario(name, base, timeout, body, **kwargs)
        world.Barrier()
    scenario("kill", base, timeout, kill)
    ft.finish(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
