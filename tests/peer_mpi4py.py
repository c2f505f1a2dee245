"""Rank program: mpi4py's own collective test files, unchanged, with the family's calls going
to bmlmpi's module-level drop-ins (run by tests/test_peer_mpi4py.py under mpiexec).

    python tests/peer_mpi4py.py TESTDIR OUTDIR [--classes REGEX] test_cco_buf test_cco_vec ...

TESTDIR holds the test files as mpi4py's source distribution ships them (the launcher
extracts them; they are never part of this repository). ``--classes``: only the test
classes whose name matches REGEX (``re.search``), e.g. ``World$`` for ``COMM_WORLD`` alone.
Each rank writes
``OUTDIR/rank<r>.json``: for every test the files define, ``pass``, or the exception that
ended it (type, message, and whether it was an ``AssertionError``: a wrong result).

How the calls are renamed. mpi4py's ``Comm`` is a C type whose methods cannot be replaced,
and the files reach their communicator in two ways: the ``COMM`` class attribute of each
test case (``MPI.COMM_WORLD``, ``MPI.COMM_SELF``, evaluated when the file is imported), and
``setUp`` methods that assign ``self.COMM = MPI.COMM_WORLD.Dup()``. So, after importing a
file as it is:

- every ``COMM`` class attribute that is an ``MPI.Comm`` becomes a :class:`DropInComm` around
  it, and
- the file's global name ``MPI`` is bound to :data:`MPI_FOR_TESTS`, a module that is
  mpi4py's ``MPI`` except that ``COMM_WORLD`` and ``COMM_SELF`` are :class:`DropInComm`\\ s
  (so a ``Dup()`` in ``setUp`` hands out one too; ``Free()`` frees the duplicate).

A :class:`DropInComm` sends the family's calls that bmlmpi offers (:data:`DROPINS`) to
``bmlmpi.<name>(..., comm=<the mpi4py communicator>)`` with the test's arguments unchanged;
every other attribute (``Get_size``, ``Barrier``, ``Gather``, ``Alltoall``, ``Scan``,
``Dup``'s result aside) is mpi4py's own. The algorithm is bmlmpi's default for the
communicator: ``BMLMPI_ALGORITHM`` picks it.

Array kinds: ``arrayimpl`` adds a numba CUDA array kind whenever ``numba.cuda`` imports;
where no CUDA device is present it cannot allocate at all (mpi4py's own tests fail there
without bmlmpi), so that kind is left out of the list ``arrayimpl.loop`` walks, as it is
on a machine without numba. Every other kind (``array.array``, numpy, DLPack exporters of
both, host ``__cuda_array_interface__`` exporters) runs.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import traceback
import types
import unittest
from pathlib import Path

from mpi4py import MPI

import bmlmpi

#: The communicator methods that go to bmlmpi (its drop-ins take mpi4py's positional order).
DROPINS = (
    "Allreduce", "Iallreduce", "Allreduce_init",
    "Reduce_scatter_block", "Ireduce_scatter_block", "Reduce_scatter_block_init",
    "Reduce_scatter", "Ireduce_scatter", "Reduce_scatter_init",
    "Allgather", "Iallgather", "Allgather_init",
    "Allgatherv", "Iallgatherv", "Allgatherv_init",
    "Reduce", "Ireduce", "Reduce_init",
    "Bcast", "Ibcast", "Bcast_init",
)


def _dropin(name: str):
    target = getattr(bmlmpi, name)

    def call(self, *args, **kwargs):
        return target(*args, comm=self.comm, **kwargs)
    call.__name__ = name
    return call


class DropInComm:
    """An mpi4py communicator whose family calls run through bmlmpi's drop-ins."""

    def __init__(self, comm: MPI.Comm):
        self.comm = comm

    def __getattr__(self, name: str):
        return getattr(self.comm, name)

    def Dup(self, *args, **kwargs) -> DropInComm:
        return DropInComm(self.comm.Dup(*args, **kwargs))


for _name in DROPINS:
    setattr(DropInComm, _name, _dropin(_name))

#: mpi4py's MPI module as the test files see it (module docstring).
MPI_FOR_TESTS = types.ModuleType("MPI", MPI.__doc__)
MPI_FOR_TESTS.__dict__.update({k: v for k, v in vars(MPI).items() if not k.startswith("__")})
MPI_FOR_TESTS.COMM_WORLD = DropInComm(MPI.COMM_WORLD)
MPI_FOR_TESTS.COMM_SELF = DropInComm(MPI.COMM_SELF)


def _cuda_usable() -> bool:
    try:
        from numba import cuda
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - any failure to reach a device means no device
        return False


def _keep_runnable_array_kinds() -> None:
    import arrayimpl
    if not _cuda_usable():
        arrayimpl.ArrayBackends[:] = [b for b in arrayimpl.ArrayBackends
                                      if b.backend != "numba"]


def _rename(module: types.ModuleType) -> None:
    module.MPI = MPI_FOR_TESTS
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, unittest.TestCase):
            comm = value.__dict__.get("COMM")
            if isinstance(comm, MPI.Comm):
                value.COMM = DropInComm(comm)


class _Outcomes(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, dict] = {}

    def _record(self, test, err, wrong: bool) -> None:
        kind, exc, tb = err
        self.outcomes[test.id()] = {
            "outcome": "wrong" if wrong else "error", "type": kind.__name__,
            "module": kind.__module__, "message": str(exc)[:600],
            "where": "".join(traceback.format_tb(tb)[-2:])[-1200:]}

    def startTest(self, test):
        # the launcher shows the last one when a launch does not end (a hang)
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"peer: {test.id()}", file=sys.stderr, flush=True)
        super().startTest(test)

    def addSuccess(self, test):
        self.outcomes[test.id()] = {"outcome": "pass"}

    def addFailure(self, test, err):
        self._record(test, err, wrong=True)

    def addError(self, test, err):
        self._record(test, err, wrong=False)

    def addSkip(self, test, reason):
        self.outcomes[test.id()] = {"outcome": "skip", "message": reason}

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._record(subtest, err, wrong=issubclass(err[0], self.failureException))


def main(argv: list[str]) -> int:
    testdir, outdir, names = Path(argv[0]), Path(argv[1]), argv[2:]
    classes = ""
    if names[:1] == ["--classes"]:
        classes, names = names[1], names[2:]
    sys.path.insert(0, str(testdir))
    _keep_runnable_array_kinds()
    suite = unittest.TestSuite()
    for name in names:
        module = importlib.import_module(name)
        _rename(module)
        for test in unittest.defaultTestLoader.loadTestsFromModule(module):
            for case in test:
                if re.search(classes, type(case).__name__):
                    suite.addTest(case)
    result = _Outcomes()
    suite.run(result)
    rank = MPI.COMM_WORLD.Get_rank()
    (outdir / f"rank{rank}.json").write_text(json.dumps(result.outcomes, indent=1,
                                                        sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
