"""Process exit for fault-tolerant ranks: make a rank's end visible to the others and
hang-free.

Open MPI's runtime never reports a rank that exits with a non-zero status or an uncaught
Python exception (the others would wait for it forever), and ``MPI_Finalize`` after a failure
sometimes hangs. :func:`install_exit_handlers` turns an uncaught exception into SIGKILL (which
ULFM reports) and ends the process with a bounded barrier among the survivors followed by
``os._exit``; :func:`finish` does the latter explicitly.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from typing import NoReturn, Protocol


class Closable(Protocol):
    """What :func:`finish` needs of a fault-tolerant communicator."""

    timeout: float

    def close(self, timeout: float) -> None: ...


# Every fault-tolerant communicator not yet freed, in creation order: finish() meets the
# survivors of each. Strong references: a communicator the program dropped must still be met.
LIVE: list[Closable] = []

_exit_status: int = 0
_installed = False


def finish(status: int = 0, *, timeout: float | None = None) -> NoReturn:
    """End this rank: a bounded barrier with the survivors of every fault-tolerant
    communicator (in creation order), flush, ``os._exit(status)`` — skipping ``MPI_Finalize``,
    which can hang after a failure. ``timeout`` defaults to each communicator's own."""
    for c in list(LIVE):
        c.close(c.timeout if timeout is None else timeout)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _kill_on_exception(exc_type, exc, tb) -> None:
    try:
        sys.__excepthook__(exc_type, exc, tb)
        sys.stderr.write(f"bmlmpi: uncaught {exc_type.__name__} on pid {os.getpid()}; killing "
                         f"this rank so that MPI reports it to the others\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def install_exit_handlers() -> None:
    """Make this rank's end visible and hang-free (opt in, once per process):

    * an uncaught exception prints its traceback and kills the process with SIGKILL, which
      ULFM reports to the others (an ordinary non-zero exit is never reported);
    * at interpreter exit, :func:`finish` runs with the status given to ``sys.exit`` (0 for a
      normal end); a ``raise SystemExit(n)`` that bypasses ``sys.exit`` ends with status 0.
    """
    global _installed
    if _installed:
        return
    _installed = True
    sys.excepthook = _kill_on_exception
    real_exit = sys.exit

    def recording_exit(status: object = None) -> NoReturn:
        global _exit_status
        _exit_status = status if isinstance(status, int) else (0 if status is None else 1)
        real_exit(status)

    sys.exit = recording_exit
    atexit.register(lambda: finish(_exit_status))
