"""torch tensors as the arrays bmlmpi and MPI read and write: views, not copies.

A contiguous CPU tensor becomes a numpy array over the same memory (``Tensor.numpy()`` on the
detached tensor: no copy). A CUDA tensor becomes a cupy array over the same device memory
(DLPack) where cupy is installed; bmlmpi's device path takes it from there. A non-contiguous
tensor is copied into a contiguous one and the result copied back when the call completes
(:class:`View`'s ``finish``). ``torch.bfloat16`` has no numpy dtype: the copying collectives
move its bytes as ``int16`` (exact); a reduction of it is refused.

The reduction ops map onto bmlmpi's: SUM, AVG (bmlmpi.AVG: the sum divided by the ranks that
contributed; floor division for integer tensors), PRODUCT, MIN, MAX. Every other
``torch.distributed.ReduceOp`` (BAND, BOR, BXOR, PREMUL_SUM) raises :class:`UnsupportedCall`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..ops import AVG


class UnsupportedCall(ValueError):
    """An op, dtype or tensor the bmlmpi backend does not serve (raised before any
    communication; the same arguments raise it on every rank)."""


_RED = dist.ReduceOp.RedOpType
_OPS: dict[Any, Any] = {_RED.SUM: MPI.SUM, _RED.AVG: AVG, _RED.PRODUCT: MPI.PROD,
                        _RED.MIN: MPI.MIN, _RED.MAX: MPI.MAX}
#: dtypes bmlmpi reduces (numpy kinds i, u, f, c); bool and bfloat16 are refused
_REDUCIBLE = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64, torch.complex64, torch.complex128}


def reduce_op(op: Any) -> Any:
    """bmlmpi's op for a ``torch.distributed.ReduceOp`` (or its ``RedOpType``)."""
    kind = getattr(op, "op", op)
    try:
        return _OPS[kind]
    except (KeyError, TypeError):
        raise UnsupportedCall(
            f"the bmlmpi backend reduces with SUM, AVG, PRODUCT, MIN and MAX; {kind} is not "
            f"supported") from None


def is_avg(op: Any) -> bool:
    return op is AVG


def check_reducible(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _REDUCIBLE:
        raise UnsupportedCall(
            f"the bmlmpi backend cannot reduce {what} of dtype {t.dtype}: it reduces integer, "
            f"float16/32/64 and complex tensors (bool and bfloat16 have no reduction in "
            f"bmlmpi; cast them first)")
    if t.is_sparse:
        raise UnsupportedCall(f"the bmlmpi backend reduces dense tensors; {what} is sparse")


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


@dataclass
class View:
    """The array a collective reads and writes for one tensor, and what follows the call."""

    array: Any                                  # numpy (CPU) or cupy (CUDA) array
    finish: Callable[[], None] | None = None    # copies a staged result back into the tensor


def host_view(t: torch.Tensor, *, copy_only: bool = False) -> View:
    """A numpy view of CPU tensor ``t`` (a contiguous copy, written back by ``finish``, when
    ``t`` is not contiguous). ``copy_only``: the collective only moves bytes, so bfloat16
    travels as int16."""
    base = t.detach()
    if base.is_conj():
        base = base.resolve_conj()
    staged = base if base.is_contiguous() and base.data_ptr() == t.data_ptr() \
        else base.contiguous()
    if staged.dtype == torch.bfloat16:
        if not copy_only:
            check_reducible(t, "the tensor")
        arr = staged.view(torch.int16).numpy()
    else:
        arr = staged.numpy()
    finish = None
    if staged.data_ptr() != t.data_ptr():
        def finish(t=t, staged=staged) -> None:
            with torch.no_grad():
                t.copy_(staged)
    return View(arr.reshape(-1), finish)


def device_view(t: torch.Tensor) -> View | None:
    """A cupy view of CUDA tensor ``t`` over the same memory (DLPack), or None without cupy.
    The tensor's pending kernels are waited for first: bmlmpi's device path runs on cupy's
    stream, not torch's."""
    cupy = _cupy()
    if cupy is None:
        return None
    base = t.detach()
    staged = base if base.is_contiguous() else base.contiguous()
    torch.cuda.current_stream(t.device).synchronize()
    arr = cupy.from_dlpack(staged).reshape(-1)
    finish = None
    if staged.data_ptr() != t.data_ptr():
        def finish(t=t, staged=staged) -> None:
            with torch.no_grad():
                t.copy_(staged)
    return View(arr, finish)


def staged_on_host(t: torch.Tensor, *, copy_only: bool = False) -> View:
    """A host copy of a device tensor (cupy missing, or a collective without a device path):
    the result is copied back to the device by ``finish``."""
    host = t.detach().to("cpu").contiguous()
    inner = host_view(host, copy_only=copy_only)

    def finish(t=t, host=host) -> None:
        with torch.no_grad():
            t.copy_(host.to(t.device))
    return View(inner.array, finish)


def view(t: torch.Tensor, *, copy_only: bool = False, device_path: bool = True) -> View:
    """The array of ``t`` for a collective: a view where the memory allows one."""
    if t.device.type == "cpu":
        return host_view(t, copy_only=copy_only)
    if t.device.type == "cuda" and device_path:
        v = device_view(t)
        if v is not None:
            return v
    return staged_on_host(t, copy_only=copy_only)


def same_layout(tensors: list[torch.Tensor], what: str) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise UnsupportedCall(f"{what}: tensors of different dtypes {sorted(map(str, dtypes))}")


__all__ = ["UnsupportedCall", "View", "check_reducible", "device_view", "host_view", "is_avg",
           "reduce_op", "same_layout", "staged_on_host", "view"]
