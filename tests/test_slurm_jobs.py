"""The batch jobs in jobs/: under a real one-node Slurm (jobs/local-slurm) and under mpirun.

The Slurm part runs where the machine allows it (Linux, root, Debian's Slurm packages present or
installable with apt-get) and skips, saying why, elsewhere. BMLMPI_SLURM_TESTS=0 skips it;
BMLMPI_SLURM_TESTS=1 turns "cannot run a local Slurm" into a failure instead of a skip.
Every subprocess has a timeout; the whole file takes about a minute once the packages are there.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

JOBS = Path(__file__).resolve().parents[1] / "jobs"
TIMEOUT_S = 180


def load_local_slurm() -> ModuleType:
    """jobs/local-slurm is a script without a .py suffix: load it as a module."""
    name = "bmlmpi_jobs_local_slurm"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(JOBS / "local-slurm"))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    loader.exec_module(module)
    return module


ls = load_local_slurm()


def job_env(**extra: str) -> dict[str, str]:
    """The environment for the jobs: this Python (and its mpiexec, bmlmpi-run) first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "BMLMPI_", "OMPI_", "PMIX_"))}
    for kept in ("OMPI_MCA_btl_sm_backing_directory",  # tests/conftest.py
                 "BMLMPI_CACHE_DIR"):  # the run's own calibrations and tuning tables
        if kept in os.environ:
            env[kept] = os.environ[kept]
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["BMLMPI_PYTHON"] = sys.executable
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None,
        timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, text=True, check=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


needs_mpiexec = pytest.mark.skipif(
    shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None
    and shutil.which("mpiexec") is None, reason="no mpiexec")


# ---------------------------------------------------------------------------------------------
# Under Slurm


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    mode = os.environ.get("BMLMPI_SLURM_TESTS", "auto")
    if mode == "0":
        pytest.skip("BMLMPI_SLURM_TESTS=0")
    try:
        ls.ensure_software()
    except ls.Unavailable as exc:
        if mode == "1":
            pytest.fail(f"BMLMPI_SLURM_TESTS=1 but no local Slurm: {exc}")
        pytest.skip(f"no local Slurm here: {exc}")
    with ls.running_cluster() as c:
        yield c


@pytest.mark.parametrize("check", list(ls.CHECKS))
def test_under_local_slurm(cluster: object, check: str) -> None:
    if check == "train-torch" and not os.environ.get(ls.TORCH_PYTHON_VAR):
        # about 2 minutes on the shared 2-core machine (4 ranks importing torch, bmlmpi's
        # first calls), past this file's share of CI: run when a torch Python is named
        pytest.skip(f"the torch job under Slurm runs when {ls.TORCH_PYTHON_VAR} names a Python "
                    f"with torch (e.g. the torch tests' venv, tests/torch_venv.py)")
    try:
        ls.CHECKS[check](cluster)
    except ls.CheckSkipped as exc:
        pytest.skip(str(exc))


# ---------------------------------------------------------------------------------------------
# Pieces that need no Slurm


def test_no_local_slurm_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ls.os, "geteuid", lambda: 1000)
    with pytest.raises(ls.Unavailable, match="needs root"):
        ls.ensure_software()


def test_no_install_when_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ls.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ls, "missing_software", lambda: ["slurmd", "libpmix.so"])
    monkeypatch.setenv("BMLMPI_SLURM_INSTALL", "0")
    with pytest.raises(ls.Unavailable, match=r"missing slurmd, libpmix.so .*SLURM_INSTALL=0"):
        ls.ensure_software()


def test_stop_process_spares_a_process_that_is_not_ours(tmp_path: Path) -> None:
    """A recorded PID whose command line lacks our folder (a reused PID) is left alone."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while "sleep 30" not in ls.process_cmdline(proc.pid):  # until the exec has happened
            assert time.monotonic() < deadline, "sleep did not start"
            time.sleep(0.05)
        assert ls.stop_process(proc.pid, str(tmp_path)) is False
        assert proc.poll() is None
        assert ls.stop_process(proc.pid, "sleep 30", grace_s=5) is True
        assert ls.process_cmdline(proc.pid) == ""  # gone (stop_process reaped its child)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("library", "expected"), [
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution", "pmix"),
    ("MPICH Version:      4.2.3", "pmi2"),
    ("Intel(R) MPI Library 2021.11 for Linux* OS", "pmi2"),
])
def test_srun_mpi_follows_the_library(tmp_path: Path, library: str, expected: str) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\necho '{library}'\n")
    fake_python.chmod(0o755)
    done = run(["bash", "-c", f'source "{JOBS}/common.sh" && bmlmpi_srun_mpi'],
               env=job_env(BMLMPI_PYTHON=str(fake_python)), timeout=30)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == expected


def test_srun_mpi_override_and_unknown_library(tmp_path: Path) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'Some Other MPI 1.0'\n")
    fake_python.chmod(0o755)
    cmd = ["bash", "-c", f'source "{JOBS}/common.sh" && bmlmpi_srun_mpi']
    unknown = run(cmd, env=job_env(BMLMPI_PYTHON=str(fake_python)), timeout=30)
    assert unknown.returncode != 0
    assert "set BMLMPI_SRUN_MPI" in unknown.stdout
    forced = run(cmd, env=job_env(BMLMPI_PYTHON=str(fake_python), BMLMPI_SRUN_MPI="pmix_v4"),
                 timeout=30)
    assert forced.returncode == 0 and forced.stdout.strip() == "pmix_v4"


def test_srun_mpi_for_the_mpi_in_use() -> None:
    done = run(["bash", "-c", f'source "{JOBS}/common.sh" && bmlmpi_srun_mpi'], env=job_env(),
               timeout=60)
    assert done.returncode == 0, done.stdout
    library = run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; "
                   "from mpi4py import MPI; print(MPI.Get_library_version())"],
                  env=job_env(), timeout=60).stdout
    assert done.stdout.strip() == ("pmix" if "Open MPI" in library else "pmi2")


@needs_mpiexec
def test_train_mpirun_script(tmp_path: Path) -> None:
    out = tmp_path / "train"
    done = run([str(JOBS / "train-mpirun.sh")], cwd=tmp_path, env=job_env(
        BMLMPI_RANKS="3", BMLMPI_OUT=str(out), BMLMPI_TRAIN_EPOCHS="2"))
    result = ls.JobResult("train-mpirun", done.returncode, done.stdout, out)
    ls.check_train_result(result, 3)
    assert "check_world: 3 ranks" in done.stdout


@needs_mpiexec
def test_train_buckets_mpirun_script(tmp_path: Path) -> None:
    out = tmp_path / "train-buckets"
    done = run([str(JOBS / "train-buckets-mpirun.sh")], cwd=tmp_path, env=job_env(
        BMLMPI_RANKS="2", BMLMPI_OUT=str(out), BMLMPI_PLAN="layer,ibatch",
        BMLMPI_TRAIN_EPOCHS="1", BMLMPI_TRAIN_STEPS="6", BMLMPI_TRAIN_BATCH="8"), timeout=600)
    result = ls.JobResult("train-buckets-mpirun", done.returncode, done.stdout, out)
    ls.check_train_buckets_result(result, 2, ["layer", "ibatch"])
    assert "check_world: 2 ranks" in done.stdout


@needs_mpiexec
def test_sweep_mpirun_script(tmp_path: Path) -> None:
    done = run([str(JOBS / "sweep-mpirun.sh")], cwd=tmp_path, env=job_env(
        BMLMPI_RANKS="2", BMLMPI_SIZES="4:1024", BMLMPI_ITERS="5", BMLMPI_WARMUP="1",
        BMLMPI_ALGORITHMS="native,bml"))
    # Without BMLMPI_OUT the results go to bmlmpi-results/sweep-<time> in the current folder.
    folders = list((tmp_path / "bmlmpi-results").glob("sweep-*"))
    assert done.returncode == 0 and len(folders) == 1, done.stdout
    result = ls.JobResult("sweep-mpirun", done.returncode, done.stdout, folders[0])
    ls.check_sweep_csv(result, 2, {"native", "bml"}, sizes="4:1024")


@needs_mpiexec
@pytest.mark.parametrize("program", ["check_world.py", "train_example.py"])
def test_world_size_check_fails_the_run(program: str) -> None:
    """2 ranks started for a job that asked for 3: the run fails and says why."""
    launcher = shutil.which("bmlmpi-run", path=job_env()["PATH"])
    if launcher is None:
        pytest.skip("no bmlmpi-run")
    done = run([launcher, "-n", "2", sys.executable, "-m", "mpi4py",
                str(JOBS / program)], env=job_env(BMLMPI_EXPECT_SIZE="3"), timeout=120)
    assert done.returncode != 0
    assert "world size is 2, expected 3" in done.stdout


def test_train_example_rejects_bad_options() -> None:
    done = run([sys.executable, str(JOBS / "train_example.py"), "--kill-rank", "1"],
               env=job_env(), timeout=60)
    assert done.returncode == 2
    assert "--kill-rank and --kill-step go together" in done.stdout


def test_train_example_writes_its_report_alone(tmp_path: Path) -> None:
    """One process is a world of one: the example runs, and its report says so."""
    out = tmp_path / "t.json"
    done = run([sys.executable, str(JOBS / "train_example.py"), "--epochs", "1",
                "--out", str(out)], env=job_env(), timeout=120)
    assert done.returncode == 0, done.stdout
    report = json.loads(out.read_text())
    assert report["world_size"] == 1 and report["params_identical"] is True
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]
