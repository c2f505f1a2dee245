"""The reproducible sum's error on the issue's test vectors, against the exactly rounded sum
(``math.fsum`` per element for float64; the exact Fraction sum rounded once for the others),
next to numpy's own float sum of the same addends.

Each vector is ``ranks`` contributions of ``positions`` values (default 8 x 4096): normal
values; mixed magnitudes (1e-8 to 1e8 in every block; float16 1e-7 to 1e4, its range);
heavy cancellation (the last contribution cancels the others' float sum to a small residue);
subnormals (with a few normals near the smallest); zeros (+0, -0, x and -x); specials (NaN
and +-inf scattered among normal values). The reproducible sum is the collective's steps on
one process: MAX of the block exponents, the words summed, the special bytes OR-ed, one
decode. numpy's sum is ``np.sum(rows, axis=0)`` in the dtype (bfloat16: float32 additions
rounded to bfloat16 after each, bmlmpi's bf16 wire rounding).

Columns: the largest and the summed absolute error over the vector, the elements where each
sum is not the exactly rounded one, and the elements where the reproducible sum errs more
than numpy's. A special element counts as an error of inf when
its rule is broken (NaN for NaN, the infinity, the sign of a zero).

    python perf/reproducible/accuracy.py [--ranks 8] [--positions 4096]
"""

from __future__ import annotations

import argparse
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import reproducible_reference as ref  # noqa: E402  (the exact rounding, from tests/)

from bmlmpi.kernels import wire_formats  # noqa: E402
from bmlmpi.reproducible import format as rf  # noqa: E402

DTYPES = ("float16", "bfloat16", "float32", "float64")
VECTORS = ("normal", "mixed", "cancellation", "subnormal", "zeros", "specials")


def storage(values: np.ndarray, name: str) -> np.ndarray:
    """float64 values in ``name``'s storage (bfloat16: its bit patterns, nearest even)."""
    with np.errstate(over="ignore"):
        if name == "bfloat16":
            return wire_formats.BF16.encode(values.astype(np.float32))
        return values.astype(name)


def plain_sum(rows: np.ndarray, name: str) -> np.ndarray:
    """numpy's own sum of the contributions, in the dtype."""
    with np.errstate(over="ignore", invalid="ignore"):
        if name != "bfloat16":
            return np.sum(rows, axis=0)
        acc = rows[0]
        for row in rows[1:]:
            acc = wire_formats.BF16.encode(wire_formats.BF16.decode(acc)
                                           + wire_formats.BF16.decode(row))
        return acc


def vector(kind: str, name: str, ranks: int, positions: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (ranks, positions)
    if kind == "normal":
        return storage(rng.standard_normal(shape), name)
    if kind == "mixed":
        lo, hi = (-7, 4) if name == "float16" else (-8, 8)
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        return storage(sign * 10.0 ** rng.uniform(lo, hi, shape), name)
    if kind == "cancellation":
        big = 1e3 if name == "float16" else 1e6
        rows = storage(rng.standard_normal(shape) * big, name)
        head = plain_sum(rows[:-1], name)
        fmt = rf.format_for(rows.dtype, "bfloat16" if name == "bfloat16" else None)
        head64 = np.array(ref.reals(head, fmt)) if name == "bfloat16" else head.astype(float)
        rows[-1] = storage(-head64 + rng.standard_normal(positions) * 1e-3, name)
        return rows
    if kind == "subnormal":
        tiny = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126,
                "float64": 2.0 ** -1022}[name]
        values = rng.uniform(-1, 1, shape) * tiny
        values[:, ::17] *= 3.0   # a few normals near the smallest
        return storage(values, name)
    if kind == "zeros":
        choice = rng.integers(0, 4, positions)
        values = np.zeros(shape)
        values[:, choice == 0] = -0.0                            # every addend -0
        values[:, choice == 1] = np.where(rng.random((ranks, int((choice == 1).sum()))) < 0.5,
                                          -0.0, 0.0)           # +0 and -0
        x = rng.standard_normal(int((choice == 2).sum()))
        values[0, choice == 2], values[1, choice == 2] = x, -x   # x and -x, zeros elsewhere
        values[:, choice == 3] = 0.0
        return storage(values, name)
    if kind == "specials":
        values = rng.standard_normal(shape)
        pick = rng.random(shape)
        values[pick < 0.02] = np.nan
        values[(pick >= 0.02) & (pick < 0.05)] = np.inf
        values[(pick >= 0.05) & (pick < 0.08)] = -np.inf
        return storage(values, name)
    raise ValueError(kind)


def reproducible_sum(rows: np.ndarray, fmt: str | None) -> np.ndarray:
    agreed = np.max([rf.block_exponents(r, fmt=fmt) for r in rows], axis=0)
    words = sum(rf.encode(r, agreed, fmt=fmt) for r in rows)
    special = None
    if agreed[:, 1].any():
        special = np.bitwise_or.reduce([rf.specials(r, agreed, fmt=fmt) for r in rows])
    return rf.decode(words, agreed, rows.dtype, special, fmt=fmt)


def exactly_rounded(column: list[float], fmt: rf.Format) -> float | Fraction:
    """The exactly rounded sum of one element's addends, by IEEE's special-value rules."""
    if any(math.isnan(v) for v in column) or (math.inf in column and -math.inf in column):
        return math.nan
    if math.inf in column or -math.inf in column:
        return math.inf if math.inf in column else -math.inf
    if all(v == 0 for v in column):
        return -0.0 if all(ref.is_neg_zero(v) for v in column) else 0.0
    if fmt.name == "float64":
        try:
            total = math.fsum(column)
        except OverflowError:
            return math.copysign(math.inf, sum(Fraction(v) for v in column))
        return Fraction(total) if total != 0 else 0.0
    return ref.rounded(sum(Fraction(v) for v in column), fmt)


def error(got: float, want: float | Fraction) -> float:
    if isinstance(want, float) and (math.isnan(want) or math.isinf(want) or want == 0):
        return 0.0 if ref.same(got, want) else math.inf
    if math.isnan(got) or math.isinf(got):
        return math.inf
    return float(abs(Fraction(got) - want))


def errors(rows: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per element: the reproducible sum's and numpy's sum's error."""
    fmt_name = "bfloat16" if name == "bfloat16" else None
    fmt = rf.get(name)
    ours = ref.reals(reproducible_sum(rows, fmt_name), fmt)
    plain = ref.reals(plain_sum(rows, name), fmt)
    columns = np.array([ref.reals(r, fmt) for r in rows]).T
    want = [exactly_rounded(list(col), fmt) for col in columns]
    return (np.array([error(g, w) for g, w in zip(ours, want, strict=True)]),
            np.array([error(g, w) for g, w in zip(plain, want, strict=True)]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--positions", type=int, default=4096)
    args = parser.parse_args(argv)
    print(f"{args.ranks} contributions x {args.positions} positions; error against the "
          f"exactly rounded sum")
    print("| vector | dtype | max ours | max numpy | sum ours | sum numpy | inexact ours "
          "| inexact numpy | ours worse |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in VECTORS:
        for name in DTYPES:
            rows = vector(kind, name, args.ranks, args.positions)
            ours, plain = errors(rows, name)
            print(f"| {kind} | {name} | {ours.max():.3g} | {plain.max():.3g} | "
                  f"{ours.sum():.3g} | {plain.sum():.3g} | {int((ours > 0).sum())} | "
                  f"{int((plain > 0).sum())} | {int((ours > plain).sum())} |")


if __name__ == "__main__":
    main()
