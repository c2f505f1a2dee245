"""What MPI says about failures: the fault-tolerance errors, which MPI errors mean a failed
process, and whether this MPI offers user-level failure mitigation (ULFM) at all."""

from __future__ import annotations

import os

from mpi4py import MPI

from .. import config
from ..execute import poll_until


class FaultToleranceUnavailable(RuntimeError):
    """The MPI library (or the way it was launched) offers no failure mitigation (ULFM)."""


class FaultToleranceError(RuntimeError):
    """A failure the survivors cannot recover from (e.g. a rank gone without MPI noticing)."""


class RankMasked(RuntimeError):
    """This rank was masked out of the fault-tolerant communicator (see ``mask_link``)."""


def _failure_classes() -> frozenset[int]:
    return frozenset(getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                               "ERR_REVOKED") if hasattr(MPI, n))


FAILURE_CLASSES = _failure_classes()


def is_failure(exc: BaseException, comm: MPI.Comm | None = None) -> bool:
    """True for the MPI errors that mean a process failed or the communicator was revoked.

    ``MPI_Testall`` reports a failed request as ``MPI_ERR_IN_STATUS``; with ``comm`` given,
    that counts as a failure when ``comm`` is revoked or has failed processes (ULFM reports
    a request's process failure there too)."""
    if not isinstance(exc, MPI.Exception):
        return False
    cls = exc.Get_error_class()
    if cls in FAILURE_CLASSES:
        return True
    # Open MPI's non-blocking collectives (libnbc) abort their schedule on a peer's failure and
    # report MPI_ERR_OTHER (or MPI_ERR_INTERN); the failure itself may reach this rank's view a
    # few ms later (5-50 ms here), so look at the communicator for up to a second.
    if cls in (MPI.ERR_IN_STATUS, MPI.ERR_OTHER, MPI.ERR_INTERN) and comm is not None \
            and comm != MPI.COMM_NULL:
        unsupported = False

        def seen() -> bool:
            nonlocal unsupported
            try:
                return comm.Is_revoked() or comm.Get_failed().Get_size() > 0
            except (MPI.Exception, NotImplementedError):
                unsupported = True
                return True   # nothing more to learn from this communicator
        # each poll makes a group: sleep between polls from the start (no spinning)
        failed = poll_until(seen, 1.0 if cls != MPI.ERR_IN_STATUS else 0.0, spin=0.0)
        return failed and not unsupported
    return False


def ulfm_support(comm: MPI.Comm) -> tuple[bool | None, str]:
    """(True/False/None = cannot tell, why) for user-level failure mitigation on ``comm``."""
    if config.get("BMLMPI_ULFM"):
        return True, "BMLMPI_ULFM is set"
    library = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    if "Open MPI" in library:
        enabled = os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower()
        if enabled in ("1", "true", "yes", "on", "enabled"):
            return True, f"{library} with ULFM enabled"
        return False, (f"{library} was started without user-level failure mitigation: launch "
                       f"with `bmlmpi-run --ft ...` (mpiexec --with-ft ulfm)")
    try:
        comm.Is_revoked()
    except NotImplementedError:
        return False, f"{library} has no user-level failure mitigation (ULFM)"
    except MPI.Exception as exc:
        return False, f"{library}: MPI_Comm_is_revoked failed ({exc.Get_error_string()})"
    return None, f"cannot tell whether {library} implements ULFM"
