"""Process exit for fault-tolerant ranks: make a rank's end visible to the others and
hang-free.

Open MPI's runtime never reports a rank that exits with a non-zero status or an uncaught
Python exception (the others would wait for it forever), and ``MPI_Finalize`` after a failure
sometimes hangs. :func:`install_exit_handlers` turns an uncaught exception into SIGKILL (which
ULFM reports) and ends the process with a bounded barrier among the survivors followed by
``os._exit``; :func:`finish` does the latter explicitly. A replacement spawned by
``replace_failed`` calls ``MPI_Finalize`` (bounded) before it exits: Open MPI fails the whole
job when a spawned process ends without it.

Under ``bmlmpi-run --ft`` (``BMLMPI_STATUS_DIR`` set) every fault-tolerant rank also writes how
it ended (started, ended normally, exit status, uncaught error) to one file of that folder, so
that the launcher can tell a crashed rank (a failure of the job) from a lost one (killed: it
never wrote its end), which Open MPI's launcher reports alike.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from typing import NoReturn, Protocol

from .. import config


class Closable(Protocol):
    """What :func:`finish` needs of a fault-tolerant communicator."""

    timeout: float

    def close(self, timeout: float) -> None: ...


# Every fault-tolerant communicator not yet freed, in creation order: finish() meets the
# survivors of each. Strong references: a communicator the program dropped must still be met.
LIVE: list[Closable] = []

_exit_status: int = 0
_installed = False
_started = False
_replacement = False

#: How long a replacement's ``MPI_Finalize`` may take before the process exits without it.
FINALIZE_TIMEOUT_S = 30.0


def _note(event: str, **fields: object) -> None:
    """Append one line about this process's end to its file in ``BMLMPI_STATUS_DIR`` (set by
    ``bmlmpi-run --ft``); nothing without it. Never raises: the exit path must go on."""
    with contextlib.suppress(Exception):
        folder = config.get("BMLMPI_STATUS_DIR")
        if folder is None:
            return
        line = json.dumps({"event": event, "pid": os.getpid(), **fields})
        name = folder / f"{socket.gethostname()}-{os.getpid()}.jsonl"
        with open(name, "a") as out:
            out.write(line + "\n")


def _ended_normally() -> None:
    error = getattr(sys, "last_value", None)  # set when an uncaught exception ended Python
    _note("end", error=None if error is None else f"{type(error).__name__}: {error}")


def started(original_rank: int, *, replacement: bool, heartbeat: str | None = None) -> None:
    """A fault-tolerant communicator exists on this process (at ``original_rank``): from now
    on the launcher expects to hear how this rank ends. ``heartbeat``: the communicator's
    heartbeat folder, which the launcher removes after the job (killed ranks leave theirs)."""
    global _started, _replacement
    _replacement = _replacement or replacement
    if not _started:
        _started = True
        atexit.register(_ended_normally)
    _note("start", rank=original_rank, replacement=replacement, heartbeat=heartbeat,
          host=socket.gethostname())


def _finalize_spawned() -> None:
    """``MPI_Finalize`` in a replacement, with a deadline: past it the process exits anyway."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    timer = threading.Timer(FINALIZE_TIMEOUT_S, lambda: os._exit(_exit_status))
    timer.daemon = True
    timer.start()
    with contextlib.suppress(Exception):
        mpi.Finalize()
    timer.cancel()


def finish(status: int = 0, *, timeout: float | None = None) -> NoReturn:
    """End this rank: a bounded barrier with the survivors of every fault-tolerant
    communicator (in creation order), flush, ``os._exit(status)`` — skipping ``MPI_Finalize``,
    which can hang after a failure. ``timeout`` defaults to each communicator's own."""
    global _exit_status
    _exit_status = status
    for c in list(LIVE):
        c.close(c.timeout if timeout is None else timeout)
    _note("exit", status=status)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if _replacement:
        _finalize_spawned()
    os._exit(status)


def _kill_on_exception(exc_type, exc, tb) -> None:
    try:
        sys.__excepthook__(exc_type, exc, tb)
        _note("error", error=f"{exc_type.__name__}: {exc}")
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
