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


#: Files sized for the test command: the most ranks each runs at. What they check does not
#: change with the rank count beyond it, while every launch beyond it is oversubscribed on
#: the test machine (two cores) and costs most per call; the rank counts beyond run the
#: schedules' files (allreduce with every op, family, hierarchical, shared memory, fast
#: paths, compression, recovery), where what changes with the rank count is checked.
#: Up to 6: agreement on refused arguments, the watchdog and the communicators' contracts,
#: the flight recorder (their messages name ranks and steps). Up to 4: conformance (every
#: datatype, op, buffer specification and communicator mpi4py accepts: the argument layer
#: decides them on each rank before any schedule runs, alike at every size; the schedules
#: they reach run at every N in test_allreduce_mpi.py), the gradient buckets (their plans
#: and fused layout are each rank's own; the allreduce under them is the flat one) and
#: calibration's agreement and cache (what it measures is timing, which no test checks).
SIZED = {"test_bad_input_mpi.py": 6, "test_contracts_mpi.py": 6, "test_trace_mpi.py": 6,
         "test_buckets_mpi.py": 4, "test_calibrate_mpi.py": 4, "test_conformance_mpi.py": 4}

#: The rank counts up to which the every-datatype tests (:data:`DTYPE_CROSSES`) take every
#: datatype of ALL_DTYPES; beyond (N = 5, 6, 8, 9, 12) they take :data:`DTYPES_BEYOND_4`.
#: What a datatype changes is the same at every rank count: the reduction kernel (one per
#: dtype and op, applied to two local ranges) and the element size the executor turns element
#: ranges into bytes with. What the rank count changes is the schedule (which element range
#: goes to whom at which step, chunk and piece boundaries, node tiers) and AVG's divisor: at
#: every rank count these tests still run every algorithm, op, count and mode they run at
#: 1-4 ranks, with position- and rank-dependent data, in each kept datatype, so a misplaced
#: range fails at every N. The kept datatypes hold one of each element size (1, 2, 4, 8, 16
#: bytes: the shared-memory tier cuts its chunks in bytes, and test_shm_mpi.py makes them
#: small, so their boundaries differ by element size) and of each kernel family (integers,
#: float16 accumulated in float32, float32, float64, complex); the others (the remaining
#: integer widths and signs, complex64, longdouble, clongdouble) take the kernels and
#: element sizes of kept ones at 1-4 ranks, where every datatype still runs.
EVERY_DTYPE_UP_TO = 4
DTYPE_CROSSES = frozenset({"test_allreduce_mpi.py", "test_fast_schedule_mpi.py",
                           "test_hierarchical_mpi.py", "test_shm_mpi.py"})
DTYPES_BEYOND_4 = frozenset(np.dtype(d) for d in (np.int8, np.float16, np.float32, np.int64,
                                                  np.float64, np.complex128))


def every_dtype(size: int) -> list:
    """The datatypes of ALL_DTYPES a test that takes every datatype runs at ``size`` ranks:
    all of them up to EVERY_DTYPE_UP_TO, those of DTYPES_BEYOND_4 beyond (above: why that
    still fails a misplaced range at every N)."""
    if size <= EVERY_DTYPE_UP_TO:
        return ALL_DTYPES
    return [d for d in ALL_DTYPES if np.dtype(d) in DTYPES_BEYOND_4]


def pytest_collection_modifyitems(config, items):
    size = MPI.COMM_WORLD.size
    few = pytest.mark.skip(reason="sized for the test command: this datatype runs at 1-4 "
                                  "ranks (tests/mpi/conftest.py EVERY_DTYPE_UP_TO)")
    for item in items:
        most = SIZED.get(item.path.name)
        if most is not None and size > most:
            item.add_marker(pytest.mark.skip(reason=f"sized for the test command: runs at "
                                                    f"1-{most} ranks (tests/mpi/conftest.py)"))
        if size > EVERY_DTYPE_UP_TO and item.path.name in DTYPE_CROSSES \
                and hasattr(item, "callspec"):
            dtype = item.callspec.params.get("dtype")
            if dtype is not None and np.dtype(dtype) not in DTYPES_BEYOND_4:
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
