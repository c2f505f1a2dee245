"""Bound this process's ``MPI_Finalize`` once a call was given up at its deadline: a peer
that is stopped or hung would otherwise keep the finalize, and so the job, waiting for ever.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal

_finalize_bound: list[float] = []


def bound_finalize(seconds: float) -> None:
    """Give this process's ``MPI_Finalize`` at most ``2 * seconds`` (at least 30) once the program
    ends: a rank that gave up a call at its deadline may have a peer that is stopped or hung,
    and ``MPI_Finalize`` would wait for it for ever. At exit, before mpi4py finalizes, an
    alarm is armed (SIGALRM, the default action: the process ends, and the launcher ends the
    job); a finalize that completes in time is not affected."""
    if _finalize_bound:
        _finalize_bound[0] = max(_finalize_bound[0], seconds)
        return
    _finalize_bound.append(seconds)

    def arm() -> None:
        # generous: a finalize that is merely slow (a loaded node, many communicators) must
        # not be cut short; only one that waits for ever is
        n = max(30, int(math.ceil(2 * _finalize_bound[0])))
        with contextlib.suppress(OSError):
            os.write(2, (f"bmlmpi: a call was given up at its deadline on this rank; "
                         f"MPI_Finalize gets {n} s before this process ends itself (a "
                         f"stopped or hung peer cannot keep the job from ending)\n").encode())
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(n)
    atexit.register(arm)
