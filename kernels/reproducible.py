"""numba kernels of the reproducible format (:mod:`bmlmpi.reproducible`, whose docstring states
the method, its parameters and its bounds): block exponents and flags, encode to one or two
int64 words, decode with correct rounding, special-value bits, and the exact accumulator's
rebase, add and export.

Every kernel works on the values' IEEE bit patterns, read as int64 from an unsigned view of
the storage (uint16 for float16 and bfloat16, uint32, uint64), so one compilation serves every
format of a width and nothing is converted through another floating-point type: an addend is
``(-1)^sign * m * 2^e`` with an integer mantissa ``m`` (hidden bit included) and ``e`` from
the exponent field; truncation at a cut is an integer shift, and rounding is done on integers
(round half to even, the subnormal quantum, overflow to infinity) before the result's bits are
assembled. A format is described to the kernels by plain integers (``nbits``: the storage
width; ``mbits``: stored mantissa bits; ``bias``; ``emask``: the all-ones exponent field; the
block size ``block``; the format's precision ``P`` and bin width ``W``), so this module knows
no format by name.

Words are always two-dimensional int64 arrays, (values, words) with words 1 or 2. Two-word
values: an integer ``V`` is held as ``hi * 2^S + lo`` (``S`` = :data:`SPLIT`, 36);
the encoder splits each addend toward zero (``hi`` and ``lo`` carry the addend's sign), the
decoder and the accumulator's export normalise any pair to ``0 <= lo < 2^S`` first. Sums of
pairs are exact as long as neither word overflows, which the format's addend count bounds.

Every kernel has a one-thread form and a parallel (``prange`` over blocks) form, chosen as
:mod:`.numba_backend` chooses (:func:`.numba_backend.uses_parallel`); both give the same bits,
since every block is worked on by one thread and nothing is reassociated. Kernels release the
GIL and are cached on disk (:mod:`.numba_cache`). Importing this module imports numba.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

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
def _exponents_block(bits, out, b, block, nbits, mbits, bias, emask):
    lo = b * block
    hi = min(lo + block, bits.size)
    qexp = 1 - bias - mbits
    top = np.int64(SENTINEL)
    flag = 0
    for i in range(lo, hi):
        sign, eb, mant = _fields(bits, i, nbits, mbits, emask)
        if eb == emask:
            flag = 1
        elif eb == 0:
            if mant == 0:
                if sign == 1:
                    flag = 1
            else:
                top = max(top, qexp + _bitlen(mant))
        else:
            top = max(top, eb - bias + 1)
    out[b, 0] = top
    out[b, 1] = flag


@kernel()
def _exponents_1(bits, out, block, nbits, mbits, bias, emask):
    for b in range(out.shape[0]):
        _exponents_block(bits, out, b, block, nbits, mbits, bias, emask)


@kernel(parallel=True)
def _exponents_n(bits, out, block, nbits, mbits, bias, emask):
    for b in prange(out.shape[0]):
        _exponents_block(bits, out, b, block, nbits, mbits, bias, emask)


# -- encode --------------------------------------------------------------------------------
# ``start``: the global position of bits[0]; element i lies in block (start + i) // block.
# ``bad[0]`` counts addends above their block's agreed exponent (the agreement was not the
# maximum over this rank's own values): the caller raises.

@njit(inline="always")
def _mantissa(eb, mant, mbits, bias):
    if eb == 0:
        return mant, np.int64(1 - bias - mbits)
    return mant | (np.int64(1) << mbits), eb - bias - mbits


@njit(inline="always")
def _encode_block(bits, agreed, out, bad, b, start, first, block, nbits, mbits, bias, emask,
                  P, W, two):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, bits.size)
    e_agreed = np.int64(agreed[b, 0])
    c = _cut(e_agreed, P, W)
    wrong = 0
    for i in range(lo, hi):
        sign, eb, mant = _fields(bits, i, nbits, mbits, emask)
        hw = np.int64(0)
        lw = np.int64(0)
        if eb != emask and (eb != 0 or mant != 0):
            m, e = _mantissa(eb, mant, mbits, bias)
            if e + _bitlen(m) > e_agreed:
                wrong += 1
            else:
                k = e - c
                if two:
                    if k >= 0:
                        if k <= SPLIT:
                            hw = m >> (SPLIT - k)
                        else:
                            hw = m << (k - SPLIT)
                        lw = (m << k) & _MASK if k < 64 else np.int64(0)
                    elif k > -64:
                        mag = m >> (-k)
                        hw = mag >> SPLIT
                        lw = mag & _MASK
                else:
                    if k >= 0:
                        lw = m << k
                    elif k > -64:
                        lw = m >> (-k)
                if sign == 1:
                    hw = -hw
                    lw = -lw
        if two:
            out[i, 0] = hw
            out[i, 1] = lw
        else:
            out[i, 0] = lw
    bad[b - first] = wrong


@kernel()
def _encode_1(bits, agreed, out, bad, start, first, last, block, nbits, mbits, bias, emask,
              P, W, two):
    for b in range(first, last):
        _encode_block(bits, agreed, out, bad, b, start, first, block, nbits, mbits, bias,
                      emask, P, W, two)


@kernel(parallel=True)
def _encode_n(bits, agreed, out, bad, start, first, last, block, nbits, mbits, bias, emask,
              P, W, two):
    for b in prange(first, last):
        _encode_block(bits, agreed, out, bad, b, start, first, block, nbits, mbits, bias,
                      emask, P, W, two)


# -- special-value bits --------------------------------------------------------------------

@njit(inline="always")
def _specials_block(bits, agreed, out, b, start, block, nbits, mbits, emask):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, bits.size)
    for i in range(lo, hi):
        if agreed[b, 1] == 0:
            out[i] = 0
            continue
        sign, eb, mant = _fields(bits, i, nbits, mbits, emask)
        if eb == emask:
            if mant != 0:
                out[i] = NAN | NOT_NEG_ZERO
            elif sign == 1:
                out[i] = NEG_INF | NOT_NEG_ZERO
            else:
                out[i] = POS_INF | NOT_NEG_ZERO
        elif sign == 1 and eb == 0 and mant == 0:
            out[i] = 0
        else:
            out[i] = NOT_NEG_ZERO


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


@njit(inline="always")
def _decode_block(words, agreed, sp, out, b, start, block, nbits, mbits, bias, emask, P, W,
                  two):
    lo = max(b * block - start, 0)
    hi = min((b + 1) * block - start, out.size)
    c = _cut(agreed[b, 0], P, W)
    flagged = agreed[b, 1] != 0 and sp.size > 0
    nan = (np.int64(emask) << mbits) | (np.int64(1) << (mbits - 1))
    inf = np.int64(emask) << mbits
    for i in range(lo, hi):
        if two:
            h = words[i, 0] + (words[i, 1] >> SPLIT)
            low = words[i, 1] & _MASK
        else:
            h = words[i, 0] >> SPLIT
            low = words[i, 0] & _MASK
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
        r = _round_bits(neg, hm, lm, c, nbits, mbits, bias, emask)
        if flagged:
            f = sp[i]
            if (f & NAN) != 0 or (f & (POS_INF | NEG_INF)) == (POS_INF | NEG_INF):
                r = nan
            elif (f & POS_INF) != 0:
                r = inf
            elif (f & NEG_INF) != 0:
                r = inf | (np.int64(1) << (nbits - 1))
            elif hm == 0 and lm == 0 and (f & NOT_NEG_ZERO) == 0:
                r = np.int64(1) << (nbits - 1)
        out[i] = r


@kernel()
def _decode_1(words, agreed, sp, out, start, first, last, block, nbits, mbits, bias, emask,
              P, W, two):
    for b in range(first, last):
        _decode_block(words, agreed, sp, out, b, start, block, nbits, mbits, bias, emask, P,
                      W, two)


@kernel(parallel=True)
def _decode_n(words, agreed, sp, out, start, first, last, block, nbits, mbits, bias, emask,
              P, W, two):
    for b in prange(first, last):
        _decode_block(words, agreed, sp, out, b, start, block, nbits, mbits, bias, emask, P,
                      W, two)


# -- the exact accumulator -------------------------------------------------------------------
# Per element ``nb`` bins of W bits (int32) at fixed boundaries: bin j of block b holds the sum
# of the addends' slices at bit k*W, k = low(top[b]) + j, low(E) = floor((E - P) / W); a slice
# is bits [k*W, k*W + W) of |x| with x's sign, so the bins from k = K upwards sum to the
# addends truncated at K*W. ``top[b]``: the block's largest exponent so far (SENTINEL before
# any finite non-zero addend); ``spec``: per element the OR of the addends' special bits.

@njit(inline="always")
def _low(e, P, W):
    return (np.int64(e) - P) // W


@njit(inline="always")
def _add_block(bits, bins, top, flags, spec, newtop, b, block, nbits, mbits, bias, emask, P,
               W):
    lo = b * block
    hi = min(lo + block, bits.size)
    nb = bins.shape[1]
    old = np.int64(top[b])
    new = max(old, np.int64(newtop[b, 0]))
    if newtop[b, 1] != 0:
        flags[b] = 1
    if old != SENTINEL and new > old:
        # the bins below the new lowest one can never lie above a later cut: dropped
        shift = _low(new, P, W) - _low(old, P, W)
        for i in range(lo, hi):
            for j in range(nb):
                bins[i, j] = bins[i, j + shift] if j + shift < nb else 0
    top[b] = new
    base = _low(new, P, W) * W
    wmask = (np.int64(1) << W) - 1
    for i in range(lo, hi):
        sign, eb, mant = _fields(bits, i, nbits, mbits, emask)
        if eb == emask:
            spec[i] |= NAN if mant != 0 else (NEG_INF if sign == 1 else POS_INF)
            continue
        if eb == 0 and mant == 0:
            continue
        m, e = _mantissa(eb, mant, mbits, bias)
        for j in range(nb):
            sh = base + j * W - e
            if sh >= 0:
                piece = (m >> sh) & wmask if sh < 64 else np.int64(0)
            else:
                piece = (m << (-sh)) & wmask if -sh < W else np.int64(0)
            if sign == 1:
                bins[i, j] -= piece
            else:
                bins[i, j] += piece


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
def _export_block(bins, top, agreed, out, bad, b, block, P, W, two):
    n = bins.shape[0]
    nb = bins.shape[1]
    lo = b * block
    hi = min(lo + block, n)
    t = np.int64(top[b])
    e_agreed = np.int64(agreed[b, 0])
    bad[b] = 1 if t != SENTINEL and t > e_agreed else 0
    if t == SENTINEL or t > e_agreed:
        for i in range(lo, hi):
            for j in range(out.shape[1]):
                out[i, j] = 0
        return
    first = _low(e_agreed, P, W)
    base = _low(t, P, W)
    for i in range(lo, hi):
        hw = np.int64(0)
        lw = np.int64(0)
        for j in range(nb):
            k = base + j
            if k < first:
                continue
            off = (k - first) * W
            v = np.int64(bins[i, j])
            if not two:
                lw += v << off
            elif off >= SPLIT:
                hw += v << (off - SPLIT)
            else:
                hw += v >> (SPLIT - off)
                lw += (v << off) & _MASK
        if two:
            out[i, 0] = hw + (lw >> SPLIT)
            out[i, 1] = lw & _MASK
        else:
            out[i, 0] = lw


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
