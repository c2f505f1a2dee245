"""Test layout: tests/unit (no MPI), tests/mpi (run under mpiexec by test_mpi_launch.py),
tests/gpu (skipped without a GPU). A plain ``pytest`` run collects tests/mpi only when
pytest-mpi's ``--with-mpi`` is given, i.e. inside the ranks the launcher starts.

The run leaves /dev/shm and /tmp as it found them: the session that starts the run notes their
entries first, and at its end fails the run (exit status 1) with the list of entries that were
not there before, apart from the suite's caches (:data:`SUITE_CACHES`) and what other jobs
still running on the machine hold (:func:`another_jobs`)."""

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from torch_venv import python, torch_venv

MPI_DIR = Path(__file__).parent / "mpi"
UNIT_DIR = "tests/unit/"


@pytest.fixture(scope="module")
def torch_python() -> Path:
    """The python of the torch tests' venv (:mod:`torch_venv`: made once, kept under /tmp); the
    tests that take it skip with the reason where it cannot be made."""
    why = torch_venv()
    if why:
        pytest.skip(why)
    return python()


def pytest_ignore_collect(collection_path, config):
    with_mpi = config.getoption("with_mpi", default=False)
    inside = Path(collection_path).resolve().is_relative_to(MPI_DIR.resolve())
    return inside and not with_mpi


#: The tests outside tests/unit start ranks under ``mpiexec`` (or Slurm, or network namespaces)
#: that use both cores and wait on deadlines: under pytest-xdist (the test command's ``-n
#: auto``) they form one unit of work, run one after another on one worker, never beside each
#: other; the unit tests (one process each) are shared out one by one to every worker, the
#: launches' included once it is done. A scheduler of our own, because xdist's ``loadgroup``
#: marks do not reach its scheduler under pytest 9.2 (it renames a test by an attribute pytest
#: 9.2 no longer reads).
LAUNCHES = "launches"
#: The unit tests' workers' niceness (pytest_runtest_setup).
UNIT_NICENESS = 19


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class LaunchesInTurn(LoadScopeScheduling):
        """xdist's scheduling by scope, every test outside tests/unit in one scope."""

        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(UNIT_DIR) else LAUNCHES

    return LaunchesInTurn(config, log)


def pytest_runtest_setup(item):
    # Under xdist the unit tests yield the cores to the launches' ranks: oversubscribed ranks
    # ran about three times slower beside one busy unit-test process; at the lowest priority
    # the unit tests run on what the ranks leave idle. A worker runs unit tests beside the
    # launches, or after its own launches are done, so no launch inherits the niceness.
    if os.environ.get("PYTEST_XDIST_WORKER") and item.nodeid.startswith(UNIT_DIR) \
            and os.getpriority(os.PRIO_PROCESS, 0) < UNIT_NICENESS:
        os.setpriority(os.PRIO_PROCESS, 0, UNIT_NICENESS)


# Calls that fail on purpose (argument mismatches, deadlines) make every rank dump its flight
# recorder; the suite's go into one folder of its own, removed when the run that made it ends.
# Open MPI's shared-memory segments likewise: the suite's processes, and the ranks they launch
# (mpiexec forwards OMPI_MCA_*), put them in a folder of the run's own, so that a rank killed
# with its launcher leaves nothing in /dev/shm. Processes that find the variables set (the
# ranks' own pytest) keep them.
_OWN_FOLDERS: list[str] = []
SM_BACKING = "OMPI_MCA_btl_sm_backing_directory"
#: where torch keeps its compiler's cache (a folder of the run's own: pytest_configure)
TORCH_COMPILER_CACHE = "TORCHINDUCTOR_CACHE_DIR"
#: where bmlmpi keeps its calibrations and tuning tables: a folder of the run's own
#: (pytest_configure), its compiled kernels' folder a link to the user's
CACHE_VARIABLE = "BMLMPI_CACHE_DIR"
#: The folders whose entries the run must leave as it found them.
CHECKED = ("/dev/shm", "/tmp")
#: What the suite keeps in /tmp on purpose, for the next run: the installed-package venv
#: (tests/installed_venv.py), the torch venv (tests/torch_venv.py), the emulated testbed's
#: MPICH venv (README), and pytest's own folders (pytest-of-<user>: pytest keeps the last
#: three runs' tmp_path folders).
SUITE_CACHES = re.compile(r"bmlmpi-installed-.*|bmlmpi-torch-venv-.*|venv-testbed|"
                          r"pytest-of-.*")
_entries_before: dict[str, set[str]] = {}
#: Entries of other jobs that may run on the machine at the same time: another test
#: session's own folders (removed when it ends), and the folders named after a launcher's
#: process (Open MPI's session folder ompi.<pid>, a job's flight-recorder folder) while that
#: process lives.
OTHER_SESSION = re.compile(r"bmlmpi-(trace-)?suite-.*")
LAUNCHER_PID = re.compile(r"ompi\.(\d+)|bmlmpi-trace-prterun-.*-(\d+)_\d+")


def another_jobs(name: str) -> bool:
    """Whether ``name`` is held by another job still running (:data:`OTHER_SESSION`,
    :data:`LAUNCHER_PID`)."""
    if OTHER_SESSION.fullmatch(name):
        return True
    m = LAUNCHER_PID.fullmatch(name)
    if m is None:
        return False
    pid = int(m.group(1) or m.group(2))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _entries(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def pytest_configure(config):
    if not os.environ.get("BMLMPI_TRACE_DIR"):
        # the session that starts the run (the ranks' sessions find the variable set)
        for folder in CHECKED:
            _entries_before[folder] = _entries(folder)
        folder = tempfile.mkdtemp(prefix="bmlmpi-trace-suite-")
        os.environ["BMLMPI_TRACE_DIR"] = folder
        _OWN_FOLDERS.append(folder)
    if not os.environ.get(SM_BACKING) and os.path.isdir("/dev/shm"):
        folder = tempfile.mkdtemp(prefix="bmlmpi-suite-", dir="/dev/shm")
        os.environ[SM_BACKING] = folder
        _OWN_FOLDERS.append(folder)
    if not os.environ.get(CACHE_VARIABLE):
        # The run's calibrations and tuning tables (measured under its own load, some of
        # them from injected times) must not reach the user's cache, where they would steer
        # auto in the user's next jobs; the compiled kernels are shared with the user's
        # (keyed by their source), so that the suite compiles no more than before.
        folder = tempfile.mkdtemp(prefix="bmlmpi-suite-cache-")
        kernels = Path.home() / ".cache" / "bmlmpi" / "numba"
        kernels.mkdir(parents=True, exist_ok=True)
        os.symlink(kernels, os.path.join(folder, "numba"))
        os.environ[CACHE_VARIABLE] = folder
        _OWN_FOLDERS.append(folder)
    if not os.environ.get(TORCH_COMPILER_CACHE):
        # the torch tests' ranks import torch's compiler (DTensor, FSDP2), which makes its
        # cache folder in the temporary folder (torchinductor_<user>) unless told where
        folder = tempfile.mkdtemp(prefix="bmlmpi-suite-torch-")
        os.environ[TORCH_COMPILER_CACHE] = folder
        _OWN_FOLDERS.append(folder)


def _remove_own_folders() -> None:
    while _OWN_FOLDERS:
        shutil.rmtree(_OWN_FOLDERS.pop(), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    _remove_own_folders()
    if not _entries_before:
        return
    left = {folder: sorted(name for name in _entries(folder) - before
                           if not SUITE_CACHES.fullmatch(name) and not another_jobs(name))
            for folder, before in _entries_before.items()}
    left = {folder: names for folder, names in left.items() if names}
    if not left:
        return
    lines = [f"{folder}: {', '.join(names)}" for folder, names in left.items()]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "left behind by this run (not there before it; a job run "
                                "beside it may have made some)", red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("left behind by this run:", *lines, sep="\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    _remove_own_folders()
