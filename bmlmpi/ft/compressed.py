"""A compressed allreduce on the fault-tolerant communicator: the exchange settled among the
survivors (the fault-tolerant policy's :meth:`~bmlmpi.ft.policy.FaultTolerantPolicy.
settle_compressed`).

Algorithm: the compressed call's exchange stages (:mod:`bmlmpi.compression.layer`) run on its
compression channel's private duplicate communicator; an MPI failure during them revokes the
duplicate (so no survivor waits on it), and every call ends with an agreement
(``MPI_Comm_iagree``) on whether every survivor completed its exchange. If one did not, or a
rank failed, every survivor abandons the call (``abandon()``: the compressor's error-feedback
memory as before the call, nothing of it counts as sent, the duplicate dropped) and raises
:class:`.errors.FaultToleranceError`, its recvbuf untouched; the call is not re-run over the
survivors (it would apply the error feedback twice). Cost: one agreement per call.

Source: ULFM's revoke and agree (Bland et al., "Post-failure recovery of MPI communication
capability").
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from .errors import FaultToleranceError


def settle(comm: Any, stages: Generator[list, None, Any], channel: Any, what: str,
           abandon: Callable[[], None]) -> Generator[list, None, Any]:
    """``stages`` (one compressed call, ``what``) on ``channel``, settled among the
    survivors of the fault-tolerant ``comm`` (module docstring)."""

    def give_up(why: str, exc: BaseException | None) -> NoReturn:
        abandon()
        raise FaultToleranceError(
            f"{what} on a fault-tolerant communicator, rank {comm.rank} of {comm.size}: {why}; "
            f"the call is abandoned on every survivor (recvbuf untouched) and the communicator "
            f"must not be used again (end the rank with bmlmpi.ft.finish)") from exc

    try:
        dup = channel.comm
    except MPI.Exception as exc:
        give_up(f"the private communicator could not be made ({exc.Get_error_string()})", exc)
    failure: MPI.Exception | None = None
    result = None
    try:
        result = yield from stages
    except MPI.Exception as exc:
        failure = exc
        channel.revoke()    # every survivor's pending transfer on it fails at once
    flag = np.array([0 if failure else 1], dtype=np.intc)
    try:
        yield [dup.Iagree(flag)]
    except MPI.Exception as exc:   # ULFM: a rank failed (reported the same to every survivor)
        give_up(f"a rank failed during the call ({exc.Get_error_string()})", failure or exc)
    if not flag[0]:
        why = (failure.Get_error_string() if failure is not None else
               "another survivor's exchange failed")
        give_up(f"a rank failed during the call ({why})", failure)
    return result


__all__ = ["settle"]
