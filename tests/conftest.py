"""Test layout: tests/unit (no MPI), tests/mpi (run under mpiexec by test_mpi_launch.py),
tests/gpu (skipped without a GPU). A plain ``pytest`` run collects tests/mpi only when
pytest-mpi's ``--with-mpi`` is given, i.e. inside the ranks the launcher starts."""

from pathlib import Path

MPI_DIR = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path, config):
    with_mpi = config.getoption("with_mpi", default=False)
    inside = Path(collection_path).resolve().is_relative_to(MPI_DIR.resolve())
    return inside and not with_mpi
