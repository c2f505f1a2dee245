"""The registry of 16-bit wire formats: a format is registered once, with its codecs, the
numbers the compressed allreduce's overflow bound needs, and the numba kernels (if any) that
sum its codes; the kernels' wire op ``sum_<name>`` and the compression layer's wire format
``<name>`` both come from that one registration.

A wire format stores each value as a 16-bit code in a uint16 array. Its wire op (dispatched
by :mod:`.dispatch`) decodes every operand to float32, adds them in float32 and rounds the
sum once to the format (nearest even): ``encode(decode(dst) + decode(src_0) + ...)``.
:mod:`.numpy_backend` computes that with the format's own ``encode``/``decode``, so any
registered format runs; a format that names a numba kernel family (``numba``: ``"half"`` or
``"bf16"``, :mod:`.numba_backend`) runs there under ``BMLMPI_KERNEL=auto``/``numba``.

Registered here:

* ``fp16``: IEEE half (5 exponent bits, 10 mantissa bits, largest finite 65504); numpy's
  own float16 conversion (round to nearest even).
* ``bf16``: bfloat16 (float32's 8 exponent bits, 7 mantissa bits): the top half of a float32,
  rounded to nearest even by adding 0x7FFF plus the lowest kept bit; a NaN keeps its sign and
  gets the quiet bit (its payload may sit in the dropped bits).

Source: IEEE 754-2008 binary16; bfloat16 as in Google's TPU and Intel's BF16 specification;
Horovod ``Compression.fp16`` and PyTorch's fp16/bf16 compress hooks for the use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CODES = np.dtype(np.uint16)


@dataclass(frozen=True)
class WireFormat:
    """One 16-bit wire format (module docstring).

    ``encode``: a float32 or float64 array -> uint16 codes (nearest even; NaN stays NaN);
    ``decode``: codes -> float32 (exact). ``unit``: the unit roundoff; ``largest``: the
    largest finite value; ``bound``: the power of two below ``largest`` that every scaled
    partial sum is kept under (:func:`bmlmpi.compression.wire.bound` lowers it for many
    ranks); ``numba``: the numba kernel family that sums its codes, None for numpy only.
    """

    name: str
    encode: Callable[[np.ndarray], np.ndarray]
    decode: Callable[[np.ndarray], np.ndarray]
    unit: float
    largest: float
    bound: float
    numba: str | None = None

    @property
    def op(self) -> str:
        """The kernel op that sums this format's codes."""
        return f"sum_{self.name}"


_FORMATS: dict[str, WireFormat] = {}


def register(fmt: WireFormat) -> WireFormat:
    """Add ``fmt`` (its name must be new); returns it."""
    if not isinstance(fmt, WireFormat):
        raise TypeError(f"register takes a WireFormat, not {type(fmt).__name__}")
    if fmt.name in _FORMATS:
        raise ValueError(f"wire format {fmt.name!r} is already registered")
    if not 0 < fmt.bound < fmt.largest:
        raise ValueError(f"wire format {fmt.name!r}: bound must lie in (0, largest)")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Remove a registered format (a test's own)."""
    del _FORMATS[name]


def names() -> tuple[str, ...]:
    """The registered formats' names, in the order of registration."""
    return tuple(_FORMATS)


def ops() -> tuple[str, ...]:
    """The kernel ops of the registered formats."""
    return tuple(f.op for f in _FORMATS.values())


def get(name: str) -> WireFormat:
    """The format called ``name``; ValueError naming the registered ones otherwise."""
    fmt = _FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown wire format {name!r}; wire formats: {', '.join(_FORMATS)} "
                         f"or None (the array's own dtype)")
    return fmt


def for_op(op: str) -> WireFormat | None:
    """The format whose kernel op is ``op``, or None."""
    if op.startswith("sum_"):
        return _FORMATS.get(op[4:])
    return None


def _encode_fp16(x: np.ndarray) -> np.ndarray:
    # straight from x's own dtype: float64 through float32 could round twice
    return np.asarray(x).astype(np.float16).view(np.uint16)


def _decode_fp16(codes: np.ndarray) -> np.ndarray:
    return codes.view(np.float16).astype(np.float32)


def _encode_bf16(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    u = np.ascontiguousarray(x).view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
           >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        # truncating keeps sign, exponent and the top mantissa bits; the quiet bit makes sure
        # a NaN whose payload sat in the dropped bits stays a NaN
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def _decode_bf16(codes: np.ndarray) -> np.ndarray:
    return (codes.astype(np.uint32) << np.uint32(16)).view(np.float32)


FP16 = register(WireFormat("fp16", _encode_fp16, _decode_fp16, unit=2.0 ** -11,
                           largest=65504.0, bound=2.0 ** 15, numba="half"))
BF16 = register(WireFormat("bf16", _encode_bf16, _decode_bf16, unit=2.0 ** -8,
                           largest=float(2.0 ** 128 * (1 - 2.0 ** -8)), bound=2.0 ** 126,
                           numba="bf16"))

__all__ = ["BF16", "CODES", "FP16", "WireFormat", "for_op", "get", "names", "ops", "register",
           "unregister"]
