"""Test layout: tests/unit (no MPI), tests/mpi (run under mpiexec by test_mpi_launch.py),
tests/gpu (skipped without a GPU). A plain ``pytest`` run collects tests/mpi only when
pytest-mpi's ``--with-mpi`` is given, i.e. inside the ranks the launcher starts."""

from pathlib import Path

MPI_DIR = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path, config):
    with_mpi = config.getoption("with_mpi", default=False)
    inside = Path(collection_path).resolve().is_relative_to(MPI_DIR.resolve())
    return inside and not with_mpi


# Calls that fail on purpose (argument mismatches, deadlines) make every rank dump its flight
# recorder; the suite's go into one folder of its own, removed when the run that made it ends.
# Open MPI's shared-memory segments likewise: a singleton (one process, no mpiexec) leaves its
# 16 MiB sm_segment file in /dev/shm at exit, and killed ranks leave theirs, so the suite's
# processes, and the ranks they launch (mpiexec forwards OMPI_MCA_*), put them in a folder of
# the run's own. Processes that find the variables set (the ranks' own pytest) keep them.
_TRACE_DIR: list[str] = []
SM_BACKING = "OMPI_MCA_btl_sm_backing_directory"


def pytest_configure(config):
    import os
    import tempfile
    if not os.environ.get("BMLMPI_TRACE_DIR"):
        folder = tempfile.mkdtemp(prefix="bmlmpi-trace-suite-")
        os.environ["BMLMPI_TRACE_DIR"] = folder
        _TRACE_DIR.append(folder)
    if not os.environ.get(SM_BACKING) and os.path.isdir("/dev/shm"):
        folder = tempfile.mkdtemp(prefix="bmlmpi-suite-", dir="/dev/shm")
        os.environ[SM_BACKING] = folder
        _TRACE_DIR.append(folder)


def pytest_unconfigure(config):
    import shutil
    for folder in _TRACE_DIR:
        shutil.rmtree(folder, ignore_errors=True)
