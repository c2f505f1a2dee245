"""The communication costs iBatch plans with: a startup time T_s and a time per byte, from the
cost model (:func:`bmlmpi.model.estimate`) for the algorithm the communicator runs.

T(bytes) = T_s + bytes · per_byte is fitted through the model's predicted times of one
allreduce of a single element and of the whole model (the largest bucket any plan makes), for
the algorithm the communicator would run at that size (``auto`` resolved as bmlmpi resolves
it), with the machine's :class:`~bmlmpi.model.Calibration`: the communicator's own when it was
calibrated (``algorithm="auto"``), else :func:`bmlmpi.calibrate.calibrate` (cached on disk per
host, MPI library and rank count; measured, collectively, the first time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def comm_cost(comm: Any, grads: Sequence[np.ndarray]) -> tuple[float, float]:
    """(startup seconds, seconds per byte) of one allreduce on ``comm`` (a bmlmpi
    Communicator), fitted over the sizes between one element and all of ``grads``."""
    from .. import select
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
            algorithm = select.choose(count, itemsize, size, calib, comm.shape)
        times = estimate([algorithm], count, itemsize, size, calib=calib, shape=comm.shape)
        if algorithm not in times:   # native without measured points: bml's model
            times = estimate(["bml"], count, itemsize, size, calib=calib, shape=comm.shape)
            return next(iter(times.values()))
        return times[algorithm]

    small, large = seconds(1), seconds(total)
    per_byte = max(large - small, 0.0) / ((total - 1) * itemsize)
    return max(small - itemsize * per_byte, 0.0), per_byte


__all__ = ["comm_cost"]
