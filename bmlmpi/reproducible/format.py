"""The reproducible wire format: floating-point addends as integers truncated at a cut agreed
per block, summed exactly by any schedule, rounded once.

The result of a reproducible SUM is a function of the multiset of addends alone, whatever the
algorithm, segmentation, rank count (ranks holding zeros added), order of ranks or re-run,
because integer addition is associative and nothing is rounded before the end.

Steps of one reduction (``x``: a rank's vector; every rank runs the same steps):

1. **Block exponents** (:func:`block_exponents`). Positions are grouped in blocks of
   ``block`` (256) consecutive global positions (complex values count as two real positions,
   real part first). Per block, ``E`` = the largest ``frexp`` exponent of the block's finite
   non-zero addends (``|x| < 2^E``), :data:`SENTINEL` where there is none, and a flag: the
   block holds a NaN, an infinity or a ``-0``. One int16 array of shape (blocks, 2),
   MAX-reduced over ranks (MAX of the 0/1 flags is their OR): the pre-exchange.
2. **Cut** (:func:`cuts`): ``c = W * floor((E - P) / W)``, a multiple of the bin width ``W``,
   so at least ``P`` and fewer than ``P + W`` bits are kept below the block's top.
3. **Encode** (:func:`encode`): ``T(x) = trunc(x * 2^-c)``, toward zero, exactly (integer
   shifts of the IEEE mantissa). ``|T| < 2^(P + W)``. One int64 word per real value, or for
   float64 two words ``(hi, lo)``, ``hi = trunc(T * 2^-36)``, ``lo = T - hi * 2^36``.
4. **Sum** the words with integer SUM by any schedule (MPI's own ``MPI_SUM`` on int64
   included). No partial sum of up to ``2^H`` addends overflows a word, so no schedule ever
   wraps.
5. **Special bits** (:func:`specials`), only for the elements of flagged blocks: a byte per
   element (NaN, +inf, -inf, not -0), OR-reduced over ranks (MPI's ``BOR`` on uint8).
6. **Decode** (:func:`decode`): ``V * 2^c`` rounded once to the dtype, to nearest with ties
   to even, subnormals and overflow to infinity included, by integer arithmetic on ``V``.

Parameters (:class:`Format`; fixed per dtype, the same on every rank)::

    dtype      precision  P   W  words  H   wire bytes per value (vs the dtype's own)
    float16    11         32  8  1      23  8  (4x)
    bfloat16   8          32  8  1      23  8  (4x)
    float32    24         32  8  1      23  8  (2x)
    float64    53         64  8  2      27  16 (2x)

``H``: ``2^H`` addends per element at most (ranks times what each contributes; an
:class:`~bmlmpi.reproducible.Accumulator`'s contents count as the addends it holds), from
``P + W + H <= 63`` per word: one word holds ``|T| < 2^40``; float64's words hold
``|hi|, |lo| < 2^36``.

Accuracy: every addend loses less than ``2^c`` to truncation, and the decode rounds once, so
``|result - exact| <= ulp(result) / 2 + n * 2^c <= ulp(result) / 2 + n * 2^(E - P)`` for
``n`` addends (:func:`bound`). A plain float sum errs by up to about ``n * u * sum|x|`` with
``u`` = 2^-11, 2^-8, 2^-24, 2^-53: this format's term is ``2^(P - p)`` times smaller on the same
addends (float16: 2^21; bfloat16: 2^24; float32: 2^8; float64: 2^11). Where every value of a
block lies within ``2^(P - p)`` of the block's largest (or is a multiple of ``2^c``, as the
subnormals of a block of small values are), nothing is truncated and the sum is the exactly
rounded one.

Where an addend is encoded does not matter: only that each is truncated once at the agreed
cut and the integers are summed exactly. So the addends may travel as they are and be encoded
where they meet (:func:`sum_contributions`: the contributions of the same positions, each
encoded, summed in cache and decoded in one pass, the special bytes ORed from the addends
themselves): the bits of the words' sum, for any format.

Cost, where the addends meet (a blocking allreduce whose algorithm serves both halves, a
reduce-scatter; on the plain communicator, :mod:`bmlmpi.call_formats`): the wire carries
the values themselves (a plain reduce-scatter's and allgather's bytes) plus 4 bytes per
block for the pre-exchange (0.4 % of float32's values at 256 values a block); memory: the
received column of this rank's block (one value of each rank per position); compute: one
pass over the input (exponents) and one over the column (the fused sum). Elsewhere (the
words' path): the wire carries 8 (float64: 16) bytes per value plus the pre-exchange and,
only where a block holds a special value, one byte per value of that block; memory: the
words (one int64 per value, two for float64); compute: two passes over the input
(exponents, encode) and one over the words (decode). The kernels are numba, in
:mod:`bmlmpi.kernels.reproducible`.

Special values (the rules; IEEE 754 round-to-nearest addition applied to the multiset):

* any NaN, or both +inf and -inf: NaN (a quiet NaN, sign clear, no payload);
* otherwise +inf or -inf if one is present;
* a finite exact sum beyond the largest finite value rounds to +-inf (round to nearest);
* ``-0`` exactly when every addend is ``-0`` (``-0 + +0 = +0``), so ranks adding ``+0`` give
  ``+0``; a non-zero integer sum never rounds to zero (it is a multiple of ``2^c``, and
  ``c`` lies below the dtype's quantum only where every addend is a multiple of the quantum).

AVG (:func:`average`): the decoded sum divided by the rank count, one more rounding, as
:func:`bmlmpi.kernels.scale_avg` divides (float16 in float32, float32 and float64 in their own
dtype; bfloat16 in float32 and rounded to nearest even): reproducible for a fixed rank count
(an average depends on it by definition). PROD and compressors have no reproducible form
and are refused by the collectives in this mode.

Decisions beyond the design note: two int16 lanes per block (E and one flag: NaN, inf or -0)
rather than four flags, since the per-element byte exchange resolves which; bfloat16 values
are taken as uint16 bit patterns (``fmt="bfloat16"``), the form bmlmpi's bf16 wire carries
them in, since numpy has no bfloat16; a sentinel block's cut is 0 (its words are all 0).

Registry: a format is registered once (:func:`register`) and looked up by name or dtype,
as :mod:`bmlmpi.kernels.wire_formats` registers the 16-bit wire formats; the collectives take
the format from here, and the schedules run integer SUM on its words unchanged.

Source: the fixed-boundary bins of ReproBLAS (Demmel and Nguyen, "Parallel reproducible
summation", IEEE Transactions on Computers 2015; Ahrens, Demmel and Nguyen, "Algorithms for
efficient reproducible floating point summation", ACM TOMS 2020), used here as one exact
integer per block cut instead of several floating-point bins; IEEE 754-2008 for the
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .. import kernels
from ..kernels import wire_formats

#: block exponent of a block without any finite non-zero addend (MAX ignores it)
SENTINEL = -32768
#: a two-word integer is ``hi * 2^SPLIT + lo``
SPLIT = 36
#: bits of a special-value byte
NAN, POS_INF, NEG_INF, NOT_NEG_ZERO = 1, 2, 4, 8
#: values per block (global positions; a constant of the format)
BLOCK = 256


@dataclass(frozen=True)
class Format:
    """One dtype's reproducible format (module docstring).

    ``storage``: the dtype values arrive in (uint16 for bfloat16's bit patterns); ``bits``:
    the unsigned integer of the same width; ``precision``: significand bits, the hidden one
    included; ``exponent_bits`` and ``bias``: IEEE's; ``P``, ``W``, ``H``, ``words``: the
    format's parameters; ``block``: values per block.
    """

    name: str
    storage: np.dtype
    bits: np.dtype
    precision: int
    exponent_bits: int
    bias: int
    P: int
    W: int
    H: int
    words: int
    block: int = BLOCK

    @property
    def nbits(self) -> int:
        return self.bits.itemsize * 8

    @property
    def mbits(self) -> int:
        return self.precision - 1

    @property
    def emask(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def quantum(self) -> int:
        """The exponent of the smallest subnormal's unit: every value is a multiple of 2^it."""
        return 1 - self.bias - self.mbits

    @property
    def largest(self) -> float:
        """The largest finite value."""
        return float(Fraction(2 ** self.precision - 1) * Fraction(2) ** (
            self.emask - 1 - self.bias - self.mbits))

    @property
    def bins(self) -> int:
        """W-bit bins an accumulator keeps per value: from floor((E - P) / W) to the top."""
        return -(-(self.P - 1) // self.W) + 1

    @property
    def max_addends(self) -> int:
        return 1 << self.H


_FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add ``fmt`` (its name must be new, its words wide enough: ``P + W + H <= 63`` per
    word); returns it."""
    if not isinstance(fmt, Format):
        raise TypeError(f"register takes a Format, not {type(fmt).__name__}")
    if fmt.name in _FORMATS:
        raise ValueError(f"reproducible format {fmt.name!r} is already registered")
    if fmt.words == 1:
        fits = fmt.P + fmt.W + fmt.H <= 63
    else:
        # |T| < 2^(P + W) splits into |hi|, |lo| < 2^SPLIT
        fits = fmt.words == 2 and fmt.P + fmt.W <= 2 * SPLIT and SPLIT + fmt.H <= 63
    if not fits:
        raise ValueError(f"reproducible format {fmt.name!r}: P + W + H must fit its words")
    _FORMATS[fmt.name] = fmt
    return fmt


def names() -> tuple[str, ...]:
    """The registered formats' names."""
    return tuple(_FORMATS)


def get(name: str) -> Format:
    """The format called ``name``; ValueError naming the registered ones otherwise."""
    fmt = _FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown reproducible format {name!r}; formats: "
                         f"{', '.join(_FORMATS)}")
    return fmt


FLOAT16 = register(Format("float16", np.dtype(np.float16), np.dtype(np.uint16), 11, 5, 15,
                          P=32, W=8, H=23, words=1))
BFLOAT16 = register(Format("bfloat16", np.dtype(np.uint16), np.dtype(np.uint16), 8, 8, 127,
                           P=32, W=8, H=23, words=1))
FLOAT32 = register(Format("float32", np.dtype(np.float32), np.dtype(np.uint32), 24, 8, 127,
                          P=32, W=8, H=23, words=1))
FLOAT64 = register(Format("float64", np.dtype(np.float64), np.dtype(np.uint64), 53, 11, 1023,
                          P=64, W=8, H=27, words=2))

_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}


def format_for(dtype: Any, fmt: str | None = None) -> Format:
    """The format reducing arrays of ``dtype``: by name with ``fmt`` (``"bfloat16"`` takes
    uint16 bit patterns), else float16, float32, float64 and complex64/128 (two real parts).
    TypeError for anything else (integers are reproducible already)."""
    dt = np.dtype(dtype)
    if fmt is not None:
        found = get(fmt)
        if _REAL.get(dt, dt) != found.storage:
            raise TypeError(f"reproducible format {fmt!r} takes {found.storage} arrays, "
                            f"not {dt}")
        return found
    real = _REAL.get(dt, dt)
    if real.kind == "f" and real.name in _FORMATS and real.isnative:
        return _FORMATS[real.name]
    raise TypeError(f"reproducible reductions take float16, float32, float64, complex64, "
                    f"complex128, or bfloat16 as uint16 bit patterns (fmt='bfloat16'); not "
                    f"{dt} (integer sums are reproducible as they are)")


def _bits(x: Any, fmt: str | None) -> tuple[Format, np.ndarray]:
    a = np.asarray(x)
    f = format_for(a.dtype, fmt)
    flat = np.ascontiguousarray(a).reshape(-1)
    return f, flat.view(f.storage).view(f.bits)


#: the kernels' load of 16-bit patterns: 1 float16, 2 bfloat16 (wider formats load floats)
_SIXTEEN = {"float16": 1, "bfloat16": 2}
#: the lowest cut at which decode's float64 path rounds once (float64: its results are normal
#: there; float32 is rounded once by the float64 -> float32 store at any cut)
_FAST_CUT = {"float32": -(1 << 20), "float64": -1022}


def _kernel_values(f: Format, bits: np.ndarray) -> np.ndarray:
    """What the kernels read values from: float arrays as floats, 16-bit patterns as they are."""
    return bits if f.nbits == 16 else bits.view(f.storage)


def blocks(count: int, fmt: Format) -> int:
    """The number of blocks covering ``count`` real positions."""
    return -(-count // fmt.block)


def block_exponents(x: Any, fmt: str | None = None, *, parallel: bool | None = None
                    ) -> np.ndarray:
    """The pre-exchange array of ``x`` (its whole vector, global position 0 first): int16 of
    shape (blocks, 2), per block the largest exponent ``E`` (``|x| < 2^E``) of its finite
    non-zero values (:data:`SENTINEL` if none) and 1 where it holds a NaN, an inf or a -0.
    MAX-reduce it over the ranks to get the agreed array."""
    f, bits = _bits(x, fmt)
    out = np.empty((blocks(bits.size, f), 2), np.int16)
    from ..kernels import reproducible as rk
    t = f.bits.type
    rk.run("exponents", bits.nbytes, bits, out, f.block, t((1 << (f.nbits - 1)) - 1),
           t(f.emask << f.mbits), t(1 << (f.nbits - 1)), f.mbits, f.bias, parallel=parallel)
    return out


def cuts(agreed: np.ndarray, fmt: str | Format) -> np.ndarray:
    """Per block the cut ``c`` (int64): ``W * floor((E - P) / W)``, 0 for a sentinel block."""
    f = fmt if isinstance(fmt, Format) else get(fmt)
    e = check_agreed(agreed, f)[:, 0].astype(np.int64)
    return np.where(e == SENTINEL, 0, f.W * ((e - f.P) // f.W))


def check_agreed(agreed: Any, f: Format, used: slice = slice(None)) -> np.ndarray:
    """``agreed`` as the kernels take it; ValueError unless it has the pre-exchange's form
    and every exponent of the blocks ``used`` (default: all) is one ``f``'s values can
    have (or the sentinel): a call that reads a few blocks (a piece of the pipelined meet)
    checks those, not the whole array each time."""
    a = np.asarray(agreed)
    if a.dtype != np.int16 or a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"the agreed block exponents must be int16 of shape (blocks, 2), "
                         f"got {a.dtype} {a.shape}")
    e = a[used, 0]
    flags = a[used, 1]
    # |x| < 2^E: from the smallest subnormal (E = quantum + 1) to the largest value's 2^emax+1
    bad = (e != SENTINEL) & ((e < f.quantum + 1) | (e > f.emask - f.bias))
    if bad.any() or ((flags != 0) & (flags != 1)).any():
        raise ValueError(f"the agreed block exponents hold values no {f.name} array gives "
                         f"(exponents {f.quantum + 1}..{f.emask - f.bias} or {SENTINEL}, "
                         f"flags 0 or 1): MAX-reduce the ranks' block_exponents")
    return np.ascontiguousarray(a)


def _range(start: int, count: int, agreed: np.ndarray, f: Format) -> tuple[int, int]:
    if not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"start must be a non-negative position, got {start!r}")
    first, last = start // f.block, blocks(start + count, f)
    if count and last > agreed.shape[0]:
        raise ValueError(f"positions {start}..{start + count} need {last} blocks; the agreed "
                         f"array has {agreed.shape[0]}")
    return first, last if count else first


def encode(x: Any, agreed: np.ndarray, fmt: str | None = None, *, start: int = 0,
           out: np.ndarray | None = None, parallel: bool | None = None) -> np.ndarray:
    """``x``'s words at the agreed cuts: int64 of shape (n,) (two-word formats: (n, 2)), n
    the real positions of ``x``, which start at global position ``start`` (in real
    positions). NaN, inf and zeros encode as 0. ValueError if a value of ``x`` lies above its
    block's agreed exponent (the agreement did not include this rank's values)."""
    f, bits = _bits(x, fmt)
    agreed = check_agreed(agreed, f)
    first, last = _range(start, bits.size, agreed, f)
    shape = (bits.size,) if f.words == 1 else (bits.size, 2)
    if out is None:
        out = np.empty(shape, np.int64)
    elif out.shape != shape or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous int64 array of shape {shape}")
    bad = np.zeros(max(last - first, 0), np.int64)
    from ..kernels import reproducible as rk
    rk.run("encode", out.nbytes, _kernel_values(f, bits), agreed,
           out.reshape(-1), bad, start, first, last, f.block,
           _SIXTEEN.get(f.name, 0), f.P, f.W, f.words == 2, parallel=parallel)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} values lie above their block's agreed exponent: "
                         f"the agreed array must be the MAX over every rank's block_exponents")
    return out


def specials(x: Any, agreed: np.ndarray, fmt: str | None = None, *, start: int = 0,
             parallel: bool | None = None) -> np.ndarray:
    """Per real position of ``x`` a uint8 of :data:`NAN`, :data:`POS_INF`, :data:`NEG_INF`
    and :data:`NOT_NEG_ZERO` (set for every value but -0), 0 outside flagged blocks;
    OR-reduce it over the ranks for the elements of flagged blocks (:func:`flagged`)."""
    f, bits = _bits(x, fmt)
    agreed = check_agreed(agreed, f)
    first, last = _range(start, bits.size, agreed, f)
    out = np.empty(bits.size, np.uint8)
    from ..kernels import reproducible as rk
    rk.run("specials", bits.nbytes, bits, agreed, out, start, first, last, f.block, f.nbits,
           f.mbits, f.emask, parallel=parallel)
    return out


def flagged(agreed: np.ndarray, count: int, fmt: str | Format, *, start: int = 0
            ) -> np.ndarray:
    """The positions (relative to ``start``) of ``count`` real positions that lie in flagged
    blocks: the elements whose special bytes are exchanged."""
    f = fmt if isinstance(fmt, Format) else get(fmt)
    agreed = check_agreed(agreed, f)
    pos = np.arange(start, start + count)
    return np.flatnonzero(agreed[pos // f.block, 1] != 0) if count else pos


def decode(words: np.ndarray, agreed: np.ndarray, dtype: Any, special: np.ndarray | None = None,
           *, fmt: str | None = None, start: int = 0, out: np.ndarray | None = None,
           parallel: bool | None = None) -> np.ndarray:
    """The summed ``words`` (from :func:`encode`, added over ranks) as values of ``dtype``
    (complex: pairs of real positions), each rounded once to nearest even. ``special``: the
    OR-reduced bytes of :func:`specials` per real position (read only in flagged blocks), or
    None where no block is flagged. ``start``: the global real position of ``words[0]``."""
    f = format_for(dtype, fmt)
    dt = np.dtype(dtype)
    agreed = check_agreed(agreed, f)
    w = np.asarray(words)
    n = w.shape[0] if w.ndim else 0
    want = (n,) if f.words == 1 else (n, 2)
    if w.dtype != np.int64 or w.shape != want:
        raise ValueError(f"{f.name} words must be int64 of shape (n,{'' if f.words == 1 else ' 2'})"
                         f", got {w.dtype} {w.shape}")
    if n % (dt.itemsize // f.storage.itemsize):
        raise ValueError(f"{n} real positions do not make whole {dt} values")
    w = np.ascontiguousarray(w)
    first, last = _range(start, n, agreed, f)
    if special is None:
        if n and agreed[first:last, 1].any():
            raise ValueError("a block is flagged in the agreed array: decode needs the "
                             "OR-reduced special bytes")
        sp = np.zeros(0, np.uint8)
    else:
        sp = np.ascontiguousarray(special, dtype=np.uint8)
        if sp.shape != (n,):
            raise ValueError(f"special must hold one byte per real position ({n})")
    if out is None:
        out = np.empty(n // (dt.itemsize // f.storage.itemsize), dt)
    elif out.dtype != dt or out.size * (dt.itemsize // f.storage.itemsize) != n or (
            not out.flags.c_contiguous):
        raise ValueError(f"out must be a contiguous {dt} array of {n} real positions")
    target = out.reshape(-1).view(f.storage).view(f.bits)
    from ..kernels import reproducible as rk
    rk.run("decode", w.nbytes, w.reshape(-1), agreed, sp, _kernel_values(f, target),
           target, start, first, last, f.block, f.nbits, f.mbits, f.bias, f.emask, f.P, f.W,
           f.words == 2, f.nbits > 16, _FAST_CUT.get(f.name, 0), parallel=parallel)
    return out


def sum_contributions(contributions: np.ndarray, agreed: np.ndarray, dtype: Any = None, *,
                      fmt: str | None = None, start: int = 0, out: np.ndarray | None = None,
                      parallel: bool | None = None) -> np.ndarray:
    """The reproducible sum of ``contributions`` (shape (addends, n): each row one rank's
    values of the same ``n`` positions, the first at global real position ``start``; complex
    rows as their pairs of reals), each addend encoded where they meet and summed in one
    pass (:func:`bmlmpi.kernels.reproducible` ``"sum"``): bitwise what :func:`decode` gives
    for the sum of every row's :func:`encode` with the rows' :func:`specials` ORed, without
    the words in memory or the special bytes' exchange. ``dtype``: the rows' (default).
    ValueError, as :func:`encode`'s, if a value lies above its block's agreed exponent."""
    rows = np.asarray(contributions)
    if rows.ndim != 2:
        raise ValueError(f"contributions must be of shape (addends, n), got {rows.shape}")
    dt = np.dtype(rows.dtype if dtype is None else dtype)
    if rows.dtype != dt:
        raise ValueError(f"contributions of {rows.dtype} do not sum to {dt}")
    f = format_for(dt, fmt)
    rows = np.ascontiguousarray(rows)
    addends, n = rows.shape
    if out is None:
        out = np.empty(n, dt)
    if addends == 0:
        _target(out, dt, f, n).fill(0)
        return out
    column = rows.reshape(-1).view(f.storage).view(f.bits)
    m = column.size // addends
    return _sum(f, dt, None, column, np.arange(addends, dtype=np.int64) * m, m, agreed, start,
                out, n, parallel)


def sum_addends(first: np.ndarray, others: np.ndarray, offsets: Any, agreed: np.ndarray, *,
                fmt: str | None = None, start: int = 0, out: np.ndarray | None = None,
                parallel: bool | None = None) -> np.ndarray:
    """The reproducible sum of the addends of the same ``n`` positions, as
    :func:`sum_contributions`, where they lie apart: ``first`` (``n`` values, the first at
    global real position ``start``) and ``others[o:o + n]`` for each ``o`` in ``offsets``
    (one flat array: an executor's scratch, where each message of a step landed). ``out``
    (default: a new array) may be ``first``'s memory (summed in place), never a part of
    ``others``."""
    one = np.asarray(first)
    dt = one.dtype
    f = format_for(dt, fmt)
    if one.ndim != 1 or not one.flags.c_contiguous:
        raise ValueError("first must be a contiguous one-dimensional array")
    rest = np.asarray(others)
    if rest.dtype != dt or rest.ndim != 1 or not rest.flags.c_contiguous:
        raise ValueError(f"others must be a contiguous one-dimensional {dt} array")
    n = one.size
    offs = np.ascontiguousarray(offsets, np.int64).reshape(-1)
    if offs.size and (offs.min() < 0 or offs.max() + n > rest.size):
        raise ValueError(f"an offset in {offs.tolist()} leaves others ({rest.size} values) "
                         f"before {n} values")
    if out is None:
        out = np.empty(n, dt)
    elif np.may_share_memory(out, one) and not (
            out.__array_interface__["data"][0] == one.__array_interface__["data"][0]
            and out.strides == one.strides):
        raise ValueError("out partly overlaps first; pass first's memory or a separate array")
    if np.may_share_memory(out, rest):
        raise ValueError("out overlaps others")
    per = 2 if dt.kind == "c" else 1
    return _sum(f, dt, one.reshape(-1).view(f.storage).view(f.bits),
                rest.reshape(-1).view(f.storage).view(f.bits), offs * per, n * per, agreed,
                start, out, n, parallel)


def _target(out: np.ndarray, dt: np.dtype, f: Format, n: int) -> np.ndarray:
    """``out``'s bits, ValueError unless a contiguous ``dt`` array of ``n`` values."""
    if out.dtype != dt or out.shape != (n,) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous {dt} array of {n} values")
    return out.reshape(-1).view(f.storage).view(f.bits)


def _sum(f: Format, dt: np.dtype, first: np.ndarray | None, rest: np.ndarray,
         offs: np.ndarray, m: int, agreed: np.ndarray, start: int, out: np.ndarray, n: int,
         parallel: bool | None) -> np.ndarray:
    """The fused sum's kernel on bits (``m`` real positions): ``first`` (None: the first
    addend is ``rest[offs[0]:]``, a column's) and ``rest[o:]`` for each of ``offs`` (in real
    positions), at the agreed cuts, into ``out`` (``n`` values of ``dt``)."""
    target = _target(out, dt, f, n)
    # only the blocks the positions touch are read, so only they are checked (a bad start
    # is refused by _range)
    used = (slice(start // f.block, blocks(start + m, f))
            if isinstance(start, (int, np.integer)) and start >= 0 else slice(0))
    agreed = check_agreed(agreed, f, used)
    lo, last = _range(start, m, agreed, f)
    bad = np.zeros(max(last - lo, 0), np.int64)
    from ..kernels import reproducible as rk
    values = None if first is None else _kernel_values(f, first)
    addends = offs.size + (first is not None)
    rk.run("sum", m * f.storage.itemsize * addends, values, first, _kernel_values(f, rest),
           rest, offs, m, agreed, _kernel_values(f, target), target, bad, start, lo, last,
           f.block, _SIXTEEN.get(f.name, 0), f.P, f.W, f.nbits, f.mbits, f.bias, f.emask,
           f.nbits > 16, _FAST_CUT.get(f.name, 0), parallel=parallel)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} values lie above their block's agreed exponent: "
                         f"the agreed array must be the MAX over every rank's block_exponents")
    return out


def average(result: np.ndarray, n: int, fmt: str | None = None) -> np.ndarray:
    """AVG from a decoded sum, in place: divided by the rank count ``n`` with one more
    rounding (float16 through float32, as :func:`bmlmpi.kernels.scale_avg`; bfloat16 bit
    patterns in float32, rounded to nearest even)."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"the rank count must be a positive integer, got {n!r}")
    f = format_for(result.dtype, fmt)
    if f is BFLOAT16:
        values = wire_formats.BF16.decode(result) / np.float32(n)
        result[...] = wire_formats.BF16.encode(values).reshape(result.shape)
        return result
    reals = result.reshape(-1).view(f.storage) if result.dtype.kind == "c" else result
    kernels.scale_avg(reals, int(n))
    return result


def bound(count: int, agreed: np.ndarray, fmt: str | Format) -> np.ndarray:
    """Per block the truncation part of the error bound of ``count`` addends, ``count *
    2^c`` (float64; 0 where ``2^c`` is below float64's range, where the addends are exact
    multiples of ``2^c``): ``|result - exact| <= ulp(result) / 2 + bound``."""
    f = fmt if isinstance(fmt, Format) else get(fmt)
    return count * np.ldexp(1.0, cuts(agreed, f).astype(np.int32))


__all__ = ["BFLOAT16", "BLOCK", "FLOAT16", "FLOAT32", "FLOAT64", "Format", "NAN", "NEG_INF",
           "NOT_NEG_ZERO", "POS_INF", "SENTINEL", "SPLIT", "average", "block_exponents", "blocks",
           "bound", "check_agreed", "cuts", "decode", "encode", "flagged", "format_for", "get",
           "names", "register", "specials", "sum_addends", "sum_contributions"]
