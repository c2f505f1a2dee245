"""What a user's runs leave behind: nothing in /dev/shm, and flight-recorder files only for a
failure (docs/tracing.md, docs/launching.md).

Each run gets an Open MPI shared-memory folder of its own (``OMPI_MCA_btl_sm_backing_
directory``, made in /dev/shm, so that other jobs on the machine do not count) and a
temporary folder of its own (``TMPDIR``: where the flight recorder's per-job folder and
Open MPI's session folders go), ``BMLMPI_TRACE_DIR`` unset; both folders are checked after
the run. Every run has a timeout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = "tests/ft/leftover_ranks.py"
TIMEOUT_S = 300
#: the session folders Open MPI shares between a user's singletons on a host
SHARED_SESSION = re.compile(r"ompi\.[^/]+(/jf\.0)?")

openmpi = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                             reason="Open MPI's btl/sm segments (the embedded wheel)")


@pytest.fixture
def folders(tmp_path):
    """(the run's environment, its shared-memory folder, its temporary folder)."""
    shm = Path(tempfile.mkdtemp(prefix="bmlmpi-test-sm-",
                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0",
           "OMPI_MCA_btl_sm_backing_directory": str(shm), "TMPDIR": str(tmp)}
    for name in ("BMLMPI_TRACE_DIR", "BMLMPI_STATUS_DIR", "BMLMPI_ALGORITHM", "BMLMPI_BCUBE"):
        env.pop(name, None)
    yield env, shm, tmp
    shutil.rmtree(shm, ignore_errors=True)


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} did not finish within {TIMEOUT_S} s: {exc.stdout!r}")


def segments_seen(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [p for line in res.stdout.splitlines() if line.startswith("LEFTOVER-SEGMENTS ")
            for p in line.split()[2:]]


def left(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@openmpi
def test_a_one_rank_run_leaves_nothing(folders):
    # python train.py without a launcher: a singleton, whose segment nobody else removes
    env, shm, tmp = folders
    res = run([sys.executable, PROGRAM, "clean"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LEFTOVER-DONE 0" in res.stdout, res.stdout
    seen = segments_seen(res)
    assert seen and all(p.startswith(str(shm)) for p in seen), seen   # there was one
    assert left(shm) == [], left(shm)
    # Open MPI's folder for every singleton of this user stays, empty (another singleton may
    # be making its own folder in it); this one's own folder is gone
    assert [p for p in left(tmp) if not SHARED_SESSION.fullmatch(p)] == [], left(tmp)



@openmpi
@pytest.mark.parametrize("program", ["bmlmpi.cli.bench", "bmlmpi.cli.calibrate"])
def test_a_programs_help_leaves_nothing(folders, program):
    # the programs start MPI when they load and print their help without building a
    # communicator: a singleton all the same
    env, shm, tmp = folders
    res = run([sys.executable, "-m", program, "--help"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert left(shm) == [], left(shm)
    assert [p for p in left(tmp) if not SHARED_SESSION.fullmatch(p)] == [], left(tmp)

@openmpi
def test_a_job_with_refused_calls_leaves_nothing(folders):
    # a call every rank refuses and one that rank 0 refuses (the others: RemoteArgumentError)
    # are errors reported on every rank, not hangs: no dump; the clean end's records (its
    # files in PyTorch's format included) are removed once every rank has finalized
    env, shm, tmp = folders
    # the dumps in PyTorch's format asked for go with the clean end's own
    env = {**env, "BMLMPI_TRACE_TORCH": str(tmp / "fr-rank_")}
    res = run([sys.executable, "-m", "bmlmpi.cli.launch", "-n", "3", "python", PROGRAM,
               "clean"], env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "LEFTOVER-DONE 0 ValueError BufferSpecError" in res.stdout, out
    for rank in (1, 2):
        assert f"LEFTOVER-DONE {rank} ValueError RemoteArgumentError" in res.stdout, out
    assert "flight recorder" not in res.stderr, res.stderr
    assert left(shm) == [], left(shm)
    assert left(tmp) == [], left(tmp)


@openmpi
def test_a_killed_rank_leaves_only_the_survivors_dumps(folders):
    # rank 1 is killed under --ft: its segment goes with the job, and what stays in the
    # temporary folder is the survivors' flight recorders of that failure
    env, shm, tmp = folders
    res = run([sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "--tolerate-lost", "-n", "3",
               "python", PROGRAM, "kill"], env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert res.stdout.count("LEFTOVER-DONE") == 2, out
    assert len(segments_seen(res)) >= 3, out
    assert left(shm) == [], left(shm)
    folders_left = [p for p in tmp.iterdir()]
    assert len(folders_left) == 1 and folders_left[0].name.startswith("bmlmpi-trace-"), \
        left(tmp)
    dumps = [json.loads(p.read_text()) for p in folders_left[0].iterdir()]
    assert sorted(d["world_rank"] for d in dumps) == [0, 2], left(tmp)
    assert all(d["reason"].startswith("fault-tolerant communicator noticed a failure")
               for d in dumps), [d["reason"] for d in dumps]


@openmpi
def test_bmlmpi_trace_leaves_nothing(folders, tmp_path):
    # a file-merging tool: it runs no MPI at all
    env, shm, tmp = folders
    timelines = tmp_path / "timelines"
    timelines.mkdir()
    doc = {"traceEvents": [{"name": "allreduce", "ph": "X", "ts": 5.0, "dur": 1, "pid": 0,
                            "tid": 0, "args": {}}], "otherData": {"dropped": 0}}
    (timelines / "timeline-h-p1-w0.json").write_text(json.dumps(doc))
    res = run([sys.executable, "-m", "bmlmpi.cli.trace", "--timeline", str(timelines)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run([sys.executable, "-m", "bmlmpi.cli.trace", str(timelines)], env)
    assert res.returncode == 2, res.stdout + res.stderr   # no flight-recorder dumps there
    assert left(shm) == [], left(shm)
    assert left(tmp) == [], left(tmp)
