"""Runs tests/mpi under mpiexec at every rank count the design asks for.

Each launch is one ``bmlmpi-run -n N python -m pytest --with-mpi tests/mpi`` with a hard
timeout; inside, every bmlmpi wait has its own deadline (BMLMPI_TIMEOUT), so a hang surfaces
as a DeadlineExceeded naming the step and peer, and a stuck launch is killed here.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANKS = [int(n) for n in os.environ.get("BMLMPI_TEST_RANKS", "1,2,3,4,5,6,8,9,12").split(",")]
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_TEST_LAUNCH_TIMEOUT", "900"))


def run_ranks(n: int, args: list[str], timeout: int = LAUNCH_TIMEOUT,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """``args`` run by ``n`` ranks. Each launch has a tuning table of its own (none at first):
    what ``auto`` runs in it does not depend on what an earlier launch or job committed; and
    ``auto`` explores in blocks of one call (``BMLMPI_TUNING_BLOCK=1``: four calls per
    candidate) without a runoff (``BMLMPI_TUNING_RUNOFF=0``; the exploration's blocks and
    the runoff are tests/unit/test_tuner_noise.py's), so that a launch that runs signatures
    until they commit stays short."""
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable, *args]
    with tempfile.TemporaryDirectory(prefix="bmlmpi-tuning-") as tables:
        full_env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1",
                    "BMLMPI_TUNING": str(Path(tables) / "tuning.jsonl"),
                    "BMLMPI_TUNING_BLOCK": "1", "BMLMPI_TUNING_RUNOFF": "0", **(env or {})}
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout, env=full_env)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"")[-4000:]
            pytest.fail(f"mpiexec -n {n} did not finish within {timeout} s:\n{out!r}")


def sweep_tables(res: subprocess.CompletedProcess) -> list[tuple[str, list[list[str]]]]:
    """The sweep's OSU tables, checked to have finished well: (header, rows of fields)."""
    out = res.stdout
    assert res.returncode == 0, (out + res.stderr)[-4000:]
    tables = out.split("# Latency ratio")[0].split("# OSU MPI Allreduce Latency Test")[1:]
    return [(t, [line.split() for line in t.splitlines() if line[:1].isdigit()])
            for t in tables]


@pytest.mark.parametrize("n", RANKS)
def test_mpi_suite(n):
    res = run_ranks(n, ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
                        "--color=no", "tests/mpi"])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"{n} ranks: exit {res.returncode}\n{tail}"
    assert " passed" in res.stdout, tail


#: The reproducible tests that depend on the rank count (every algorithm and form, fast
#: paths, placements, zero ranks, the family, buckets, special values, integer-valued data):
#: the refusals, the pass-through of integers and MIN/MAX, a mode mismatch and a rank that
#: never starts are decided alike at every size and run in test_mpi_suite's launches.
REPRODUCIBLE_BY_SIZE = ("not refused and not pass_through and not differ_in_the_mode "
                        "and not never_starts")
REPRODUCIBLE_TESTS = 10


def test_reproducible_at_7_ranks():
    """Issue 38 asks for the reproducible tests at N = 1...8; test_mpi_suite runs them at
    every size of RANKS but 7 (a prime: bml is a one-level BCube, the ring's and the
    reduce-scatter's blocks split 7 ways), so one launch of 7 ranks runs them alone: every
    result bitwise the one-rank reference, nothing skipped."""
    res = run_ranks(7, ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
                        "--color=no", "-k", REPRODUCIBLE_BY_SIZE,
                        "tests/mpi/test_reproducible_mpi.py"])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"7 ranks: exit {res.returncode}\n{tail}"
    # each rank's summary, however PYTEST_ADDOPTS (inherited by the ranks) dresses it
    passed = re.findall(r"\b(\d+) passed, 4 deselected\b", res.stdout)
    assert passed == [str(REPRODUCIBLE_TESTS)] * 7, tail


def test_sweep_prints_osu_tables_and_validates(tmp_path):
    csv_path = tmp_path / "sweep.csv"
    res = run_ranks(3, ["-m", "bmlmpi.cli.bench", "-m", "4:65536", "-f", "-c", "--busbw",
                        "--algorithms", "all", "--blocks", "3", "-i", "12", "-x", "2",
                        "--csv", str(csv_path), "--expect-size", "3", "--no-progress"],
                    timeout=600)
    out = res.stdout
    tables = sweep_tables(res)
    assert len(tables) == 9, out  # bmlmpi's algorithms, passthrough, native
    printed_choice = {}
    for table, rows in tables:
        assert [int(r[0]) for r in rows] == [4 << i for i in range(15)], table
        auto = "Auto chose" in table  # auto's table shows what it ran, after Validation
        assert ("algorithm: auto" in table.splitlines()[0]) == auto, table
        assert all(r[-2 if auto else -1] == "Pass" and r[4] == "12" for r in rows), table
        if auto:
            printed_choice = {int(r[0]): r[-1] for r in rows}
    assert "# Size" in out and "Avg Latency(us)" in out and "Busbw(GB/s)" in out
    assert "# Latency ratio to native" in out
    ratio_head = out.split("# Latency ratio to native")[1].splitlines()[1].split()
    assert ratio_head[2:] == ["auto", "bml", "ring", "tree", "multitree", "hierarchical",
                              "shm", "passthrough"]
    import csv
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 * 15
    names = ["auto", "bml", "ring", "tree", "multitree", "hierarchical", "shm", "passthrough",
             "native"]
    assert list(dict.fromkeys(r["algorithm"] for r in rows)) == names
    # the baseline is mpi4py's blocking call, not a path of bmlmpi's
    assert {r["call"] for r in rows if r["algorithm"] == "native"} == {
        "mpi4py comm.Allreduce (blocking, user's communicator)"}
    assert all("bmlmpi" in r["call"] for r in rows if r["algorithm"] != "native")
    assert all(len(r["loadavg_start"].split()) == 3 and len(r["loadavg_end"].split()) == 3
               for r in rows)
    chosen = {r["chose"] for r in rows if r["algorithm"] == "auto"}
    assert printed_choice == {int(r["size"]): r["chose"] for r in rows
                              if r["algorithm"] == "auto"}
    assert chosen and chosen <= {"bml", "ring", "tree", "multitree", "hierarchical", "shm",
                                 "native"}, chosen
    assert all(r["blocks"] == "3" and float(r["median_block_us"]) > 0 for r in rows)
    assert {r["ranks"] for r in rows} == {"3"} and {r["oversubscribed"] for r in rows} == {"True"}


def test_alltoall_sweep_prints_osu_alltoall_and_validates():
    """``--collective alltoall`` at 3 ranks: OSU's all-to-all table for every algorithm, the
    size one rank-pair block, every row validated (block j of rank r's buffer carries r and
    j), busbw algbw·(N−1)/N, the baseline mpi4py's own ``comm.Alltoall``."""
    res = run_ranks(3, ["-m", "bmlmpi.cli.bench", "--collective", "alltoall", "-m", "8:4096",
                        "-f", "-c", "--busbw", "--algorithms", "all", "-i", "4", "-x", "1",
                        "--expect-size", "3", "--no-progress"], timeout=300)
    out = res.stdout
    assert res.returncode == 0, (out + res.stderr)[-4000:]
    tables = out.split("# Latency ratio")[0].split(
        "# OSU MPI All-to-All Personalized Exchange Latency Test")[1:]
    # auto, hierarchical, shm, pairwise, bruck, bcube, passthrough, native
    assert len(tables) == 8, out
    for table in tables:
        rows = [line.split() for line in table.splitlines() if line[:1].isdigit()]
        assert [int(r[0]) for r in rows] == [8 << i for i in range(10)], table
        assert all("Pass" in r for r in rows), table
        algbw, busbw = float(rows[-1][5]), float(rows[-1][6])
        assert busbw == pytest.approx(algbw * 2 / 3, abs=2e-3), table
    ratio_head = out.split("# Latency ratio to native MPI_Alltoall")[1].splitlines()[1].split()
    assert ratio_head[2:] == ["auto", "hierarchical", "shm", "pairwise", "bruck", "bcube",
                              "passthrough"]


def test_readme_mpiexec_by_hand(tmp_path):
    """README's quick start: Open MPI's mpiexec started by hand needs --allow-run-as-root as
    root and --oversubscribe on fewer cores than ranks, or refuses to start; with the flags the
    README gives, train.py runs on 4 ranks, and with shared-memory windows (BMLMPI_ALGORITHM=
    shm) prints no error line. The venv's bin first on PATH, as activated."""
    readme = (ROOT / "README.md").read_text()
    quick = " ".join(readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0].split())
    code = readme.split("Save this as `train.py`:", 1)[1].split("```python\n", 1)[1]
    (tmp_path / "train.py").write_text(code.split("```", 1)[0])
    flagged = "mpiexec --allow-run-as-root --oversubscribe --mca osc ^ucx -n 4 python train.py"
    plain = "mpiexec --mca osc ^ucx -n 4 python train.py"
    assert f"`{flagged}` as root on fewer than 4 cores" in quick
    assert f"`{plain}` as a user on 4 cores or more" in quick
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "BMLMPI_TIMEOUT": "60", "BMLMPI_ALGORITHM": "shm"}
    env.pop("OMPI_MCA_osc", None)

    def run(command: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["timeout", "300", *command.split()], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=330)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} did not finish within 330 s")

    if os.geteuid() == 0 or (os.cpu_count() or 1) < 4:
        refused = run(plain)
        assert refused.returncode != 0, refused.stdout
        said = refused.stdout + refused.stderr
        assert ("attempt to run as root" if os.geteuid() == 0 else "not enough slots") in said
    res = run(flagged)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "4 ranks: mean of element 1 = 2.5" in res.stdout, res.stdout
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert not errors, res.stderr[-3000:]


def test_main_job_prints_its_reading():
    """README command 1's job at two ranks, with few iterations: every row validated, and the
    reading after the tables is what the reading's logic makes of the rows printed above it,
    in the README's layout."""
    from bmlmpi.cli import overview

    res = run_ranks(2, ["-m", "bmlmpi.cli.bench", "--overview", "-i", "8", "-x", "1",
                        "--no-progress"], timeout=600)
    tables = sweep_tables(res)
    assert [t.splitlines()[0].rsplit(" ", 1)[1].rstrip(")") for t, _ in tables] == \
        list(overview.ALGORITHMS)
    for table, rows in tables:
        assert [int(r[0]) for r in rows] == list(overview.SIZES), table
        assert all("Pass" in r and r[4] == "8" for r in rows), table
    text = res.stdout.split("\n# Reading: ", 1)[1]
    lines = ("# Reading: " + text).strip().splitlines()
    cores = os.cpu_count() or 1
    assert lines[:4] == overview.header_lines(2, cores, 1, 2 > cores, overview.BLOCKS)
    body = lines[4:4 + len(overview.SIZES)]
    rs = [overview.parse_row(line) for line in body]
    assert [r.size for r in rs] == list(overview.SIZES)
    assert body == [overview.row_line(r) for r in rs]
    assert lines[4 + len(body):] == overview.summary_lines(rs)
    assert {r.best for r in rs} <= set(overview.SCHEDULES)
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(lines[1:4]) in readme  # how to read it and the columns, as the README shows
