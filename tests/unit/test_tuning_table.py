"""The tuning table (bmlmpi.tuning_table): the JSON-lines format, refusing corrupt or
impossible entries with one warning, atomic saves that merge under a lock, two writers at
once, BMLMPI_TUNING."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bmlmpi import tuning_table
from bmlmpi.selection import Candidate, Explanation
from bmlmpi.tuner import Tuner, TuningKey
from bmlmpi.tuning_table import TableEntry, layout_name, load, save, table_path

ROOT = Path(__file__).resolve().parents[2]
SHAPE = dict(ranks=4, layout="1x4")
HEAD = dict(host="h", mpi="open-mpi-v5", **SHAPE)


def key(size: int, collective: str = "allreduce", root: int | None = None) -> TuningKey:
    return TuningKey(collective, size, "float64", "" if collective == "allgather" else "sum",
                     4, "1x4", root)


def quiet_load(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load(path, **SHAPE)


def test_layout_names():
    assert layout_name([4]) == "1x4"
    assert layout_name([2, 2, 2]) == "3x2"
    assert layout_name([3, 4]) == "4+3"
    with pytest.raises(ValueError):
        layout_name([])


def test_the_path_is_beside_the_calibration_cache_unless_bmlmpi_tuning_names_one(
        monkeypatch, tmp_path):
    monkeypatch.setenv("BMLMPI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BMLMPI_TUNING", raising=False)
    assert table_path("node 1", "Open MPI v5.0", 4, "1x4") == \
        tmp_path / "tuning-node-1-open-mpi-v5.0-n4-1x4.jsonl"
    monkeypatch.setenv("BMLMPI_TUNING", str(tmp_path / "mine.jsonl"))
    assert table_path("node 1", "Open MPI v5.0", 4, "1x4") == tmp_path / "mine.jsonl"


def test_a_tuner_commit_round_trips_and_seeds_the_next_job(tmp_path):
    explanation = Explanation("allreduce", 1 << 17, 8, 4, "bml", "cost model", "test",
                              (Candidate("bml", 3e-4, 3e-4, 1.0),
                               Candidate("ring", 4e-4, 4e-4, 1.0)))
    t = Tuner()
    t.begin(key(1 << 20), explanation)
    for i in range(t.exploration_calls(key(1 << 20))):
        name = t.choose(key(1 << 20), i)
        t.record(key(1 << 20), name, {"bml": 3e-4, "ring": 1e-4, "native": 5e-4}[name])
    t.commit(key(1 << 20), t.proposal(key(1 << 20)))
    path = tmp_path / "t.jsonl"
    assert save(path, tuning_table.entries_from(t), **HEAD)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"format": "bmlmpi-tuning", "version": 1, "host": "h",
                                    "mpi": "open-mpi-v5", "ranks": 4, "layout": "1x4"}
    assert json.loads(lines[1]) == {
        "collective": "allreduce", "bytes": 1 << 20, "dtype": "float64", "op": "sum",
        "root": None, "algorithm": "ring", "why": "measured",
        "candidates": ["bml", "ring", "native"], "medians": [3e-4, 1e-4, 5e-4]}
    entries = quiet_load(path)
    nxt = Tuner()
    tuning_table.seed(nxt, entries)
    report = nxt.begin(key(1 << 20), explanation)
    assert (report.chosen, report.why) == ("ring", "table")


def test_corrupt_and_impossible_lines_are_refused_with_one_warning_the_rest_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    good = TableEntry(key(64), "native").to_line()
    rows = [json.dumps({"format": "bmlmpi-tuning", "version": 1, "host": "h", "mpi": "m",
                        "ranks": 4, "layout": "1x4"}),
            good,                                                               # line 2
            "{not json",                                                        # 3
            TableEntry(key(128), "bml").to_line().replace('"bml"', '"warp"'),    # 4
            TableEntry(key(256, "reduce", 0), "bml").to_line().replace('"bml"', '"ring"'),
            TableEntry(key(512), "bml").to_line().replace("512", "500"),        # 6
            json.dumps({**json.loads(TableEntry(key(1024), "bml").to_line()),
                        "candidates": ["bml", "ring"], "medians": [1e-3, -1.0]}),  # 7
            good,                                                               # 8
            "",
            TableEntry(key(2048, "bcast", 1), "bml").to_line().replace(
                '"root": 1', '"root": 9'),                                      # 10
            TableEntry(key(4096, "allgather"), "ring").to_line()]               # 11
    path.write_text("\n".join(rows) + "\n")
    with pytest.warns(RuntimeWarning) as caught:
        entries = load(path, **SHAPE)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert str(path) in text and "refused 7 entries" in text
    for number, cause in ((3, "line 3: Expecting"), (4, "'warp'"), (5, "ring does not run"),
                          (6, "not 0 or a power of two"), (7, "median -1.0"),
                          (8, "a second entry for the signature of line 2"),
                          (10, "root in 0..3")):
        assert f"line {number}:" in text and cause in text, (number, text)
    assert set(entries) == {key(64), key(4096, "allgather")}
    # a save keeps the refused lines as the user wrote them, and the sound ones
    assert save(path, {key(8): TableEntry(key(8), "bml")}, **HEAD)
    kept = path.read_text().splitlines()
    assert "{not json" in kept and sum(line == good for line in kept) == 2
    with pytest.warns(RuntimeWarning, match="refused 7 entries"):
        assert set(load(path, **SHAPE)) == {key(8), key(64), key(4096, "allgather")}


def test_a_table_for_another_shape_or_version_is_refused_whole_and_never_overwritten(
        tmp_path):
    path = tmp_path / "t.jsonl"
    assert save(path, {key(8): TableEntry(key(8), "bml")}, **HEAD)
    before = path.read_text()
    with pytest.warns(RuntimeWarning, match=r"t.jsonl:1: a table for 4 ranks in layout "
                                            r"'1x4', not 8 in '2x4'"):
        assert load(path, ranks=8, layout="2x4") == {}
    with pytest.warns(RuntimeWarning, match="not saved"):
        other = TuningKey("allreduce", 8, "float64", "sum", 8, "2x4")
        assert not save(path, {other: TableEntry(other, "bml")}, host="h", mpi="m",
                        ranks=8, layout="2x4")
    assert path.read_text() == before
    path.write_text(before.replace('"version": 1', '"version": 2'))
    with pytest.warns(RuntimeWarning, match="version 2, this bmlmpi reads 1"):
        assert load(path, **SHAPE) == {}


def test_a_save_waits_for_the_lock_then_gives_up_with_a_warning(tmp_path):
    path = tmp_path / "t.jsonl"
    with open(tmp_path / "t.jsonl.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(RuntimeWarning, match="stayed locked"):
            assert not save(path, {key(8): TableEntry(key(8), "bml")}, lock_seconds=0.2,
                            **HEAD)
    assert not path.exists()
    assert save(path, {key(8): TableEntry(key(8), "bml")}, **HEAD)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["t.jsonl", "t.jsonl.lock"]


WRITER = """
import sys
from bmlmpi.tuner import TuningKey
from bmlmpi.tuning_table import TableEntry, save
path, first = sys.argv[1], int(sys.argv[2])
for i in range(first, first + 25):
    k = TuningKey("allreduce", 1 << i, "float64", "sum", 4, "1x4")
    assert save(path, {k: TableEntry(k, "bml" if first else "ring")}, host="h", mpi="m",
                ranks=4, layout="1x4", lock_seconds=60)
"""


def test_two_jobs_saving_at_once_lose_nothing(tmp_path):
    path = tmp_path / "t.jsonl"
    jobs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(first)], cwd=ROOT)
            for first in (0, 25)]
    try:
        codes = [job.wait(timeout=120) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=10)
    assert codes == [0, 0]
    entries = quiet_load(path)
    assert sorted(k.size for k in entries) == [1 << i for i in range(50)]
    assert {e.algorithm for k, e in entries.items() if k.size < 1 << 25} == {"ring"}
    assert {e.algorithm for k, e in entries.items() if k.size >= 1 << 25} == {"bml"}
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["t.jsonl", "t.jsonl.lock"]
