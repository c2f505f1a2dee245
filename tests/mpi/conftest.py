"""Helpers for tests that run inside every rank (pytest-mpi, ``--with-mpi``)."""

import numpy as np
import pytest
from mpi4py import MPI

import bmlmpi

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_DTYPES = [np.float16, np.float32, np.float64, np.longdouble]
COMPLEX_DTYPES = [np.complex64, np.complex128]
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES
OPS = [MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, bmlmpi.AVG]
OP_IDS = ["sum", "prod", "min", "max", "avg"]

# explicit BCube shapes tried at each communicator size, beside the default one
SHAPES = {4: ["2x2", "4"], 6: ["2x3", "3x2", "6"], 8: ["2x2x2", "4x2", "2x4"],
          9: ["3x3", "9"], 12: ["2x2x3", "3x2x2", "2x3x2", "4x3", "3x4", "12"]}


#: Files sized for the test command: what they check does not change with the rank count
#: beyond 6 (agreement on refused arguments, the watchdog and the communicators' contracts,
#: the flight recorder, calibration's agreement and cache, buckets, and conformance: the
#: datatypes, ops, buffer specifications and communicators mpi4py accepts, which the
#: argument layer handles alike at every size), while at 8, 9 and 12 oversubscribed ranks
#: each costs minutes; those rank counts run the schedules' files (allreduce with every op,
#: family, hierarchical, shared memory, fast paths, compression, recovery).
SIZED_TO_6 = frozenset({"test_bad_input_mpi.py", "test_buckets_mpi.py", "test_calibrate_mpi.py",
                        "test_conformance_mpi.py", "test_contracts_mpi.py", "test_trace_mpi.py"})

#: The hierarchical allreduce's every-datatype test costs ~4 s per datatype at 12 oversubscribed
#: ranks; beyond 6 ranks it takes one datatype of each kind (integer, both float widths the
#: kernels specialise, complex), the rest of ALL_DTYPES at 1-6 ranks, where the same kernels
#: and both tiers run. (The flat allreduce keeps every datatype at every size.)
FEW_DTYPES_BEYOND_6 = frozenset({"test_hierarchical_mpi.py"})
DTYPES_BEYOND_6 = frozenset({np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.float64),
                             np.dtype(np.complex128)})


def pytest_collection_modifyitems(config, items):
    if MPI.COMM_WORLD.size <= 6:
        return
    sized = pytest.mark.skip(reason="sized for the test command: runs at 1-6 ranks "
                                    "(tests/mpi/conftest.py)")
    few = pytest.mark.skip(reason="sized for the test command: this datatype runs at 1-6 "
                                  "ranks (tests/mpi/conftest.py DTYPES_BEYOND_6)")
    for item in items:
        if item.path.name in SIZED_TO_6:
            item.add_marker(sized)
        if item.path.name in FEW_DTYPES_BEYOND_6 and hasattr(item, "callspec"):
            dtype = item.callspec.params.get("dtype")
            if dtype is not None and np.dtype(dtype) not in DTYPES_BEYOND_6:
                item.add_marker(few)


def rank_input(n: int, rank: int, dtype, op) -> np.ndarray:
    """Position- and rank-dependent data whose exact reduction fits every dtype."""
    i = np.arange(n)
    if op is MPI.PROD:
        vals = 1 + (i + rank) % 2          # products of 1s and 2s: exact, may wrap small ints
    else:
        vals = (i * 7 + rank * 3) % 11     # a misplaced range or rank changes the values
    out = vals.astype(dtype)
    if np.dtype(dtype).kind == "c":
        out = out + 1j * ((i + 2 * rank) % 5).astype(dtype)
    return out


def reference(n: int, size: int, dtype, op) -> np.ndarray:
    """The exact result, folding every rank's input with numpy in the same dtype."""
    inputs = [rank_input(n, r, dtype, op) for r in range(size)]
    acc = inputs[0].copy()
    fold = np.add
    for mop, f in ((MPI.PROD, np.multiply), (MPI.MIN, np.minimum), (MPI.MAX, np.maximum)):
        if op is mop:
            fold = f
    with np.errstate(over="ignore"):
        for x in inputs[1:]:
            fold(acc, x, out=acc)
    if op is bmlmpi.AVG:
        if acc.dtype.kind in "iu":
            np.floor_divide(acc, size, out=acc)
        elif acc.dtype.kind == "c":
            # component-wise real division is correctly rounded; numpy's complex/complex
            # division (Smith's algorithm) can be off by an ulp
            acc.real /= size
            acc.imag /= size
        else:
            np.divide(acc, size, out=acc, casting="unsafe")
    return acc


def all_ranks_agree(comm: MPI.Comm, failures: list) -> None:
    """Fail on every rank if any rank failed, naming them (keeps ranks in lock-step)."""
    everyone = comm.allgather(failures)
    bad = [(r, f) for r, fs in enumerate(everyone) for f in fs]
    assert not bad, f"{len(bad)} failure(s), first: {bad[:5]}"


@pytest.fixture
def comm():
    return MPI.COMM_WORLD
