"""torch users' launchers, in the torch venv (:mod:`torch_venv`): torchrun never gives N silent
one-rank worlds on backend bmlmpi, and a script written for torchrun runs unchanged under
``bmlmpi-run`` (torchrun's flags, torch's variables, env://) with the losses gloo gives.

torchrun's workers are MPI singletons; the suite's OMPI_MCA_btl_sm_backing_directory holds
their shared-memory segments, and each launch gets a temporary folder of its own (torchrun's
log folders, Open MPI's session folders), removed after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a hang guard, not a timing: a refusal takes seconds, the imports most of them
TIMEOUT = 180
N = 2
#: what a DDP worker on gloo writes when it aborts as its process ends (torch 2.13, CPU)
GLOO_EXIT_ABORT = "terminate called without an active exception"


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_", "PMIX_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "BMLMPI_ALGORITHM", "BMLMPI_BCUBE",
                         "BMLMPI_COMPRESSION", "BMLMPI_FAULT_TOLERANT")}
    tmp = tempfile.mkdtemp(prefix="bmlmpi-trun-")
    env.update(TMPDIR=tmp, PYTHONUNBUFFERED="1", BMLMPI_CALIBRATE="0", BMLMPI_TIMEOUT="60",
               OMP_NUM_THREADS="1")
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{' '.join(cmd)} did not end within {TIMEOUT} s (a hang):\n{out[-4000:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def torchrun(py: Path) -> list[str]:
    return [str(py.parent / "torchrun"), "--standalone", "--nproc_per_node", str(N)]


FORMS = ("bmlmpi", "init_method", "plain")


def test_torchrun_is_refused_on_every_worker_with_the_bmlmpi_run_line(torch_python, tmp_path):
    """Each start form under torchrun (one launch tries them in turn): every worker raises
    SeparateWorlds naming the bmlmpi-run line that starts the job as one world, none runs a
    collective, every worker and the job fail."""
    res = run([*torchrun(torch_python), "tests/frameworks/torch_torchrun_ranks.py", ",".join(FORMS),
               str(tmp_path)])
    tail = (res.stdout + res.stderr)[-5000:]
    assert res.returncode != 0, tail
    assert not list(tmp_path.glob("ran.*")), f"a worker ran as a world of its own\n{tail}"
    line = (f"bmlmpi-run -n {N} python tests/frameworks/torch_torchrun_ranks.py "
            f"{','.join(FORMS)} {tmp_path}")
    for form in FORMS:
        for rank in range(N):
            refused = tmp_path / f"refused.{form}.{rank}"
            assert refused.exists(), f"{form}: worker {rank} was not refused\n{tail}"
            text = refused.read_text()
            assert f"rank {rank} of {N}" in text and line in text, text
    assert res.stderr.count("SeparateWorlds") >= N, tail   # each worker raised, exit status 1


def test_a_torchrun_script_runs_unchanged_under_bmlmpi_run_with_gloos_losses(torch_python,
                                                                             tmp_path):
    """jobs/ddp_torchrun.py (LOCAL_RANK, env://, the backend from the command line) under
    torchrun with gloo and under bmlmpi-run's torchrun form with bmlmpi: the same losses on
    every rank, and each rank's LOCAL_RANK and RANK those of its MPI rank.

    The gloo run is the reference, PyTorch's alone (bmlmpi is not imported in it). With
    torch 2.13 on CPU a DDP worker on gloo aborts as its process ends in about one run in
    four ("terminate called without an active exception", SIGABRT, after the job's last
    collective and its report; 3 of 12 runs of this script, 1 of 12 of a bare DDP loop, 0
    of 12 of an allreduce alone, 2026-11-29), which torchrun reports as a failed job. The
    reference's losses are taken from such a run when every rank printed and the report
    was written; the bmlmpi run must exit 0."""
    reports = {}
    for backend, launcher in (("gloo", torchrun(torch_python)),
                              ("bmlmpi", [str(torch_python), "-m", "bmlmpi.cli.launch",
                                          "--nproc_per_node", str(N)])):
        out = tmp_path / f"{backend}.json"
        res = run([*launcher, "jobs/ddp_torchrun.py", "--backend", backend, "--steps", "12",
                   "--out", str(out)])
        tail = (res.stdout + res.stderr)[-5000:]
        gloo_exit_abort = (backend == "gloo" and GLOO_EXIT_ABORT in res.stderr
                           and out.exists())
        assert res.returncode == 0 or gloo_exit_abort, tail
        seen = sorted(re.findall(r"rank (\d+) of (\d+), LOCAL_RANK (\d+), backend (\w+)",
                                 res.stdout))
        assert seen == [(str(r), str(N), str(r), backend) for r in range(N)], tail
        reports[backend] = json.loads(out.read_text())
    gloo, ours = reports["gloo"], reports["bmlmpi"]
    assert gloo["world_size"] == ours["world_size"] == N
    assert ours["losses"] == gloo["losses"], (gloo["losses"], ours["losses"])
    assert ours["losses"][0][-1] < ours["losses"][0][0]
