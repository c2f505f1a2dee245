"""Rank program for the launcher's exit status (tests/test_launch_exit.py): ``MODE`` is one
of

* ``raise``  — the exit handlers installed, one fault-tolerant allreduce, then every rank
  raises;
* ``kill``   — rank 1 is killed (SIGKILL) after the first allreduce; the others run a second
  one over the survivors and end normally;
* ``grow``   — as ``kill``, then the survivors replace rank 1 (``replace_failed``), the
  replacement joins, all run one more allreduce over the full communicator and end with
  ``ft.finish()``;
* ``plain``  — a plain communicator, one allreduce, then every rank raises.

Each rank prints ``EXIT-JSON {...}`` with the results it checked."""

import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft

mode = sys.argv[1]
TIMEOUT = 60


def check(comm, members: int) -> None:
    """One allreduce of rank-dependent data, checked against the members' sum."""
    rank = getattr(comm, "original_rank", comm.rank)
    a = np.arange(16, dtype=np.int64) * (rank + 1)
    out = np.empty_like(a)
    comm.Allreduce(a, out)
    # after the call: a failure it survived is in ``failed`` now
    alive = set(range(getattr(comm, "original_size", comm.size))) - set(
        getattr(comm, "failed", ()))
    weights = sum(r + 1 for r in alive)
    assert comm.size == members and np.array_equal(out, np.arange(16) * weights), \
        (comm.size, members, sorted(alive), out)
    print("EXIT-JSON " + json.dumps({"rank": rank, "size": comm.size}), flush=True)


if mode == "plain":
    comm = bmlmpi.Communicator(MPI.COMM_WORLD, timeout=TIMEOUT)
    check(comm, comm.size)
    raise RuntimeError(f"rank {comm.rank} fails on purpose")

joined = ft.join(timeout=TIMEOUT) if mode == "grow" else None
if joined is not None:
    comm, _state = joined
    check(comm, comm.original_size)
    ft.finish(0)

ft.install_exit_handlers()
comm = bmlmpi.Communicator(MPI.COMM_WORLD, fault_tolerant=True, timeout=TIMEOUT,
                           hang_timeout=20)
check(comm, comm.size)
if mode == "raise":
    raise RuntimeError(f"rank {comm.rank} fails on purpose")
if comm.original_rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
check(comm, comm.original_size - 1)
if mode == "grow":
    comm.replace_failed({"next": 2})
    check(comm, comm.original_size)
ft.finish(0)
