"""The main job (``bmlmpi-bench --overview``, README command 1) and its reading.

No ranks: the reading's logic runs on synthetic sweep rows; the README's copy of a run's
reading is printed again from its own rows and must come out the same, line for line, so the
verdicts and the summary the README shows are the ones the job computes. The job itself runs
at two ranks in tests/test_mpi_launch.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bmlmpi.cli import bench, overview

ROOT = Path(__file__).resolve().parents[2]


def rows_for(size: int, blocks: dict[str, list[float]], chose: str = "ring") -> list[dict]:
    """Sweep rows at one size from each algorithm's per-block median calls (microseconds),
    with OSU's mean and the blocks' means set to what the reading must not read."""
    out = []
    for name, medians in blocks.items():
        row = {"algorithm": name, "size": size, "block_median_us": medians,
               "avg_us": -1.0, "median_block_us": -1.0, "block_us": [-1.0] * len(medians)}
        if name == "auto":
            row["chose"] = chose
        out.append(row)
    return out


def test_verdicts_need_every_block_to_agree():
    assert overview.verdict([0.5, 0.9, 0.99]) == "bmlmpi faster"
    assert overview.verdict([1.2, 3.0, 1.01]) == "native faster"
    assert overview.verdict([0.5, 1.5, 0.7]) == "no clear winner"
    assert overview.verdict([0.996, 0.5]) == "no clear winner"  # prints as 1.00: even
    assert overview.verdict([1.004, 1.5]) == "no clear winner"


def test_reading_picks_the_fastest_schedule_and_compares_it_block_by_block():
    rows = (rows_for(8, {"native": [1.0, 1.0, 1.0, 1.0], "auto": [1.1, 1.2, 1.1, 1.0],
                         "ring": [5.0, 6.0, 5.5, 5.0], "shm": [4.0, 4.5, 9.0, 4.0]},
                     chose="native")
            + rows_for(1 << 20, {"native": [100.0, 120.0, 90.0, 110.0],
                                 "auto": [60.0, 50.0, 70.0, 40.0],
                                 "ring": [80.0, 70.0, 95.0, 60.0],
                                 "shm": [40.0, 50.0, 45.0, 60.0]}, chose="shm")
            + rows_for(64 << 20, {"native": [10.0, 10.0, 10.0, 10.0],
                                  "auto": [9.0, 9.0, 9.0, 9.0],  # auto is not a schedule
                                  "ring": [8.0, 12.0, 9.0, 11.0],
                                  "bml": [9.5, 11.0, 12.0, 9.0]}))
    rs = overview.readings(rows)
    assert [(r.size, r.best, r.verdict) for r in rs] == [
        (8, "shm", "native faster"), (1 << 20, "shm", "bmlmpi faster"),
        (64 << 20, "ring", "no clear winner")]
    assert rs[1].block_ratios == pytest.approx((0.4, 50 / 120, 0.5, 60 / 110))
    assert rs[1].ratio == pytest.approx(47.5 / 105) and rs[1].auto_ratio == pytest.approx(55 / 105)
    assert rs[0].auto_ran == "native" and rs[2].ratio == pytest.approx(1.0)
    assert overview.summary_lines(rs) == [
        "# bmlmpi faster: 1 MiB (best/native 0.45-0.45; best: shm)",
        "# native faster: 8 B (best/native 4.25-4.25; best: shm)",
        "# no clear winner: 64 MiB (best/native 1.00-1.00; best: ring)"]
    text = overview.reading(rows, ranks=2, cores=2, nodes=1, oversubscribed=False)
    lines = text.splitlines()
    assert lines[:4] == overview.header_lines(2, 2, 1, False, 4)
    assert lines[4:7] == [overview.row_line(r) for r in rs]
    # a printed row reads back to itself
    assert [overview.row_line(overview.parse_row(line)) for line in lines[4:7]] == lines[4:7]
    assert "(oversubscribed)" in overview.header_lines(9, 2, 1, True, 4)[0]


def test_summary_says_when_a_verdict_has_no_size():
    rows = rows_for(8, {"native": [1.0, 1.0], "auto": [2.0, 2.0], "bml": [3.0, 4.0]})
    assert overview.summary_lines(overview.readings(rows)) == [
        "# bmlmpi faster: no size", "# native faster: 8 B (best/native 3.50-3.50; best: bml)",
        "# no clear winner: no size"]


def test_overview_fixes_its_rows_sizes_and_blocks():
    args = bench.parse_args(["--overview"])
    assert args.algorithm_list == list(overview.ALGORITHMS)
    assert args.blocks == overview.BLOCKS and args.full and args.validation
    assert "native" in args.algorithm_list and "auto" in args.algorithm_list
    for nbytes in overview.SIZES:
        timed, _ = overview.iterations(nbytes)
        assert timed >= 2 * overview.BLOCKS, nbytes
    for clash in (["-m", "4:64"], ["--algorithms", "bml,native"], ["--blocks", "2"],
                  ["--collective", "allgather"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--overview", *clash])
    assert bench.parse_args(["--overview", "-i", "4", "-x", "1"]).iterations == 4
    plain = bench.parse_args([])
    assert plain.algorithm_list == ["bml", "native"] and plain.blocks == 1
    assert (plain.min_size, plain.max_size) == (4, 1 << 20)


# -- the README: command 1 is the overview, and its copy of a run's reading is the job's -------

def readme_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## What the main job shows\n", 1)[1].split("\n## ", 1)[0]


def readme_reading() -> list[str]:
    blocks = re.findall(r"```text\n(.*?)```", readme_section(), re.S)
    assert len(blocks) == 1, "expected one ```text block: command 1's reading"
    return blocks[0].strip("\n").splitlines()


def test_readme_command_1_is_the_overview_at_two_ranks():
    from test_ci import readme_commands

    command = readme_commands()[0]
    assert command.endswith(".venv/bin/bmlmpi-run -n 2 .venv/bin/bmlmpi-bench --overview")


def test_readme_reading_is_what_the_job_prints_from_those_rows():
    lines = readme_reading()
    assert lines[0].startswith("# Reading: 2 ranks, one node of 2 cores")
    assert lines[:4] == overview.header_lines(2, 2, 1, False, overview.BLOCKS)
    body = [line for line in lines[4:] if not line.startswith("#")]
    rs = [overview.parse_row(line) for line in body]
    assert [r.size for r in rs] == list(overview.SIZES)
    assert body == [overview.row_line(r) for r in rs]  # each verdict is the blocks' verdict
    assert lines[4 + len(body):] == overview.summary_lines(rs)


def test_readme_reads_the_table_it_shows():
    """The paragraph names every column and verdict the job prints, and the sizes it gives
    for a verdict are the ones in the README's copy of the run."""
    text = " ".join(readme_section().split())
    for column in overview.HEADER[1:]:
        assert f"`{column}`" in text, column
    for v in overview.VERDICTS:
        assert f"`{v}`" in text, v
    rs = [overview.parse_row(line) for line in readme_reading()[4:] if not line.startswith("#")]
    for v in overview.VERDICTS:
        held = [overview.human(r.size) for r in rs if r.verdict == v]
        if held:
            assert f"`{v}` at {', '.join(held)}" in text, (v, held)
    assert re.search(r"command 1 took \d+ (s|min)", text), "the README states command 1's time"
