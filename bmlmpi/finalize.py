"""This process's end of MPI: bound its ``MPI_Finalize`` once a call was given up at its
deadline (a peer that is stopped or hung would otherwise keep the finalize, and so the job,
waiting for ever), and remove a singleton's shared-memory segment.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
from pathlib import Path

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


#: the variables a launcher (mpiexec, srun with PMIx) gives its processes; a process without
#: them that runs MPI is a singleton
LAUNCHED_BY = ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")
#: the name Open MPI 5's btl/sm gives its backing file (in btl_sm_backing_directory)
SM_SEGMENT = "sm_segment."
_segments: list[Path] = []


def mapped_sm_segments(maps: str = "/proc/self/maps") -> list[Path]:
    """The Open MPI shared-memory segment files this process has mapped (Linux; none
    elsewhere)."""
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = {line.split(None, 5)[5] for line in lines if line.count(" ") >= 5
             and SM_SEGMENT in line}
    return sorted(Path(p) for p in found if Path(p).name.startswith(SM_SEGMENT))


def singleton_session_dir(segment: Path, env: dict[str, str] | None = None) -> Path:
    """The session folder Open MPI 5 made for the singleton whose btl/sm segment is
    ``segment`` (``sm_segment.<host>.<uid>.<job id, hex>.<rank>``):
    ``<temp>/ompi.<host>.<uid>/jf.0/<job id>``, ``<temp>`` as Open MPI finds it (``TMPDIR``,
    ``TEMP``, ``TMP``, else ``/tmp``)."""
    env = os.environ if env is None else env
    host, uid, job, _rank = segment.name[len(SM_SEGMENT):].rsplit(".", 3)
    temp = next((env[v] for v in ("TMPDIR", "TEMP", "TMP") if env.get(v)), "/tmp")
    return Path(temp) / f"ompi.{host}.{uid}" / "jf.0" / str(int(job, 16))


def remove_singleton_leftovers() -> None:
    """A singleton (a process that runs MPI without a launcher: ``python train.py``, a
    torchrun worker) removes what Open MPI 5 would leave of it at exit: its btl/sm
    shared-memory segment (16 MiB, in ``btl_sm_backing_directory``, ``/dev/shm`` by default)
    and its session folder (``ompi.<host>.<uid>/jf.0/<job>`` in the temporary folder), whose
    removal Open MPI leaves to the launcher a singleton does not have. The segment is named by
    its mapping in ``/proc/self/maps`` (wherever the backing directory is) and unlinked by an
    exit handler: the mapping stays valid until ``MPI_Finalize`` unmaps it; the session
    folder's empty folders are removed with it (the shared ``ompi.<host>.<uid>/jf.0`` stays:
    another singleton may be making its own folder in it). Nothing is done in a launched
    process (its launcher removes these) or where this process maps more than one segment (a
    singleton that spawned processes shares theirs)."""
    if _segments or any(os.environ.get(v) for v in LAUNCHED_BY):
        return
    found = mapped_sm_segments()
    if len(found) != 1:
        return
    _segments.extend(found)
    try:
        session = singleton_session_dir(found[0])
    except ValueError:
        session = None

    def remove() -> None:
        for path in _segments:
            with contextlib.suppress(OSError):
                path.unlink()
        if session is not None and session.is_dir():
            for sub in sorted(session.rglob("*"), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                session.rmdir()
    atexit.register(remove)
