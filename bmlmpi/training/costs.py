"""The communication costs iBatch plans with: a startup time T_s and a time per byte, either from
the cost model (:func:`comm_cost`) or measured on the communicator itself (:func:`measured_cost`).

Model (``cost="model"``). T(bytes) = T_s + bytes · per_byte is fitted through the model's
predicted times of one allreduce of a single element and of the whole model (the largest bucket
any plan makes), for the algorithm the communicator would run at that size (``auto`` resolved as
bmlmpi resolves it), with the machine's :class:`~bmlmpi.model.Calibration`: the communicator's
own when it was calibrated (``algorithm="auto"``), else :func:`bmlmpi.calibrate.calibrate`
(cached on disk per host, MPI library and rank count; measured, collectively, the first time).

Measured (``cost="measured"``). Timed on the communicator itself, with whatever algorithm and
network it runs on, the two ways the plans use it: the whole model as one allreduce (``single``)
taking T_1, and one allreduce per array started back to back and then waited for (``layer``, n
calls in flight) taking T_n. iBatch's model charges T_s per bucket and per_byte per byte, so
T_s = (T_n − T_1)/(n − 1), the marginal cost of one more call in flight, and per_byte =
(T_1 − T_s)/bytes. Why marginal and not a lone one-element allreduce: bmlmpi progresses every
call in flight together, so the latency of one call hides behind the transfer of the others.
On the emulated BCube 3x3 at 100 Mbit/s (9 ranks on 2 cores) a lone one-element allreduce took
about 12 ms, while 22 calls in flight cost at most 18 ms more than one (perf/buckets/README.md):
a T_s of 12 ms made iBatch fuse the model into 2 buckets where one call per array was faster.
Each time is a median of ``reps`` calls, the slowest rank's (an allreduce ends when its slowest
rank does). Why a second way at all: the calibration cache is keyed by host, MPI library and
rank count, not by the network, so on the testbed (network namespaces on the same host) it may
hold another link rate's parameters, and a fresh calibration measures up to 16 MiB per
algorithm (minutes at 100 Mbit/s). The measurement costs 2·(reps + 1) model-sized exchanges
(about 2 s for 2.98 MB at 100 Mbit/s on BCube 2x2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI


def comm_cost(comm: Any, grads: Sequence[np.ndarray]) -> tuple[float, float]:
    """(startup seconds, seconds per byte) of one allreduce on ``comm`` (a bmlmpi
    Communicator), fitted over the sizes between one element and all of ``grads``."""
    from .. import selection
    from ..model import estimate

    size = comm.size
    if size == 1:
        return 0.0, 0.0
    calib = getattr(comm, "calibration", None)
    if calib is None:
        from ..calibrate import calibrate
        calib = calibrate(comm.comm, timeout=comm.timeout)
    itemsize = max(a.dtype.itemsize for a in grads)
    total = max(sum(a.nbytes for a in grads) // itemsize, 2)

    def seconds(count: int) -> float:
        algorithm = comm.algorithm
        if algorithm == "auto":
            algorithm = selection.choose(count, itemsize, size, calib, comm.shape)
        times = estimate([algorithm], count, itemsize, size, calib=calib, shape=comm.shape)
        if algorithm not in times:   # native without measured points: bml's model
            times = estimate(["bml"], count, itemsize, size, calib=calib, shape=comm.shape)
            return next(iter(times.values()))
        return times[algorithm]

    small, large = seconds(1), seconds(total)
    per_byte = max(large - small, 0.0) / ((total - 1) * itemsize)
    return max(small - itemsize * per_byte, 0.0), per_byte


MEASURED_REPS = 3


def _slowest_median(comm: Any, run: Any, reps: int, sync: tuple[np.ndarray, np.ndarray]) -> float:
    """Median over ``reps`` of ``run()``'s time on this rank; every run follows a one-element
    allreduce that lines the ranks up. Not yet the maximum over ranks (the caller agrees)."""
    times = []
    for _ in range(reps):
        comm.Allreduce(sync[0], sync[1], MPI.SUM)
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measured_cost(comm: Any, grads: Sequence[np.ndarray], *,
                  reps: int = MEASURED_REPS) -> tuple[float, float]:
    """(startup seconds, seconds per byte) measured on ``comm`` (a bmlmpi Communicator): one
    allreduce of the whole model and one per array, all in flight (module docstring).
    Collective: every rank calls it with the same ``grads`` shapes and dtypes. Each variant
    runs once untimed first (schedules compiled and arguments checked there)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if comm.size == 1:
        return 0.0, 0.0
    dtype = max((a.dtype for a in grads), key=lambda d: d.itemsize)
    total = sum(a.nbytes for a in grads)
    src = np.ones(max(total // dtype.itemsize, 1), dtype)
    whole = (src, np.empty_like(src))
    pieces = [(np.ones(a.size, a.dtype), np.empty(a.size, a.dtype)) for a in grads]

    def one() -> None:
        comm.Allreduce(whole[0], whole[1], MPI.SUM)   # the time does not depend on the op

    def each() -> None:
        requests = [comm.Iallreduce(src, dst, MPI.SUM) for src, dst in pieces]
        for r in requests:
            r.Wait()                                  # each Wait keeps the call's deadline

    sync = (np.zeros(1), np.zeros(1))
    one()
    each()
    local = np.array([_slowest_median(comm, one, reps, sync),
                      _slowest_median(comm, each, reps, sync)])
    slowest = np.empty_like(local)
    comm.Allreduce(local, slowest, MPI.MAX)
    t_one, t_each = (float(t) for t in slowest)
    n = len(grads)
    startup = max(t_each - t_one, 0.0) / (n - 1) if n > 1 else 0.0
    per_byte = max(t_one - startup, 0.0) / max(total, 1)
    return startup, per_byte


COSTS = ("model", "measured")

__all__ = ["COSTS", "comm_cost", "measured_cost"]
