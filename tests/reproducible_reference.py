"""Reference implementations of the reproducible format's steps, for the unit tests to check
the numba kernels against: Python integers and ``fractions.Fraction`` on one value at a time,
written from the rules in ``bmlmpi/reproducible/format.py``'s docstring, sharing no code with
the kernels. Slow: small arrays only."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from bmlmpi.reproducible.format import NAN, NEG_INF, NOT_NEG_ZERO, POS_INF, SENTINEL, Format

INF = float("inf")


def reals(x: np.ndarray, fmt: Format) -> list[float]:
    """Every real position of ``x`` as a Python float (exact: bfloat16 patterns through
    float32)."""
    flat = np.ascontiguousarray(x).reshape(-1).view(fmt.storage)
    if fmt.name == "bfloat16":
        flat = (flat.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return [float(v) for v in flat]


def is_neg_zero(v: float) -> bool:
    return v == 0 and math.copysign(1.0, v) < 0


def block_exponents(x: np.ndarray, fmt: Format) -> np.ndarray:
    values = reals(x, fmt)
    nblocks = -(-len(values) // fmt.block)
    out = np.zeros((nblocks, 2), np.int16)
    for b in range(nblocks):
        top, flag = SENTINEL, 0
        for v in values[b * fmt.block:(b + 1) * fmt.block]:
            if math.isnan(v) or math.isinf(v) or is_neg_zero(v):
                flag = 1
            elif v != 0:
                top = max(top, math.frexp(v)[1])
        out[b] = top, flag
    return out


def cut(e: int, fmt: Format) -> int:
    return 0 if e == SENTINEL else fmt.W * math.floor((e - fmt.P) / fmt.W)


def truncated(v: float, c: int) -> int:
    """trunc(v / 2^c), exactly (int() of a Fraction truncates toward zero)."""
    if math.isnan(v) or math.isinf(v):
        return 0
    return int(Fraction(v) / Fraction(2) ** c)


def encode(x: np.ndarray, agreed: np.ndarray, fmt: Format, start: int = 0) -> list[int]:
    """The integer T of every real position (two-word formats: before the split)."""
    return [truncated(v, cut(int(agreed[(start + i) // fmt.block, 0]), fmt))
            for i, v in enumerate(reals(x, fmt))]


def split(t: int) -> tuple[int, int]:
    """A two-word pair, toward zero: hi = trunc(t / 2^36), lo = t - hi * 2^36."""
    hi = int(Fraction(t, 2 ** 36))
    return hi, t - hi * 2 ** 36


def value_of(words: np.ndarray) -> list[int]:
    """The integers a word array holds (two-word rows: hi * 2^36 + lo)."""
    w = np.asarray(words)
    if w.ndim == 1:
        return [int(v) for v in w]
    return [int(h) * 2 ** 36 + int(lo) for h, lo in w]


def rounded(q: Fraction, fmt: Format) -> float | Fraction:
    """``q`` rounded to ``fmt`` (nearest, ties to even, subnormals), as an exact Fraction,
    or +-INF past the largest finite value."""
    if q == 0:
        return Fraction(0)
    mag = abs(q)
    # 2^e <= mag < 2^(e+1)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** e > mag:
        e -= 1
    quantum = max(e - (fmt.precision - 1), fmt.quantum)
    scaled = mag / Fraction(2) ** quantum
    n = math.floor(scaled)
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n == 0:
        return -0.0 if q < 0 else 0.0   # IEEE: an underflow keeps the sign
    result = n * Fraction(2) ** quantum
    if result > Fraction(fmt.largest):
        return INF if q > 0 else -INF
    return result if q > 0 else -result


def decode_one(v: int, c: int, special: int, flagged: bool, fmt: Format) -> float | Fraction:
    """The rules of one position: specials first (in flagged blocks), then the rounding."""
    if flagged:
        if special & NAN or (special & POS_INF and special & NEG_INF):
            return float("nan")
        if special & POS_INF:
            return INF
        if special & NEG_INF:
            return -INF
        if v == 0 and not special & NOT_NEG_ZERO:
            return -0.0
    return rounded(Fraction(v) * Fraction(2) ** c, fmt)


def specials(x: np.ndarray, agreed: np.ndarray, fmt: Format, start: int = 0) -> list[int]:
    out = []
    for i, v in enumerate(reals(x, fmt)):
        if not agreed[(start + i) // fmt.block, 1]:
            out.append(0)
        elif math.isnan(v):
            out.append(NAN | NOT_NEG_ZERO)
        elif v == INF:
            out.append(POS_INF | NOT_NEG_ZERO)
        elif v == -INF:
            out.append(NEG_INF | NOT_NEG_ZERO)
        else:
            out.append(0 if is_neg_zero(v) else NOT_NEG_ZERO)
    return out


def same(result: float, expected: float | Fraction) -> bool:
    """Equal values, equal signs of zero, NaN to NaN."""
    if isinstance(expected, float) and math.isnan(expected):
        return math.isnan(result)
    if isinstance(expected, float) and math.isinf(expected):
        return result == expected
    if math.isinf(result) or math.isnan(result):
        return False
    if expected == 0:
        return result == 0 and (math.copysign(1.0, result) < 0) == (
            isinstance(expected, float) and is_neg_zero(expected))
    return Fraction(result) == expected
