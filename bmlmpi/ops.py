"""Reduction operations accepted by bmlmpi and how they map onto the kernels.

``MPI.SUM``, ``MPI.PROD``, ``MPI.MIN``, ``MPI.MAX`` and :data:`AVG` (a sum divided by the
number of contributing ranks; floor division for integer dtypes). The strings ``"sum"``,
``"prod"``, ``"min"``, ``"max"``, ``"avg"`` are accepted too.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


class _Average:
    """The average over ranks: a SUM followed by a division by the number of contributors."""

    name = "avg"

    def __repr__(self) -> str:
        return "bmlmpi.AVG"

    def __reduce__(self) -> str:
        return "AVG"


AVG = _Average()

OP_NAMES = ("sum", "prod", "min", "max", "avg")
_CODE = {name: i for i, name in enumerate(OP_NAMES)}
_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def op_name(op: object) -> str:
    """Normalise ``op`` to one of :data:`OP_NAMES`, or raise ``ValueError``."""
    if op is AVG:
        return "avg"
    if isinstance(op, str) and op.lower() in _CODE:
        return op.lower()
    if isinstance(op, MPI.Op):
        for name, mop in _MPI_OPS.items():
            if op == mop:
                return name
    raise ValueError(f"unsupported reduction op {op!r}: bmlmpi supports MPI.SUM, MPI.PROD, "
                     f"MPI.MIN, MPI.MAX and bmlmpi.AVG")



def kernel_op(name: str) -> str:
    """The pairwise kernel op: an average reduces as a sum."""
    return "sum" if name == "avg" else name


def mpi_op(name: str) -> MPI.Op:
    return _MPI_OPS[kernel_op(name)]


SUPPORTED_KINDS = "iufc"


def check_dtype_op(dtype: np.dtype, name: str) -> None:
    if dtype.kind not in SUPPORTED_KINDS:
        raise TypeError(f"unsupported dtype {dtype}: bmlmpi reduces numeric dtypes "
                        f"(signed/unsigned integers, floats, complex)")
    if dtype.kind == "c" and name in ("min", "max"):
        raise TypeError(f"{name.upper()} is not defined for complex dtype {dtype}")
