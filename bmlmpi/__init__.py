"""bmlmpi: MPI allreduce collectives — BML on BCube, with a drop-in mpi4py-style API.

    from mpi4py import MPI
    import bmlmpi
    bmlmpi.Allreduce(sendbuf, recvbuf, op=MPI.SUM, comm=MPI.COMM_WORLD)

Names are loaded on first use (PEP 562), so ``import bmlmpi`` — and the ``bmlmpi-run``
launcher — neither initialises MPI nor imports numba.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AVG": "ops",
    "Allgather": "collectives",
    "Allgather_init": "collectives",
    "Allgatherv": "collectives",
    "Allgatherv_init": "collectives",
    "Allreduce": "dropin",
    "Allreduce_init": "collectives",
    "Alltoall": "collectives",
    "Alltoall_init": "collectives",
    "Alltoallv": "collectives",
    "Alltoallv_init": "collectives",
    "ArgumentMismatch": "calls",
    "Bcast": "collectives",
    "Bcast_init": "collectives",
    "BufferSpecError": "buffers",
    "Communicator": "variants",
    "CommunicatorFreed": "call_gate",
    "CommunicatorRevoked": "calls",
    "DeadlineExceeded": "execute",
    "FaultToleranceError": "ft",
    "FaultToleranceUnavailable": "ft",
    "GradientBuckets": "training",
    "Iallgather": "collectives",
    "Iallgatherv": "collectives",
    "Iallreduce": "dropin",
    "Ialltoall": "collectives",
    "Ialltoallv": "collectives",
    "Ibcast": "collectives",
    "IntercommunicatorError": "calls",
    "Ireduce": "collectives",
    "Ireduce_scatter": "collectives",
    "Ireduce_scatter_block": "collectives",
    "PLANS": "training",
    "PersistentRequest": "persistent",
    "RankMasked": "ft",
    "Reduce": "collectives",
    "Reduce_init": "collectives",
    "Reduce_scatter": "collectives",
    "Reduce_scatter_block": "collectives",
    "Reduce_scatter_block_init": "collectives",
    "Reduce_scatter_init": "collectives",
    "RegistrationMismatch": "training",
    "RemoteArgumentError": "calls",
    "Request": "handles",
    "algorithms": "selection",
    "bound_finalize": "finalize",
    "communicator_for": "dropin",
    "rescaled_batch": "ft.rescale",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bmlmpi' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    except ModuleNotFoundError as exc:
        if exc.name == "bmlmpi.kernels":
            raise ImportError(
                "bmlmpi.kernels is missing: bmlmpi/kernels should be a link to ../kernels; a "
                "checkout made without symbolic links lacks it (git config core.symlinks true, "
                "then check out again), or install the package (pip install .)") from exc
        raise
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
