"""The blocking fast path's records (:meth:`bmlmpi.api.Communicator.Allreduce`): the
signatures that passed their first call (:class:`FastCall`) and the last one taken
(:class:`Repeat`), so later calls with numpy arrays of the same shapes skip the checked path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .execute import Plan
from .recorder import Signature


class FastCall:
    """A blocking signature that passed its first call (argument check included): later calls
    with numpy arrays of the same shapes, dtypes and op skip the checked path. Native
    (``plan`` None): ``MPI_Allreduce`` directly. A schedule: its :class:`~bmlmpi.execute.Run`
    built straight from the cached ``plan`` and driven in the calling thread.

    Holds no reference to the caller's arrays: numpy refuses ``ndarray.resize()`` in place
    on an array with any reference held elsewhere, weak ones included, and mpi4py leaves
    them resizable. The overlap check (``np.may_share_memory``: byte bounds, ~0.2 µs) runs
    on every call for that reason."""

    __slots__ = ("op", "what", "plan", "name", "calls", "sig", "key", "traced")

    def __init__(self, op: Any, what: str, plan: Plan | None = None, name: str = "",
                 sig: int = 0, key: tuple = (), traced: Signature | None = None):
        self.op = op          # the op object of the key (held, so its id is not reused)
        self.what = what      # native: the watchdog's description; schedule: the Run's label
        self.plan = plan
        self.name = name      # bmlmpi's op name (schedules)
        self.calls = 0        # schedules: calls that took this path
        self.sig = sig        # schedules: the signature's number (its tags, CallSequence.tag_base)
        self.key = key        # schedules: the plan's key (algorithm, count, dtype, op)
        self.traced = traced  # the flight recorder's signature of these calls

    @staticmethod
    def apart(send: np.ndarray, recv: np.ndarray) -> bool:
        return not np.may_share_memory(send, recv)


class Repeat:
    """The signature of the last blocking call that took the fast path: its entry, op,
    algorithm string, and the arrays' dtype objects and sizes (no reference to the arrays
    themselves, which must stay resizable). A later call with numpy arrays of the same dtype
    objects and sizes, the same op and algorithm, is the same signature: a dtype object is
    immutable (a reassigned ``.dtype``, another byte order: another object, so no match), and
    equal sizes of C-contiguous arrays of one itemsize span as many bytes (a reshaped array
    is the same allreduce; the flags and the overlap are checked on every call)."""

    __slots__ = ("entry", "op", "algorithm", "send_dtype", "recv_dtype", "send_size",
                 "recv_size")

    def __init__(self, entry: FastCall, op: Any, algorithm: str, send: Any,
                 recv: np.ndarray):
        self.entry = entry
        self.op = op
        self.algorithm = algorithm
        self.recv_dtype = recv.dtype
        self.recv_size = recv.size
        if send is MPI.IN_PLACE:
            self.send_dtype = None
            self.send_size = -1
        else:
            self.send_dtype = send.dtype
            self.send_size = send.size


__all__ = ["FastCall", "Repeat"]
