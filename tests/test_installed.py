"""After README command 1 alone (``pip install .``, not editable), a new user's next steps work
from the repository root, where Python finds the source folder ``bmlmpi/`` before the installed
package: an import, the benchmark, the calibration, a job script, the perf tools.

The venv is built once per source tree (tests/installed_venv.py); every launch has a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from installed_venv import ROOT, bare_env, installed_venv

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def venv() -> Path:
    return installed_venv()


def run(cmd: list[str], env: dict[str, str] | None = None,
        timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env or bare_env(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} did not finish within {timeout} s: {exc.stdout!r} {exc.stderr!r}")


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"{res.args}: exit {res.returncode}\n{res.stdout[-3000:]}\n" \
                                f"{res.stderr[-3000:]}"
    return res.stdout


def test_installed_not_editable(venv):
    site = ok(run([str(venv / "bin" / "python"), "-c",
                   "import bmlmpi.api, pathlib; print(pathlib.Path(bmlmpi.api.__file__).parent)"],
                  env=bare_env(), timeout=60)).strip()
    # From the root the source folder is what Python imports; elsewhere the installed copy.
    assert Path(site) == ROOT / "bmlmpi"
    away = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import bmlmpi.kernels; print(bmlmpi.kernels.__file__)"],
                          cwd="/", env=bare_env(), capture_output=True, text=True, timeout=60)
    assert "site-packages" in ok(away)


def test_import_from_the_root(venv):
    out = ok(run([str(venv / "bin" / "python"), "-c",
                  "import bmlmpi, bmlmpi.kernels; bmlmpi.Communicator; "
                  "print(bmlmpi.kernels.__file__)"]))
    assert Path(out.strip()).resolve().parent == (ROOT / "kernels").resolve()


def test_bench_from_the_root(venv):
    out = ok(run([str(venv / "bin" / "python"), "-m", "bmlmpi.cli.bench", "--algorithms",
                  "bml,native", "-m", "4:64", "-i", "3", "-x", "1", "-c", "--no-progress"]))
    assert "# Size" in out and "Pass" in out and "Fail" not in out, out


def test_calibrate_from_the_root(venv, tmp_path):
    ok(run([str(venv / "bin" / "python"), "-m", "bmlmpi.cli.calibrate", "--help"], timeout=60))
    out = ok(run([str(venv / "bin" / "python"), "-m", "bmlmpi.cli.calibrate", "--fresh",
                  "--algorithms", "bml,native", "--max-bytes", "1024"],
                 env=bare_env(BMLMPI_CACHE_DIR=str(tmp_path))))
    assert "native" in out, out


def test_perf_baseline_help_from_the_root(venv):
    assert "usage" in ok(run([str(venv / "bin" / "python"), "-m", "perf.baseline", "--help"],
                             timeout=60))


def test_job_script_from_the_root_activated(venv, tmp_path):
    """jobs/README: submit from the repository root, with the venv activated."""
    env = bare_env(BMLMPI_RANKS="2", BMLMPI_SIZES="4:64", BMLMPI_ALGORITHMS="bml,native",
                   BMLMPI_ITERS="3", BMLMPI_WARMUP="1", BMLMPI_OUT=str(tmp_path / "out"),
                   VIRTUAL_ENV=str(venv))
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    ok(run(["timeout", str(TIMEOUT_S), "jobs/sweep-mpirun.sh"], env=env, timeout=TIMEOUT_S + 30))
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert rows, rows
    assert os.listdir(tmp_path / "out")


def test_readme_quick_start_from_the_root_activated(venv):
    """README's quick start as written: venv activated, `bmlmpi-run -n N python train.py`.
    `python -c` from the repository root puts the root first on sys.path, as `train.py` saved
    there would, so the program imports the source folder."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in quick and "bmlmpi-run -n 4 python train.py" in quick
    code = quick.split("Save this as `train.py`:", 1)[1].split("```python\n", 1)[1]
    code = code.split("```", 1)[0]
    env = bare_env(VIRTUAL_ENV=str(venv))
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    res = run(["timeout", str(TIMEOUT_S), "bmlmpi-run", "-n", "2", "python", "-c", code],
              env=env, timeout=TIMEOUT_S + 30)
    out = ok(res)
    assert "2 ranks: mean of element 1 = 1.5" in out, out
    # A new user reads any "Error" line as a failure (Open MPI's osc/ucx prints one per rank
    # and window on a node without an RDMA device unless the launcher leaves it out).
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert not errors, res.stderr


# -- launching from a venv that is not activated -------------------------------------------

def test_bmlmpi_run_starts_its_own_python(venv):
    """``.venv/bin/bmlmpi-run -n 2 python ...`` with the venv not activated: the ranks run the
    venv's interpreter (the system's has no bmlmpi), with the venv's bin first on PATH; an
    unknown BMLMPI_* name gets one warning, from rank 0."""
    program = ("import os, sys, bmlmpi, bmlmpi.config; from mpi4py import MPI; "
               "bmlmpi.config.get('BMLMPI_TIMEOUT'); "
               "print('RANK', MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size, sys.executable, "
               "os.environ['PATH'].split(':')[0], flush=True)")
    res = run(["timeout", str(TIMEOUT_S), str(venv / "bin" / "bmlmpi-run"), "-n", "2",
               "python", "-c", program], env=bare_env(BMLMPI_ALGORTHM="ring"))
    out = ok(res)
    ranks = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("RANK "))
    bin_dir = str(venv / "bin")
    assert [(r[0], r[1], str(Path(r[2]).parent), r[3]) for r in ranks] == \
        [(str(r), "2", bin_dir, bin_dir) for r in (0, 1)], out
    warned = [line for line in res.stderr.splitlines() if "BMLMPI_ALGORTHM" in line]
    assert warned == ["bmlmpi: BMLMPI_ALGORTHM is not a bmlmpi variable and is ignored; did "
                      "you mean BMLMPI_ALGORITHM? (python -m bmlmpi.config lists them)"], \
        res.stderr


def _jobs_copy(tmp_path: Path, venv: Path | None) -> Path:
    """jobs/ in a checkout of its own whose .venv is ``venv`` (None: no .venv)."""
    import shutil
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "jobs", checkout / "jobs")
    if venv is not None:
        (checkout / ".venv").symlink_to(venv)
    return checkout / "jobs"


def test_job_script_finds_the_checkouts_venv_not_activated(venv, tmp_path):
    jobs = _jobs_copy(tmp_path, venv)
    env = bare_env(BMLMPI_RANKS="2", BMLMPI_SIZES="4:64", BMLMPI_ALGORITHMS="bml,native",
                   BMLMPI_ITERS="3", BMLMPI_WARMUP="1", BMLMPI_OUT=str(tmp_path / "out"))
    res = run(["timeout", str(TIMEOUT_S), str(jobs / "sweep-mpirun.sh")], env=env,
              timeout=TIMEOUT_S + 30)
    ok(res)
    assert f"{jobs.parent}/.venv/bin/bmlmpi-run -n 2" in res.stderr, res.stderr
    assert (tmp_path / "out" / "sweep.csv").stat().st_size > 0


def test_job_script_without_mpi_fails_clearly_and_creates_nothing(tmp_path):
    jobs = _jobs_copy(tmp_path, None)
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run([str(jobs / "train-mpirun.sh")], cwd=work, env=bare_env(
        BMLMPI_PYTHON="/usr/bin/python3"), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "bmlmpi job: error: /usr/bin/python3 cannot import bmlmpi and mpi4py" in res.stderr
    assert not list(work.iterdir()), "the job left a results folder behind"
