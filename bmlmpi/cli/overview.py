"""``bmlmpi-bench --overview``: the main job, what bmlmpi does on the machine it runs on.

A sweep chosen to show where bmlmpi's algorithms matter: every schedule but hierarchical
(bml, ring, tree, multitree, shm), ``auto`` and the baseline ``native`` (mpi4py's blocking
``comm.Allreduce``), at nine sizes from 8 B to 64 MiB, interleaved in :data:`BLOCKS` blocks
per size so a change in the machine's load hits every row alike, validated. Iterations fall
with the size (:func:`iterations`) so the job takes a minute or two on two cores.

After the OSU tables it prints a reading computed from its own measurements
(:func:`reading`). Its times are typical calls: each block's median call (averaged over the
ranks), then the median over the blocks, which calls slowed by a busy machine do not move as
they move OSU's mean. Per size: native's time, the fastest schedule and its time as a ratio to
native's, the range of that ratio over the blocks, ``auto``'s ratio and what it ran, and a
verdict that needs no threshold: ``bmlmpi faster`` when the fastest schedule beat native in
every block, ``native faster`` when native beat it in every block (to the two decimals
printed), ``no clear winner`` otherwise. Three lines then name the sizes of each verdict.

MPI-free: :mod:`.bench` measures and hands its rows here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

#: The rows the overview times. hierarchical is left out: its second tier runs across nodes,
#: which the main job's one node does not have.
ALGORITHMS = ("auto", "bml", "ring", "tree", "multitree", "shm", "native")
#: Schedules that compete for "best" (auto is judged on its own column; native is the baseline)
SCHEDULES = tuple(a for a in ALGORITHMS if a not in ("auto", "native"))
#: 8 B (latency-bound), 1 KiB, 16 KiB, then four times apart up to 64 MiB (bandwidth-bound).
SIZES = (8, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
BLOCKS = 4

VERDICTS = ("bmlmpi faster", "native faster", "no clear winner")
HEADER = ("# Size", "native(us)", "best", "best(us)", "best/native", "blocks", "auto/native",
          "auto ran", "verdict")
WIDTHS = (10, 12, 11, 12, 12, 13, 12, 10, 0)


def iterations(nbytes: int) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) at ``nbytes``: OSU's 1000/100 would take
    minutes on a busy machine (every call is followed by a barrier, and each barrier waits for
    a core), so fewer, falling with the size, and every block holds at least two calls."""
    if nbytes <= 16 << 10:
        return 200, 20
    if nbytes <= 256 << 10:
        return 100, 10
    if nbytes <= 1 << 20:
        return 40, 4
    if nbytes <= 4 << 20:
        return 16, 2
    return 8, 2


@dataclass(frozen=True)
class SizeReading:
    """One size of the reading: native's time and the fastest schedule's (medians of the
    blocks, microseconds), their ratio, the fastest schedule's ratio to native in each block,
    auto's ratio to native and what auto ran. Everything a printed row shows, and all that
    its verdict and the summary depend on."""

    size: int
    native_us: float
    best: str
    best_us: float
    ratio: float
    block_ratios: tuple[float, ...]
    auto_ratio: float
    auto_ran: str

    @property
    def verdict(self) -> str:
        return verdict(self.block_ratios)


def verdict(block_ratios: tuple[float, ...] | list[float]) -> str:
    """``bmlmpi faster`` when every block's ratio, to the two decimals the reading prints, is
    below 1, ``native faster`` when every one is above 1, else ``no clear winner`` (the blocks
    disagree, or one is even: the difference is inside the machine's noise)."""
    shown = [round(r, 2) for r in block_ratios]
    if all(r < 1 for r in shown):
        return VERDICTS[0]
    if all(r > 1 for r in shown):
        return VERDICTS[1]
    return VERDICTS[2]


def readings(rows: list[dict[str, Any]]) -> list[SizeReading]:
    """The reading of a sweep's rows (``block_median_us``, each block's median call, per row;
    ``auto`` rows with ``chose``), one per size: each row's time is the median over its
    blocks, and the fastest schedule is the one with the lowest."""
    by = {(r["algorithm"], r["size"]): r for r in rows}

    def typical(row: dict[str, Any]) -> float:
        return float(statistics.median(row["block_median_us"]))

    out = []
    for size in sorted({r["size"] for r in rows}):
        native = by[("native", size)]
        best = min((by[(a, size)] for a in SCHEDULES if (a, size) in by), key=typical)
        auto = by.get(("auto", size))
        native_us, best_us = typical(native), typical(best)
        out.append(SizeReading(
            size=size, native_us=native_us, best=best["algorithm"], best_us=best_us,
            ratio=best_us / native_us,
            block_ratios=tuple(b / n for b, n in zip(best["block_median_us"],
                                                     native["block_median_us"], strict=True)),
            auto_ratio=typical(auto) / native_us if auto else float("nan"),
            auto_ran=auto.get("chose", "-") if auto else "-"))
    return out


def human(nbytes: int) -> str:
    """8 B, 64 KiB, 4 MiB."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def row_line(r: SizeReading) -> str:
    lo, hi = min(r.block_ratios), max(r.block_ratios)
    cells = (str(r.size), f"{r.native_us:.2f}", r.best, f"{r.best_us:.2f}", f"{r.ratio:.2f}",
             f"{lo:.2f}-{hi:.2f}", f"{r.auto_ratio:.2f}", r.auto_ran, r.verdict)
    return _cells(cells)


def _cells(cells: tuple[str, ...]) -> str:
    first = f"{cells[0]:<{WIDTHS[0]}}"
    return first + "".join(f"{c:>{w}}" if w else f"  {c}"
                           for c, w in zip(cells[1:], WIDTHS[1:], strict=True))


def parse_row(line: str) -> SizeReading:
    """A printed row read back (:func:`row_line`'s inverse, to its two decimals): the
    README's copy of a run's reading is checked by printing it again from this."""
    size, native, best, best_us, ratio, blocks, auto, ran, *_ = line.split()
    lo, hi = blocks.split("-")
    return SizeReading(size=int(size), native_us=float(native), best=best,
                       best_us=float(best_us), ratio=float(ratio),
                       block_ratios=(float(lo), float(hi)), auto_ratio=float(auto),
                       auto_ran=ran)


def summary_lines(rs: list[SizeReading]) -> list[str]:
    """One line per verdict: the sizes it holds and the range of best/native there."""
    lines = []
    for v in VERDICTS:
        held = [r for r in rs if r.verdict == v]
        if not held:
            lines.append(f"# {v}: no size")
            continue
        ratios = [r.ratio for r in held]
        names = sorted({r.best for r in held}, key=SCHEDULES.index)
        lines.append(f"# {v}: {', '.join(human(r.size) for r in held)} (best/native "
                     f"{min(ratios):.2f}-{max(ratios):.2f}; best: {', '.join(names)})")
    return lines


def reading(rows: list[dict[str, Any]], ranks: int, cores: int, nodes: int,
            oversubscribed: bool) -> str:
    """The text the overview prints after its tables (``cores``: rank 0's node's)."""
    rs = readings(rows)
    blocks = len(rs[0].block_ratios) if rs else 0
    return "\n".join([*header_lines(ranks, cores, nodes, oversubscribed, blocks),
                      *(row_line(r) for r in rs), *summary_lines(rs)])


def header_lines(ranks: int, cores: int, nodes: int, oversubscribed: bool,
                 blocks: int) -> list[str]:
    """The reading's first lines: where it ran, how to read it, the column titles."""
    where = "one node" if nodes == 1 else f"{nodes} nodes"
    over = " (oversubscribed)" if oversubscribed else ""
    lines = [f"# Reading: {ranks} ranks, {where} of {cores} cores{over}. Times: each block's "
             f"median call, the median over {blocks} interleaved blocks;",
             "# best = the fastest schedule; blocks = best/native in each block, lowest-highest;",
             "# verdict: bmlmpi faster / native faster when every block agrees, else no clear "
             "winner.",
             _cells(HEADER)]
    return lines
