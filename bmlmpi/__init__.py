"""bmlmpi: MPI allreduce collectives — BML on BCube, with a drop-in mpi4py-style API.

    from mpi4py import MPI
    import bmlmpi
    bmlmpi.Allreduce(sendbuf, recvbuf, op=MPI.SUM, comm=MPI.COMM_WORLD)
"""

from __future__ import annotations

try:
    from . import kernels as _kernels  # noqa: F401  (mapped from ../kernels by setup.cfg)
except ImportError as exc:  # pragma: no cover - only in a broken source checkout
    raise ImportError(
        "bmlmpi.kernels is missing: install the package (pip install -e . in a checkout) "
        "rather than importing the source folder directly") from exc

from .api import (
    Allreduce,
    ArgumentMismatch,
    Communicator,
    Iallreduce,
    RemoteArgumentError,
    Request,
)
from .buffers import BufferSpecError
from .execute import DeadlineExceeded
from .ops import AVG
from .select import algorithms

__version__ = "0.1.0"

__all__ = [
    "AVG",
    "Allreduce",
    "ArgumentMismatch",
    "BufferSpecError",
    "Communicator",
    "DeadlineExceeded",
    "Iallreduce",
    "RemoteArgumentError",
    "Request",
    "algorithms",
    "__version__",
]
