"""The numba back end: multi-threaded CPU loops, one pass over ``dst`` however many sources.

Importing this module imports numba (about half a second) but compiles nothing: each kernel is
compiled on its first call for the array types it meets (a fraction of a second to a few
seconds) and cached on disk under the user's cache directory (:mod:`.numba_cache`), so later
processes load it in milliseconds. :func:`warmup` compiles ahead of time.

The op is a runtime argument rather than a compile-time constant: the branch on it sits
outside the element loop after LLVM unswitches it, so each loop still vectorises, and one
compilation per dtype serves all four ops (four times fewer compilations than one kernel per
op). The fused kernel takes the sources as a tuple and is compiled once per source count.

float16 has no scalar type in numba, so float16 arrays are passed as uint16 views and
converted to float32 and back with LLVM's ``fpext``/``fptrunc`` (one instruction each on
x86-64 with F16C). Arithmetic runs in float32, as numpy's does, so results match numpy bit
for bit. The wire ops take uint16 codes, by kernel family (:data:`WIRE_FAMILIES`, named by a
registered wire format, :mod:`.wire_formats`): ``half`` codes go through the float16 kernels
above; ``bf16`` codes are widened to float32 by a shift and rounded back to nearest even with
integer arithmetic on the float32's bits (NaN keeps its quiet bit), as the ``bf16`` format's
``encode`` does. Extended precision (longdouble,
clongdouble) is not available in numba; the
dispatcher sends it to numpy.

Every kernel has a one-thread form and a parallel (``prange``) form; a call takes the parallel
form when this process uses several threads and ``dst`` holds at least
``limits.PARALLEL_MIN_BYTES`` (1 MiB). Both forms give the same bits (element-wise, nothing
reassociated). Kernels release the GIL (``nogil=True``) so a progress thread can reduce while
Python runs.

Threads: the CPUs this process may run on, divided by the number of MPI ranks on the node when
the launcher says (``OMPI_COMM_WORLD_LOCAL_SIZE``, ``MPI_LOCALNRANKS``, ...), at least one and
at most numba's maximum; ``BMLMPI_KERNEL_THREADS`` or :func:`set_threads` overrides. More
threads than free cores is ruinous for a fork-join kernel: each call waits for descheduled
threads (on the shared 2-core development machine under load, 1 MiB calls went from 20 us to
tens of milliseconds; perf/kernels/). On a machine shared with other jobs, set
``BMLMPI_KERNEL_THREADS=1``. The GNU OpenMP threading layer is not fork-safe: a process forked
after a parallel kernel ran must not call one itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from .. import config
from .limits import NUMBA_DTYPES, PARALLEL_MIN_BYTES
from .numba_cache import cached

NAME = "numba"

OP_CODE = {"sum": 0, "prod": 1, "min": 2, "max": 3}

#: dtypes with a numba kernel (float16 through uint16 views).
SUPPORTED = NUMBA_DTYPES

_HALF = np.dtype(np.float16)

_forced_form: bool | None = None


def kernel(**flags):
    """``njit`` for a kernel: releases the GIL, cached on disk under the user's cache directory
    (:mod:`.numba_cache`; numba's ``cache=True`` would write into the installed package)."""
    return lambda func: cached(njit(nogil=True, **flags)(func))


# -- element operations ------------------------------------------------------------------------

def _less(a, b):  # typed per dtype by the overload below
    raise NotImplementedError


@overload(_less, inline="always")
def _less_impl(a, b):
    if isinstance(a, types.Complex):
        # Complex MIN/MAX are refused before any kernel runs; this keeps the shared kernel
        # typable for complex dtypes.
        return lambda a, b: False
    return lambda a, b: a < b


@njit(inline="always")
def _apply(op, a, b):
    if op == 0:
        return a + b
    if op == 1:
        return a * b
    # NaN propagates from either side, as np.minimum/np.maximum: when b is NaN the
    # comparison is false and b is returned; when a is NaN, a != a picks a.
    if op == 2:
        return a if (_less(a, b) or a != a) else b
    return a if (_less(b, a) or a != a) else b


@intrinsic
def _half_to_float(typingctx, bits):
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _float_to_half(typingctx, x):
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def _bf16_to_float(typingctx, bits):
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)),
                               ir.FloatType())

    return sig, codegen


@intrinsic
def _float_to_bf16(typingctx, x):
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        high = builder.lshr(bits, ir.Constant(i32, 16))
        # round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate
        bias = builder.add(ir.Constant(i32, 0x7FFF), builder.and_(high, ir.Constant(i32, 1)))
        rounded = builder.trunc(builder.lshr(builder.add(bits, bias), ir.Constant(i32, 16)),
                                ir.IntType(16))
        quiet = builder.trunc(builder.or_(high, ir.Constant(i32, 0x40)), ir.IntType(16))
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.select(nan, quiet, rounded)

    return sig, codegen


# -- kernels -----------------------------------------------------------------------------------
# All arrays are one-dimensional and contiguous (the dispatcher flattens them). Each kernel has a
# one-thread form (no fork-join: small arrays, or one thread per rank) and a parallel form; they
# are separate functions because numba's cache tells functions apart by name, not by flags.

@njit(inline="always")
def _pair_at(dst, src, op, i):
    dst[i] = _apply(op, dst[i], src[i])


@njit(inline="always")
def _many_at(dst, srcs, op, i):
    acc = dst[i]
    for k in range(len(srcs)):
        acc = _apply(op, acc, srcs[k][i])
    dst[i] = acc


@njit(inline="always")
def _pair_half_at(dst, src, op, i):
    dst[i] = _float_to_half(_apply(op, _half_to_float(dst[i]), _half_to_float(src[i])))


@njit(inline="always")
def _many_half_at(dst, srcs, op, i):
    acc = _half_to_float(dst[i])
    for k in range(len(srcs)):
        acc = _apply(op, acc, _half_to_float(srcs[k][i]))
    dst[i] = _float_to_half(acc)


@njit(inline="always")
def _pair_bf16_at(dst, src, i):
    dst[i] = _float_to_bf16(_bf16_to_float(dst[i]) + _bf16_to_float(src[i]))


@njit(inline="always")
def _many_bf16_at(dst, srcs, i):
    acc = _bf16_to_float(dst[i])
    for k in range(len(srcs)):
        acc += _bf16_to_float(srcs[k][i])
    dst[i] = _float_to_bf16(acc)


@kernel()
def _pair_1(dst, src, op):
    for i in range(dst.size):
        _pair_at(dst, src, op, i)


@kernel(parallel=True)
def _pair_n(dst, src, op):
    for i in prange(dst.size):
        _pair_at(dst, src, op, i)


@kernel()
def _many_1(dst, srcs, op):
    for i in range(dst.size):
        _many_at(dst, srcs, op, i)


@kernel(parallel=True)
def _many_n(dst, srcs, op):
    for i in prange(dst.size):
        _many_at(dst, srcs, op, i)


@kernel()
def _pair_half_1(dst, src, op):
    for i in range(dst.size):
        _pair_half_at(dst, src, op, i)


@kernel(parallel=True)
def _pair_half_n(dst, src, op):
    for i in prange(dst.size):
        _pair_half_at(dst, src, op, i)


@kernel()
def _many_half_1(dst, srcs, op):
    for i in range(dst.size):
        _many_half_at(dst, srcs, op, i)


@kernel(parallel=True)
def _many_half_n(dst, srcs, op):
    for i in prange(dst.size):
        _many_half_at(dst, srcs, op, i)


@kernel()
def _divide_1(dst, n):
    for i in range(dst.size):
        dst[i] = dst[i] / n


@kernel(parallel=True)
def _divide_n(dst, n):
    for i in prange(dst.size):
        dst[i] = dst[i] / n


@kernel()
def _divide_half_1(dst, n):
    for i in range(dst.size):
        dst[i] = _float_to_half(_half_to_float(dst[i]) / n)


@kernel(parallel=True)
def _divide_half_n(dst, n):
    for i in prange(dst.size):
        dst[i] = _float_to_half(_half_to_float(dst[i]) / n)


# ``out = a <op> b``: the reduction of a range that still holds the input, in one pass
# (kernels/combine.py).
@njit(inline="always")
def _to_at(out, a, b, op, i):
    out[i] = _apply(op, a[i], b[i])


@njit(inline="always")
def _to_half_at(out, a, b, op, i):
    out[i] = _float_to_half(_apply(op, _half_to_float(a[i]), _half_to_float(b[i])))


@kernel()
def _to_1(out, a, b, op):
    for i in range(out.size):
        _to_at(out, a, b, op, i)


@kernel(parallel=True)
def _to_n(out, a, b, op):
    for i in prange(out.size):
        _to_at(out, a, b, op, i)


@kernel()
def _to_half_1(out, a, b, op):
    for i in range(out.size):
        _to_half_at(out, a, b, op, i)


@kernel(parallel=True)
def _to_half_n(out, a, b, op):
    for i in prange(out.size):
        _to_half_at(out, a, b, op, i)


@kernel()
def _pair_bf16_1(dst, src, op):
    for i in range(dst.size):
        _pair_bf16_at(dst, src, i)


@kernel(parallel=True)
def _pair_bf16_n(dst, src, op):
    for i in prange(dst.size):
        _pair_bf16_at(dst, src, i)


@kernel()
def _many_bf16_1(dst, srcs, op):
    for i in range(dst.size):
        _many_bf16_at(dst, srcs, i)


@kernel(parallel=True)
def _many_bf16_n(dst, srcs, op):
    for i in prange(dst.size):
        _many_bf16_at(dst, srcs, i)


# (one-thread form, parallel form) per job.
_KERNELS = {
    "pair": (_pair_1, _pair_n), "many": (_many_1, _many_n),
    "pair_half": (_pair_half_1, _pair_half_n), "many_half": (_many_half_1, _many_half_n),
    "pair_bf16": (_pair_bf16_1, _pair_bf16_n), "many_bf16": (_many_bf16_1, _many_bf16_n),
    "divide": (_divide_1, _divide_n), "divide_half": (_divide_half_1, _divide_half_n),
    "to": (_to_1, _to_n), "to_half": (_to_half_1, _to_half_n),
}


# -- threads -----------------------------------------------------------------------------------

# Launchers' counts of ranks on this node (Open MPI, MPICH/Hydra, MVAPICH, PMI, Cray PALS).
_LOCAL_RANKS_ENV = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE")


def _local_ranks() -> int:
    for name in _LOCAL_RANKS_ENV:
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def _default_threads() -> int:
    n = config.get("BMLMPI_KERNEL_THREADS")
    if n is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        # Ranks sharing a node share its cores: a fork-join kernel whose threads outnumber
        # the cores waits for descheduled threads at every call (measured: 100x slower).
        n = max(1, cpus // _local_ranks())
    return max(1, min(n, numba.config.NUMBA_NUM_THREADS))


_threads = _default_threads()


def set_threads(n: int | None) -> None:
    """Use ``n`` threads per kernel call (``None``: back to the default described above)."""
    global _threads
    if n is None:
        _threads = _default_threads()
    elif isinstance(n, int) and n >= 1:
        _threads = min(n, numba.config.NUMBA_NUM_THREADS)
    else:
        raise ValueError(f"thread count must be a positive integer or None, got {n!r}")


def threads() -> int:
    return _threads


def call(kernel, *args) -> None:
    """Run a parallel numba kernel with this back end's thread count."""
    # numba's thread count is per calling thread; set ours for the call and restore the
    # caller's so user numba code in the same thread is unaffected.
    before = numba.get_num_threads()
    if before == _threads:
        kernel(*args)
        return
    numba.set_num_threads(_threads)
    try:
        kernel(*args)
    finally:
        numba.set_num_threads(before)


def force_form(parallel: bool | None) -> None:
    """For tests and benchmarks: always use the parallel (True) or one-thread (False) kernels;
    None restores the choice by size and thread count."""
    global _forced_form
    _forced_form = parallel


def uses_parallel(nbytes: int) -> bool:
    """Whether a call on ``nbytes`` of ``dst`` runs the parallel kernels."""
    if _forced_form is not None:
        return _forced_form
    return _threads > 1 and nbytes >= PARALLEL_MIN_BYTES


def _run(job: str, nbytes: int, *args, parallel: bool | None = None) -> None:
    if parallel is None:
        parallel = uses_parallel(nbytes)
    one, many = _KERNELS[job]
    if parallel:
        call(many, *args)
    else:
        one(*args)


# -- entry points (arguments validated, one-dimensional, contiguous, same dtype) ---------------
# ``parallel``: None chooses by size (see PARALLEL_MIN_BYTES); True or False forces a form.

def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype == _HALF else a


def reduce_into(dst: np.ndarray, src: np.ndarray, op: str, *,
                parallel: bool | None = None) -> None:
    job = "pair_half" if dst.dtype == _HALF else "pair"
    _run(job, dst.nbytes, _bits(dst), _bits(src), OP_CODE[op], parallel=parallel)


def reduce_many_into(dst: np.ndarray, srcs: Sequence[np.ndarray], op: str, *,
                     parallel: bool | None = None) -> None:
    if len(srcs) == 1:
        reduce_into(dst, srcs[0], op, parallel=parallel)
        return
    if len({s.flags.writeable for s in srcs}) > 1:
        # numba types read-only and writable arrays differently, and a tuple mixing them
        # cannot be indexed in the loop: give every source the same type.
        srcs = [s if s.flags.writeable else s.copy() for s in srcs]
    job = "many_half" if dst.dtype == _HALF else "many"
    _run(job, dst.nbytes, _bits(dst), tuple(_bits(s) for s in srcs), OP_CODE[op],
         parallel=parallel)


def combine_into(out: np.ndarray, a: np.ndarray, b: np.ndarray, op: str, *,
                 parallel: bool | None = None) -> None:
    """``out = a <op> b`` (``out`` overlapping neither source, or equal to one)."""
    job = "to_half" if out.dtype == _HALF else "to"
    _run(job, out.nbytes, _bits(out), _bits(a), _bits(b), OP_CODE[op], parallel=parallel)


#: the kernel families that sum 16-bit wire codes (a wire format names one as its ``numba``)
WIRE_FAMILIES = ("half", "bf16")


def wire_reduce_many_into(dst: np.ndarray, srcs: Sequence[np.ndarray], family: str, *,
                          parallel: bool | None = None) -> None:
    """A wire op on uint16 codes with the kernels of ``family`` (:data:`WIRE_FAMILIES`):
    float32 sum, one rounding."""
    if len({s.flags.writeable for s in srcs}) > 1:
        srcs = [s if s.flags.writeable else s.copy() for s in srcs]
    if family not in WIRE_FAMILIES:
        raise ValueError(f"no numba wire kernels of family {family!r}")
    job = f"pair_{family}" if len(srcs) == 1 else f"many_{family}"
    args = srcs[0] if len(srcs) == 1 else tuple(srcs)
    _run(job, dst.nbytes, dst, args, OP_CODE["sum"], parallel=parallel)


def warmup_wire(families: Iterable[str], sources: Iterable[int] = (1, 2)) -> None:
    """Compile (or load) the wire kernels of these families for these source counts, as
    :func:`warmup`."""
    forms = (False, True) if _threads > 1 or _forced_form else (False,)
    for family in families:
        for parallel in forms:
            for k in sorted(set(sources)):
                if (f"wire_{family}", k, parallel) in _warm:
                    continue
                one = np.zeros(1, np.uint16)
                wire_reduce_many_into(one, [np.zeros(1, np.uint16) for _ in range(k)], family,
                                      parallel=parallel)
                _warm.add((f"wire_{family}", k, parallel))


def scale_avg(dst: np.ndarray, n: int, *, parallel: bool | None = None) -> None:
    """Floats only (float16/32/64); integer floor division stays with numpy (libdivide)."""
    if dst.dtype == _HALF:
        _run("divide_half", dst.nbytes, dst.view(np.uint16), np.float32(n), parallel=parallel)
    elif dst.dtype.kind == "f":
        _run("divide", dst.nbytes, dst, dst.dtype.type(n), parallel=parallel)
    else:
        raise TypeError(f"numba scale_avg handles float16/32/64, not {dst.dtype}")


_warm: set[tuple[np.dtype | str, int, bool]] = set()


def warmup(dtypes: Iterable[np.dtype], sources: Iterable[int] = (1, 2)) -> None:
    """Compile (or load from the disk cache) the kernels for ``dtypes`` and source counts:
    the one-thread forms, and the parallel forms too when this process uses several threads.
    Cheap to repeat: what is already loaded is skipped."""
    forms = (False, True) if _threads > 1 or _forced_form else (False,)
    for dt in dtypes:
        dt = np.dtype(dt)
        if dt not in SUPPORTED:
            continue
        one = np.zeros(1, dt)
        for parallel in forms:
            for k in sorted(set(sources)):
                if (dt, k, parallel) in _warm:
                    continue
                reduce_many_into(one, [np.zeros(1, dt) for _ in range(k)], "sum",
                                 parallel=parallel)
                if k == 1:
                    combine_into(one, np.zeros(1, dt), np.zeros(1, dt), "sum",
                                 parallel=parallel)
                if k == 1 and dt.kind == "f":
                    scale_avg(one, 2, parallel=parallel)
                _warm.add((dt, k, parallel))
