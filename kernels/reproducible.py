"""numba kernels of the reproducible format (:mod:`bmlmpi.reproducible.format`, whose docstring
states the method, its parameters and its bounds): block exponents and flags, encode to one
or two int64 words, decode with correct rounding, special-value bytes, the fused sum of raw
contributions (encode, exact sum and decode in one pass), and the exact accumulator's add
and export.

A format is described to the kernels by plain integers (storage width, mantissa bits, bias,
the all-ones exponent field, the block size, the format's ``P`` and ``W``), so this module
knows no format by name. How each pass stays exact and fast:

* block exponents: the largest finite magnitude of a block is its largest sign-less bit
  pattern below infinity's, so one vectorised max over the patterns (and a min that finds
  a ``-0``) gives it; its exponent is decoded once per block, and a block holding an inf or
  NaN pattern is searched a second time without them;
* encode: ``x * 2^-c`` is exact in float64 (a power-of-two scaling whose result lies below
  ``2^(P + W)``; a value that underflows on the way is below 1 and truncates to 0 anyway),
  so the truncation is float64's conversion to int64; float16 and bfloat16 patterns are
  widened exactly first;
* decode: where the integer has at most 53 bits (one word) the float64 product ``V * 2^c``
  is exact and the store to float32 rounds once; for two words ``hi * 2^36 + lo`` rounds once
  in float64's addition and the scaling is exact while the result is normal. Everything else
  (16-bit formats, larger integers, float64's subnormal results) is rounded on integers:
  round half to even at the precision or the subnormal quantum, overflow to infinity, the
  result's bits assembled directly;
* the fused sum: per block, each contribution encoded by encode's arithmetic and added into
  one block of words (2-4 KiB, in cache), then decoded by decode's code, and in a flagged
  block the special bytes ORed from the contributions' own bits: the words a separate
  encode, sum and decode would have made, never written to memory;
* the accumulator's bins are W-bit slices of the integer significand, added as int32.

Words are one-dimensional int64 arrays: one word per value, or two per value, ``hi`` then
``lo``, the integer being ``hi * 2^S + lo`` (``S`` = :data:`SPLIT`, 36). The encoder splits
each addend toward zero (``hi`` and ``lo`` carry its sign); the decoder and the export
normalise any pair to ``0 <= lo < 2^S`` first. Sums of pairs are exact while neither word
overflows, which the format's addend count bounds.

Loops run over per-block slices with a loop-invariant count where a block is whole: LLVM
vectorises those (indexing the whole arrays from a per-block offset, or a count that changes
per block, kept the loops scalar: 4-8x slower, measured). Every kernel has a one-thread form
and a parallel form (``prange`` over blocks), chosen as :mod:`.numba_backend` chooses
(:func:`.numba_backend.uses_parallel`); both give the same bits, since one thread works on a
block and nothing is reassociated. The per-block functions of encode, the special bytes,
decode and the accumulator are compiled once per signature and called by both forms rather
than inlined into each: numba's parallel passes over an inlined block body took most of the
kernels' compile time (a cold compile of every format's kernels took 2.4x longer, measured),
and a call per block of 256 values costs nothing measurable. The block exponents' function
stays inlined: called, its max loop was no longer vectorised (9x slower, measured). Kernels
release the GIL and are cached on disk (:mod:`.numba_cache`). Importing this module imports
numba.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from . import numba_backend
from .numba_backend import kernel

#: the block exponent of a block with no finite non-zero addend (smallest int16: MAX ignores it)
SENTINEL = -32768
#: the bit position splitting a two-word integer: value = hi * 2^SPLIT + lo
SPLIT = 36
_MASK = (1 << SPLIT) - 1

#: bits of a special-value byte (per element, OR-reduced over ranks)
NAN, POS_INF, NEG_INF, NOT_NEG_ZERO = 1, 2, 4, 8


@intrinsic
def _clz(typingctx, x):
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))

    return sig, codegen


@njit(inline="always")
def _bitlen(x):
    # x >= 0; 0 for 0
    return 64 - _clz(x)


@njit(inline="always")
def _fields(bits, i, nbits, mbits, emask):
    u = np.int64(bits[i])
    sign = (u >> (nbits - 1)) & 1
    eb = (u >> mbits) & emask
    mant = u & ((np.int64(1) << mbits) - 1)
    return sign, eb, mant


@njit(inline="always")
def _cut(e_agreed, P, W):
    if e_agreed == SENTINEL:
        return np.int64(0)
    return W * ((np.int64(e_agreed) - P) // W)


# -- block exponents -----------------------------------------------------------------------

@njit(inline="always")
def _exponents_range(bits, out, b, lo, count, absmask, infbits, negzero, mbits, bias):
    # The largest magnitude of finite values is the largest sign-less bit pattern below
    # infinity's: a vectorisable max (and a min that finds a -0 pattern), the exponent decoded
    # once; a block holding an inf or NaN pattern is searched again without them.
    zero = absmask ^ absmask
    top = zero
    nz = ~zero
    for i in range(count):
        u = bits[lo + i]
        top = max(top, u & absmask)
        nz = min(nz, u ^ negzero)
    flag = np.int64(nz == zero)
    if top >= infbits:
        flag = 1
        top = zero
        for i in range(count):
            a = bits[lo + i] & absmask
            if a < infbits:
                top = max(top, a)
    t = np.int64(top)
    if t == 0:
        out[b, 0] = SENTINEL
    elif (t >> mbits) == 0:
        out[b, 0] = 1 - bias - mbits + _bitlen(t)
    else:
        out[b, 0] = (t >> mbits) - bias + 1
    out[b, 1] = flag


@njit(inline="always")
def _exponents_block(bits, out, b, block, absmask, infbits, negzero, mbits, bias):
    # a full block's loop runs a loop-invariant count, which LLVM vectorises (a count that
    # differs per block keeps it scalar: measured 5x slower)
    lo = b * block
    if lo + block <= bits.size:
        _exponents_range(bits, out, b, lo, block, absmask, infbits, negzero, mbits, bias)
    else:
        _exponents_range(bits, out, b, lo, bits.size - lo, absmask, infbits, negzero, mbits,
                         bias)


@kernel()
def _exponents_1(bits, out, block, absmask, infbits, negzero, mbits, bias):
    for b in range(out.shape[0]):
        _exponents_block(bits, out, b, block, absmask, infbits, negzero, mbits, bias)


@kernel(parallel=True)
def _exponents_n(bits, out, block, absmask, infbits, negzero, mbits, bias):
    for b in prange(out.shape[0]):
        _exponents_block(bits, out, b, block, absmask, infbits, negzero, mbits, bias)


# -- encode --------------------------------------------------------------------------------
# ``start``: the global position of values[0]; element i lies in block (start + i) // block.
# The scaled value x * 2^-c is exact in float64 (a power-of-two scaling of a value below
# 2^(P + W); anything that underflows on the way is below 1 and truncates to 0 anyway), so
# the truncation is float64's trunc and the words are its integer parts. ``bad[b - first]``
# counts finite values at or above 2^E_agreed (the agreement did not include this rank's
# values): the caller raises.

def _load(values, i, kind):  # typed per dtype by the overload below
    raise NotImplementedError


@intrinsic
def _half_to_double(typingctx, bits):
    sig = types.float64(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.DoubleType())

    return sig, codegen


@intrinsic
def _bf16_to_double(typingctx, bits):
    sig = types.float64(types.uint16)

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.fpext(builder.bitcast(wide, ir.FloatType()), ir.DoubleType())

    return sig, codegen


@intrinsic
def _bits_to_double(typingctx, bits):
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@njit(inline="always")
def _pow2(k):
    """2.0 ** k for a normal float64 (-1022 <= k <= 1023), built from its bits instead of a
    call into the C library's ldexp, several a block (the fused sum: within the runs'
    spread, 0.569 -> 0.556 ms for two float32 contributions of 1 Mi values)."""
    return _bits_to_double((np.int64(k) + 1023) << 52)


@overload(_load, inline="always")
def _load_impl(values, i, kind):
    if isinstance(values.dtype, types.Float):
        return lambda values, i, kind: np.float64(values[i])

    def sixteen(values, i, kind):
        # kind 1: float16 bit patterns, else bfloat16's
        if kind == 1:
            return _half_to_double(values[i])
        return _bf16_to_double(values[i])

    return sixteen


_TWO_S = float(1 << SPLIT)
_TWO_MINUS_S = 1.0 / _TWO_S
_SMALLEST = 5e-324


@njit(inline="always")
def _word(vs, k, s1, s2, limit, kind):
    """(value k's word, 1 if it lies at or above the limit and is finite): trunc(x * 2^-c),
    0 for inf, NaN and what lies above."""
    v = _load(vs, k, kind) * s1 * s2
    a = abs(v)
    wrong = np.int64(a >= limit) & np.int64(a != np.inf)
    return (np.int64(v) if a < limit else np.int64(0)), wrong


@njit(inline="always")
def _words(vs, k, s1, s2, limit, kind):
    """(hi, lo, wrong) of value k in two words: hi = trunc(t / 2^S) (below 2^36), and
    t - hi * 2^S, exact, truncated to lo."""
    v = _load(vs, k, kind) * s1 * s2
    a = abs(v)
    wrong = np.int64(a >= limit) & np.int64(a != np.inf)
    t = v if a < limit else 0.0
    h = np.int64(t * _TWO_MINUS_S)
    return h, np.int64(t - np.float64(h) * _TWO_S), wrong


@njit(inline="always")
def _encode_into(vs, vo, os, oo, count, s1, s2, limit, kind, two, add):
    # value k of the range at vs[vo + k], its words from os[oo] on, indexed by unsigned
    # positions: LLVM vectorises the loops as over fresh slices (a signed index from an
    # offset kept them scalar: measured 6x slower), and the fused sum of addends in two
    # arrays ran 1.3x faster than with a slice of each a block (measured, cause not found);
    # ``add``: add the words to those in ``os`` (the fused sum) rather than store them, a
    # branch outside the loops (inside, it kept two-word loops scalar: measured 2.5x slower)
    wrong = 0
    if two:
        if add:
            for k in range(count):
                h, low, w = _words(vs, np.uint64(vo + k), s1, s2, limit, kind)
                os[np.uint64(oo + 2 * k)] += h
                os[np.uint64(oo + 2 * k + 1)] += low
                wrong += w
        else:
            for k in range(count):
                h, low, w = _words(vs, np.uint64(vo + k), s1, s2, limit, kind)
                os[np.uint64(oo + 2 * k)] = h
                os[np.uint64(oo + 2 * k + 1)] = low
                wrong += w
    elif add:
        for k in range(count):
            x, w = _word(vs, np.uint64(vo + k), s1, s2, limit, kind)
            os[np.uint64(oo + k)] += x
            wrong += w
    else:
        for k in range(count):
            x, w = _word(vs, np.uint64(vo + k), s1, s2, limit, kind)
            os[np.uint64(oo + k)] = x
            wrong += w
    return wrong


@njit(inline="always")
def _encode_range(values, out, lo, count, s1, s2, limit, kind, two):
    words = 2 if two else 1
    return _encode_into(values, lo, out, words * lo, count, s1, s2, limit, kind, two, False)


@njit(inline="always")
def _scaling(e_agreed, P, W):
    """(cut, limit, s1, s2) of a block: the scaled values lie below ``limit`` = 2^(E - c)
    (with no finite non-zero value agreed, any such value is wrong); ``s1 * s2`` = 2^-c in
    two factors that stay in float64's range."""
    c = _cut(e_agreed, P, W)
    limit = _SMALLEST if e_agreed == SENTINEL else _pow2(e_agreed - c)
    half = (-c) // 2
    return c, limit, _pow2(half), _pow2(-c - half)


@njit(nogil=True)
def _encode_block(values, agreed, out, bad, b, start, first, block, kind, P, W, two):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, values.size)
    c, limit, s1, s2 = _scaling(np.int64(agreed[b, 0]), P, W)
    if hi - lo == block:   # a loop-invariant count: vectorised
        bad[b - first] = _encode_range(values, out, lo, block, s1, s2, limit, kind, two)
    else:
        bad[b - first] = _encode_range(values, out, lo, hi - lo, s1, s2, limit, kind, two)


@kernel()
def _encode_1(values, agreed, out, bad, start, first, last, block, kind, P, W, two):
    for b in range(first, last):
        _encode_block(values, agreed, out, bad, b, start, first, block, kind, P, W, two)


@kernel(parallel=True)
def _encode_n(values, agreed, out, bad, start, first, last, block, kind, P, W, two):
    for b in prange(first, last):
        _encode_block(values, agreed, out, bad, b, start, first, block, kind, P, W, two)


# -- special-value bits --------------------------------------------------------------------

@njit(inline="always")
def _special_byte(u, nbits, mbits, emask):
    """The special-value byte of one value's bit pattern ``u``."""
    u = np.int64(u)
    eb = (u >> mbits) & emask
    sign = (u >> (nbits - 1)) & 1
    if eb == emask:
        if u & ((np.int64(1) << mbits) - 1) != 0:
            return NAN | NOT_NEG_ZERO
        if sign == 1:
            return NEG_INF | NOT_NEG_ZERO
        return POS_INF | NOT_NEG_ZERO
    if sign == 1 and u & ((np.int64(1) << (nbits - 1)) - 1) == 0:
        return 0
    return NOT_NEG_ZERO


@njit(nogil=True)
def _specials_block(bits, agreed, out, b, start, block, nbits, mbits, emask):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, bits.size)
    if agreed[b, 1] == 0:
        out[lo:hi] = 0
        return
    for i in range(lo, hi):
        out[i] = _special_byte(bits[i], nbits, mbits, emask)


@kernel()
def _specials_1(bits, agreed, out, start, first, last, block, nbits, mbits, emask):
    for b in range(first, last):
        _specials_block(bits, agreed, out, b, start, block, nbits, mbits, emask)


@kernel(parallel=True)
def _specials_n(bits, agreed, out, start, first, last, block, nbits, mbits, emask):
    for b in prange(first, last):
        _specials_block(bits, agreed, out, b, start, block, nbits, mbits, emask)


# -- decode --------------------------------------------------------------------------------

@njit(inline="always")
def _round_bits(neg, hm, lm, c, nbits, mbits, bias, emask):
    """The bits of (-1)^neg * (hm * 2^SPLIT + lm) * 2^c rounded to the format (nearest,
    ties to even; subnormals; overflow to infinity). 0 <= lm < 2^SPLIT, hm >= 0."""
    p = mbits + 1
    qexp = 1 - bias - mbits
    sign = np.int64(neg) << (nbits - 1)
    if hm == 0 and lm == 0:
        return sign
    n = _bitlen(hm) + SPLIT if hm != 0 else _bitlen(lm)
    s = max(n - p, qexp - c)
    if s <= 0:
        # exact: M has at most p bits, shifted up to a normalised mantissa or the quantum
        r = ((hm << SPLIT) | lm) << (-s)
    elif s > n:
        r = np.int64(0)  # below half the quantum (cannot happen for a sum of addends)
    elif s == n:
        # M / 2^s lies in [1/2, 1): above half unless M is a power of two (a tie: to even 0)
        power = (hm == 0 and (lm & (lm - 1)) == 0) or (lm == 0 and (hm & (hm - 1)) == 0)
        r = np.int64(0) if power else np.int64(1)
    else:
        if s >= SPLIT:
            t = s - SPLIT
            r = hm >> t
            rem_hi = hm & ((np.int64(1) << t) - 1)
            if t == 0:
                # half is 2^(SPLIT-1) in lm
                above = lm > (np.int64(1) << (SPLIT - 1))
                tie = lm == (np.int64(1) << (SPLIT - 1))
            else:
                half_hi = np.int64(1) << (t - 1)
                above = rem_hi > half_hi or (rem_hi == half_hi and lm != 0)
                tie = rem_hi == half_hi and lm == 0
        else:
            r = (hm << (SPLIT - s)) | (lm >> s)
            rem = lm & ((np.int64(1) << s) - 1)
            half = np.int64(1) << (s - 1)
            above = rem > half
            tie = rem == half
        if above or (tie and (r & 1) == 1):
            r += 1
    e = c + s
    if r == (np.int64(1) << p):
        r >>= 1
        e += 1
    if r >= (np.int64(1) << mbits):
        be = e + mbits + bias
        if be >= emask:
            return sign | (np.int64(emask) << mbits)
        return sign | (be << mbits) | (r - (np.int64(1) << mbits))
    return sign | r


@njit(nogil=True)
def _exact_bits(words, i, c, two, nbits, mbits, bias, emask):
    """The bits of position i's integer times 2^c, rounded by integers (any size, any cut)."""
    if two:
        h = words[2 * i] + (words[2 * i + 1] >> SPLIT)
        low = words[2 * i + 1] & _MASK
    else:
        h = words[i] >> SPLIT
        low = words[i] & _MASK
    neg = h < 0
    if neg:
        if low == 0:
            hm = -h
            lm = np.int64(0)
        else:
            hm = -h - 1
            lm = (np.int64(1) << SPLIT) - low
    else:
        hm = h
        lm = low
    return _round_bits(neg, hm, lm, c, nbits, mbits, bias, emask)


_EXACT_INT = float(1 << 53)
_NORMAL64 = 2.0 ** -1022


@njit(inline="always")
def _quick(words, i, scale, two):
    """Position i's value through float64 and whether it is the correctly rounded one: one
    word below 2^53 converts exactly (the store to float32 then rounds once); two words as
    hi * 2^S + lo round once in the addition, exactly scaled where the result is normal."""
    if two:
        h = words[2 * i] + (words[2 * i + 1] >> SPLIT)
        d = (np.float64(h) * _TWO_S + np.float64(words[2 * i + 1] & _MASK)) * scale
        good = abs(np.float64(h)) < _EXACT_INT and (abs(d) >= _NORMAL64 or d == 0.0)
    else:
        v = np.float64(words[i])
        d = v * scale
        good = abs(v) < _EXACT_INT
    return d, good


@njit(inline="always")
def _quick_range(words, out, lo, count, scale, two):
    # views of the range, as in _encode_range
    os = out[lo:lo + count]
    slow = 0
    if two:
        ws = words[2 * lo:2 * (lo + count)]
        for k in range(count):
            h = ws[2 * k] + (ws[2 * k + 1] >> SPLIT)
            d = (np.float64(h) * _TWO_S + np.float64(ws[2 * k + 1] & _MASK)) * scale
            os[k] = d
            slow += np.int64(abs(np.float64(h)) >= _EXACT_INT) | (
                np.int64(abs(d) < _NORMAL64) & np.int64(d != 0.0))
    else:
        ws = words[lo:lo + count]
        for k in range(count):
            v = np.float64(ws[k])
            os[k] = v * scale
            slow += np.int64(abs(v) >= _EXACT_INT)
    return slow


@njit(inline="always")
def _decode_words(ws, os, bs, count, c, two, fast, cmin, nbits, mbits, bias, emask):
    """A block's summed words ``ws`` (from its first value) decoded into ``os`` (values) and
    ``bs`` (the same memory's bits), at cut ``c``."""
    if fast and c >= cmin:
        scale = _pow2(c)
        if _quick_range(ws, os, 0, count, scale, two):
            for i in range(count):
                d, good = _quick(ws, i, scale, two)
                if not good:
                    bs[i] = _exact_bits(ws, i, c, two, nbits, mbits, bias, emask)
    else:
        for i in range(count):
            bs[i] = _exact_bits(ws, i, c, two, nbits, mbits, bias, emask)


@njit(inline="always")
def _fix_specials(bs, sp, count, nbits, mbits, emask):
    """The special values of a flagged block: ``sp`` the OR of the addends' bytes."""
    nan = (np.int64(emask) << mbits) | (np.int64(1) << (mbits - 1))
    inf = np.int64(emask) << mbits
    sign = np.int64(1) << (nbits - 1)
    for i in range(count):
        f = sp[i]
        if (f & NAN) != 0 or (f & (POS_INF | NEG_INF)) == (POS_INF | NEG_INF):
            bs[i] = nan
        elif (f & POS_INF) != 0:
            bs[i] = inf
        elif (f & NEG_INF) != 0:
            bs[i] = inf | sign
        elif (f & NOT_NEG_ZERO) == 0 and np.int64(bs[i]) & (sign - 1) == 0:
            bs[i] = sign   # every addend -0 (the words of +-0 are all 0)


@njit(nogil=True)
def _decode_block(words, agreed, sp, out, bits, b, start, block, nbits, mbits, bias, emask,
                  P, W, two, fast, cmin):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, bits.size)
    c = _cut(agreed[b, 0], P, W)
    per = 2 if two else 1
    ws = words[per * lo:per * hi]
    if hi - lo == block:   # a loop-invariant count: vectorised
        _decode_words(ws, out[lo:hi], bits[lo:hi], block, c, two, fast, cmin, nbits, mbits,
                      bias, emask)
    else:
        _decode_words(ws, out[lo:hi], bits[lo:hi], hi - lo, c, two, fast, cmin, nbits, mbits,
                      bias, emask)
    if agreed[b, 1] != 0 and sp.size > 0:
        _fix_specials(bits[lo:hi], sp[lo:hi], hi - lo, nbits, mbits, emask)


@kernel()
def _decode_1(words, agreed, sp, out, bits, start, first, last, block, nbits, mbits, bias,
              emask, P, W, two, fast, cmin):
    for b in range(first, last):
        _decode_block(words, agreed, sp, out, bits, b, start, block, nbits, mbits, bias,
                      emask, P, W, two, fast, cmin)


@kernel(parallel=True)
def _decode_n(words, agreed, sp, out, bits, start, first, last, block, nbits, mbits, bias,
              emask, P, W, two, fast, cmin):
    for b in prange(first, last):
        _decode_block(words, agreed, sp, out, bits, b, start, block, nbits, mbits, bias,
                      emask, P, W, two, fast, cmin)


# -- the fused sum of raw contributions ------------------------------------------------------
# The addends of the same ``m`` real positions: ``rest[o:][:m]`` for each ``o`` in ``offs``,
# and where ``first`` is not None, ``first`` before them (``firstbits``, ``restbits``: the
# same memory's bits); position 0 is global position ``start``. Per block: each addend
# encoded at the agreed cut and added into a block of words that stays in cache (the same
# arithmetic as encode, the integer sum exact, the same words as encoding each and adding
# them), decoded as decode does, and in a flagged block the special bytes ORed from the
# addends' own bits (what the exchange of specials would give).

def _is_double(values):  # typed per dtype by the overload below
    raise NotImplementedError


@overload(_is_double, inline="always")
def _is_double_impl(values):
    double = isinstance(values.dtype, types.Float) and values.dtype.bitwidth == 64
    return lambda values: double


@njit(inline="always")
def _encode_addends(first, rest, offs, ws, lo, n, s1, s2, limit, kind, two, apart):
    """The ``n`` values from ``lo`` of every addend encoded into ``ws`` and summed there; how
    many lay above their limit. The first addend is stored and the others added, each call
    with a constant ``add``: a flag computed in the loop over addends kept the loops slower
    (measured 1.8x for two float32 addends). ``apart`` (a constant): the first addend is
    ``first``, else ``rest`` at ``offs[0]``."""
    if apart:
        wrong = _encode_into(first, lo, ws, 0, n, s1, s2, limit, kind, two, False)
        for a in range(offs.size):
            o = offs[a] + lo
            wrong += _encode_into(rest, o, ws, 0, n, s1, s2, limit, kind, two, True)
        return wrong
    o = offs[0] + lo
    wrong = _encode_into(rest, o, ws, 0, n, s1, s2, limit, kind, two, False)
    for a in range(1, offs.size):
        o = offs[a] + lo
        wrong += _encode_into(rest, o, ws, 0, n, s1, s2, limit, kind, two, True)
    return wrong


@njit(inline="always")
def _sum_loop(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, b0, b1,
              start, firstblock, block, kind, P, W, two, apart, nbits, mbits, bias, emask,
              fast, cmin):
    # ``two`` and ``apart`` constants: a run-time ``two`` kept the loops slower (measured
    # 1.5x for two float32 addends)
    per = 2 if two else 1
    words = np.empty(per * block, np.int64)
    sp = np.empty(block, np.uint8)
    for b in range(b0, b1):
        lo = max(b * block - start, 0)
        hi = min((b + 1) * block - start, m)
        count = hi - lo
        c, limit, s1, s2 = _scaling(np.int64(agreed[b, 0]), P, W)
        ws = words[:per * count]
        if count == block:   # a loop-invariant count: vectorised
            bad[b - firstblock] = _encode_addends(first, rest, offs, ws, lo, block, s1, s2,
                                                  limit, kind, two, apart)
        else:
            bad[b - firstblock] = _encode_addends(first, rest, offs, ws, lo, count, s1, s2,
                                                  limit, kind, two, apart)
        flagged = agreed[b, 1] != 0
        if flagged:   # before the decode: ``out`` may be ``first``'s memory
            for k in range(count):
                f = _special_byte(firstbits[lo + k], nbits, mbits, emask) if apart else 0
                for a in range(offs.size):
                    f |= _special_byte(restbits[offs[a] + lo + k], nbits, mbits, emask)
                sp[k] = f
        if count == block:
            _decode_words(ws, out[lo:hi], bits[lo:hi], block, c, two, fast, cmin, nbits,
                          mbits, bias, emask)
        else:
            _decode_words(ws, out[lo:hi], bits[lo:hi], count, c, two, fast, cmin, nbits,
                          mbits, bias, emask)
        if flagged:
            _fix_specials(bits[lo:hi], sp, count, nbits, mbits, emask)


@njit(nogil=True)
def _sum_blocks(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, b0, b1,
                start, firstblock, block, kind, P, W, nbits, mbits, bias, emask, fast, cmin):
    # compiled per dtype and per kind of ``first`` (None: a column), each with its one loop:
    # the branch on None is pruned before typing, the word count a constant of the dtype
    if first is None:
        _sum_loop(rest, restbits, rest, restbits, offs, m, agreed, out, bits, bad, b0, b1,
                  start, firstblock, block, kind, P, W, _is_double(rest), False, nbits, mbits,
                  bias, emask, fast, cmin)
    else:
        _sum_loop(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, b0, b1,
                  start, firstblock, block, kind, P, W, _is_double(rest), True, nbits, mbits,
                  bias, emask, fast, cmin)


#: blocks a parallel task of the fused sum takes (one block of words in cache each)
_TASK_BLOCKS = 64


@kernel()
def _sum_1(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, start,
           firstblock, last, block, kind, P, W, nbits, mbits, bias, emask, fast, cmin):
    _sum_blocks(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, firstblock,
                last, start, firstblock, block, kind, P, W, nbits, mbits, bias, emask, fast,
                cmin)


@kernel(parallel=True)
def _sum_n(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, start,
           firstblock, last, block, kind, P, W, nbits, mbits, bias, emask, fast, cmin):
    tasks = -(-(last - firstblock) // _TASK_BLOCKS)
    for t in prange(tasks):
        b0 = firstblock + t * _TASK_BLOCKS
        _sum_blocks(first, firstbits, rest, restbits, offs, m, agreed, out, bits, bad, b0,
                    min(b0 + _TASK_BLOCKS, last), start, firstblock, block, kind, P, W, nbits,
                    mbits, bias, emask, fast, cmin)


# -- the exact accumulator -------------------------------------------------------------------
# ``bins``: int32 of shape (nb, values), one row per bin: bin j of block b holds the sum of the
# addends' slices at bit k*W, k = low(top[b]) + j, low(E) = floor((E - P) / W); a slice is
# bits [k*W, k*W + W) of |x| with x's sign, so the bins from k = K upwards sum to the addends
# truncated at K*W. Rows keep each bin's loop over values contiguous (vectorised).
# ``top[b]``: the block's largest exponent so far (SENTINEL before any finite non-zero
# addend); ``spec``: per value the OR of the addends' special bits.

@njit(inline="always")
def _low(e, P, W):
    return (np.int64(e) - P) // W


@njit(inline="always")
def _add_range(bits, bins, lo, count, base, nbits, mbits, bias, emask, W):
    us = bits[lo:lo + count]
    mmask = (np.int64(1) << mbits) - 1
    wmask = (np.int64(1) << W) - 1
    for j in range(bins.shape[0]):
        row = bins[j, lo:lo + count]
        at = base + j * W
        for k in range(count):
            u = np.int64(us[k])
            sign = (u >> (nbits - 1)) & 1
            eb = (u >> mbits) & emask
            m = (u & mmask) | (np.int64(eb != 0) << mbits)
            m = np.int64(0) if eb == emask else m           # inf and NaN add nothing
            sh = at - (max(eb, 1) - bias - mbits)           # slice bit 0 in m's bits
            down = min(max(sh, 0), 63)
            up = min(max(-sh, 0), 63)
            piece = ((m >> down) if sh >= 0 else (m << up)) & wmask
            row[k] += np.int32(piece - 2 * sign * piece)


@njit(nogil=True)
def _add_block(bits, bins, top, flags, spec, newtop, b, block, nbits, mbits, bias, emask, P,
               W):
    lo = b * block
    hi = min(lo + block, bits.size)
    nb = bins.shape[0]
    old = np.int64(top[b])
    new = max(old, np.int64(newtop[b, 0]))
    if newtop[b, 1] != 0:
        flags[b] = 1
        for i in range(lo, hi):
            u = np.int64(bits[i])
            eb = (u >> mbits) & emask
            if eb == emask:
                if u & ((np.int64(1) << mbits) - 1) != 0:
                    spec[i] |= NAN
                elif (u >> (nbits - 1)) & 1 == 1:
                    spec[i] |= NEG_INF
                else:
                    spec[i] |= POS_INF
    if old != SENTINEL and new > old:
        # the bins below the new lowest one can never lie above a later cut: dropped
        shift = _low(new, P, W) - _low(old, P, W)
        for j in range(nb):
            if j + shift < nb:
                bins[j, lo:hi] = bins[j + shift, lo:hi]
            else:
                bins[j, lo:hi] = 0
    top[b] = new
    if new == SENTINEL:
        return
    base = _low(new, P, W) * W
    if hi - lo == block:   # a loop-invariant count: vectorised
        _add_range(bits, bins, lo, block, base, nbits, mbits, bias, emask, W)
    else:
        _add_range(bits, bins, lo, hi - lo, base, nbits, mbits, bias, emask, W)


@kernel()
def _acc_add_1(bits, bins, top, flags, spec, newtop, block, nbits, mbits, bias, emask, P, W):
    for b in range(top.size):
        _add_block(bits, bins, top, flags, spec, newtop, b, block, nbits, mbits, bias, emask,
                   P, W)


@kernel(parallel=True)
def _acc_add_n(bits, bins, top, flags, spec, newtop, block, nbits, mbits, bias, emask, P, W):
    for b in prange(top.size):
        _add_block(bits, bins, top, flags, spec, newtop, b, block, nbits, mbits, bias, emask,
                   P, W)


@njit(inline="always")
def _export_range(bins, out, lo, count, base, first, W, two):
    if two:
        os = out[2 * lo:2 * (lo + count)]
        os[:] = 0
        for j in range(bins.shape[0]):
            if base + j < first:
                continue
            off = (base + j - first) * W
            row = bins[j, lo:lo + count]
            if off >= SPLIT:
                for k in range(count):
                    os[2 * k] += np.int64(row[k]) << (off - SPLIT)
            else:
                for k in range(count):
                    v = np.int64(row[k])
                    os[2 * k] += v >> (SPLIT - off)
                    os[2 * k + 1] += (v << off) & _MASK
        for k in range(count):
            os[2 * k] += os[2 * k + 1] >> SPLIT
            os[2 * k + 1] &= _MASK
    else:
        os = out[lo:lo + count]
        os[:] = 0
        for j in range(bins.shape[0]):
            if base + j < first:
                continue
            off = (base + j - first) * W
            row = bins[j, lo:lo + count]
            for k in range(count):
                os[k] += np.int64(row[k]) << off


@njit(nogil=True)
def _export_block(bins, top, agreed, out, bad, b, block, P, W, two):
    n = bins.shape[1]
    lo = b * block
    hi = min(lo + block, n)
    t = np.int64(top[b])
    e_agreed = np.int64(agreed[b, 0])
    bad[b] = 1 if t != SENTINEL and t > e_agreed else 0
    if t == SENTINEL or t > e_agreed:
        if two:
            out[2 * lo:2 * hi] = 0
        else:
            out[lo:hi] = 0
        return
    first = _low(e_agreed, P, W)
    base = _low(t, P, W)
    if hi - lo == block:   # a loop-invariant count: vectorised
        _export_range(bins, out, lo, block, base, first, W, two)
    else:
        _export_range(bins, out, lo, hi - lo, base, first, W, two)


@kernel()
def _acc_export_1(bins, top, agreed, out, bad, block, P, W, two):
    for b in range(top.size):
        _export_block(bins, top, agreed, out, bad, b, block, P, W, two)


@kernel(parallel=True)
def _acc_export_n(bins, top, agreed, out, bad, block, P, W, two):
    for b in prange(top.size):
        _export_block(bins, top, agreed, out, bad, b, block, P, W, two)


# (one-thread form, parallel form) per job, as numba_backend's table
_KERNELS = {
    "exponents": (_exponents_1, _exponents_n), "encode": (_encode_1, _encode_n),
    "specials": (_specials_1, _specials_n), "decode": (_decode_1, _decode_n),
    "sum": (_sum_1, _sum_n),
    "acc_add": (_acc_add_1, _acc_add_n), "acc_export": (_acc_export_1, _acc_export_n),
}


def run(job: str, nbytes: int, *args, parallel: bool | None = None) -> None:
    """Run ``job``'s kernel (a name of :data:`JOBS`) on arguments the caller checked: the
    parallel form where :func:`.numba_backend.uses_parallel` says so for ``nbytes``, or as
    ``parallel`` forces."""
    if parallel is None:
        parallel = numba_backend.uses_parallel(nbytes)
    one, many = _KERNELS[job]
    if parallel:
        numba_backend.call(many, *args)
    else:
        one(*args)


JOBS = tuple(_KERNELS)

__all__ = ["JOBS", "NAN", "NEG_INF", "NOT_NEG_ZERO", "POS_INF", "SENTINEL", "SPLIT", "run"]
