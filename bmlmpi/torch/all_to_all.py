"""All-to-all of the bmlmpi backend: torch's ``all_to_all_single`` (equal or uneven split
sizes) and ``all_to_all`` (the list form), both on bmlmpi's ``Communicator.Ialltoallv``.

``all_to_all_single(output, input, output_split_sizes, input_split_sizes)`` cuts both tensors
along dim 0: ``input_split_sizes[j]`` rows go to rank j, ``output_split_sizes[i]`` rows come
from rank i (no sizes: ``size`` equal parts, dim 0 must divide by ``size``). A row is
``prod(shape[1:])`` elements, so the counts bmlmpi exchanges are rows times that. The list
form sends ``inputs[j]`` to rank j and receives rank i's into ``outputs[i]``; the tensors may
differ in size from peer to peer. Both run as one ``Alltoallv`` (the list form over the inputs
concatenated, the outputs copied out after it completes).

Every call is an ``Alltoallv``, equal split sizes included: whether a rank's blocks are equal
is its own affair (rank 0 may send and receive equal blocks while rank 1's are uneven), and
every rank must make the same collective call. bmlmpi's ``Ialltoallv`` gathers every rank's
counts first (one ``Allgather`` of 2·size integers, blocking, in the calling thread) and
checks that each pair agrees: rank i's rows for j must be the rows j expects from i, else
:class:`bmlmpi.ArgumentMismatch` on every rank.

Bad arguments are refused on every rank: a rank whose split sizes do not fit its tensor (a
length other than ``size``, a negative size, sizes that do not add up to dim 0, dim 0 not
dividing by ``size`` without sizes) still takes part in that gathering of counts with counts
bmlmpi refuses (-1), so the others raise :class:`bmlmpi.RemoteArgumentError` naming it while
it raises :class:`~.tensors.UnsupportedCall` naming its own mistake; nobody waits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .tensors import UnsupportedCall, View, view

#: the counts a rank hands bmlmpi when its own arguments are wrong: refused by bmlmpi's
#: check on this rank, seen as a refusal (-1s) by every other rank
_REFUSED = -1


def _row(t: torch.Tensor) -> int:
    """Elements in one dim-0 row of ``t``."""
    return math.prod(t.shape[1:])


def _counts(t: torch.Tensor, splits: list[int], n: int, what: str) -> list[int]:
    """The element counts of ``t``'s ``n`` blocks by dim-0 ``splits`` (empty: equal parts);
    :class:`UnsupportedCall` where they do not fit ``t``."""
    if t.dim() == 0:
        raise UnsupportedCall(f"{what} is a 0-dimensional tensor; all_to_all_single cuts "
                              f"tensors along dim 0")
    rows = t.shape[0]
    if not splits:
        if rows % n:
            raise UnsupportedCall(f"{what} has {rows} rows along dim 0, which do not divide "
                                  f"into {n} equal parts (give split sizes)")
        return [rows // n * _row(t)] * n
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise UnsupportedCall(f"{what}: {len(splits)} split sizes for a group of {n}")
    if any(s < 0 for s in splits):
        raise UnsupportedCall(f"{what}: negative split sizes {splits}")
    if sum(splits) != rows:
        raise UnsupportedCall(f"{what}: the split sizes {splits} add up to {sum(splits)} "
                              f"rows, the tensor has {rows} along dim 0")
    return [s * _row(t) for s in splits]


def _vector(v: View, counts: list[int]) -> list[Any]:
    """mpi4py's ``[buffer, counts]`` spec of blocks packed in rank order."""
    return [v.array, np.asarray(counts, dtype=np.int64)]


class Exchange:
    """One all-to-all of the backend, ready to start: ``start()`` returns bmlmpi's request;
    ``views`` (the arrays MPI reads and writes, and the copies back after completion) stay
    alive until it completes."""

    def __init__(self, communicator: Any, src: View, sends: list[int], dst: View,
                 recvs: list[int], after: list[Any]):
        self.communicator = communicator
        self.views = [src, dst, *after]
        self._sendbuf = _vector(src, sends)
        self._recvbuf = _vector(dst, recvs)

    def start(self) -> Any:
        return self.communicator.Ialltoallv(self._sendbuf, self._recvbuf)


def _refuse(communicator: Any, mistake: UnsupportedCall) -> None:
    """Take part in the gathering of counts with counts bmlmpi refuses, so every other rank
    raises (:class:`bmlmpi.RemoteArgumentError` naming this one), then raise ``mistake``."""
    n = communicator.size
    nothing = np.empty(0, dtype=np.uint8)
    bad = [nothing, np.full(n, _REFUSED, dtype=np.int64)]
    try:
        communicator.Ialltoallv(bad, bad)
    except Exception as exc:  # noqa: BLE001 - bmlmpi's refusal of the -1s, expected
        raise mistake from exc
    raise RuntimeError("bmlmpi accepted negative all-to-all counts")  # pragma: no cover


def single(communicator: Any, output: torch.Tensor, input: torch.Tensor,
           output_split_sizes: list[int], input_split_sizes: list[int]) -> Exchange:
    """``all_to_all_single``'s exchange (its arguments checked, refused on every rank)."""
    n = communicator.size
    try:
        if output.dtype != input.dtype:
            raise UnsupportedCall(f"all_to_all_single: the output is {output.dtype}, the "
                                  f"input {input.dtype}")
        if output.is_sparse or input.is_sparse:
            raise UnsupportedCall("all_to_all_single moves dense tensors")
        sends = _counts(input, list(input_split_sizes), n, "all_to_all_single's input")
        recvs = _counts(output, list(output_split_sizes), n, "all_to_all_single's output")
    except UnsupportedCall as mistake:
        _refuse(communicator, mistake)
    src = view(input, copy_only=True, device_path=False)
    dst = view(output, copy_only=True, device_path=False)
    return Exchange(communicator, src, sends, dst, recvs, [])


class _CopyOut:
    """After the exchange: the received blocks copied into the output tensors."""

    def __init__(self, flat: torch.Tensor, outputs: list[torch.Tensor]):
        self.flat = flat
        self.outputs = outputs

    def finish(self) -> None:
        with torch.no_grad():
            at = 0
            for o in self.outputs:
                o.copy_(self.flat[at:at + o.numel()].view(o.shape))
                at += o.numel()


def listed(communicator: Any, outputs: list[torch.Tensor],
           inputs: list[torch.Tensor]) -> Exchange:
    """``all_to_all``'s exchange: ``inputs[j]`` to rank j, rank i's into ``outputs[i]``."""
    n = communicator.size
    try:
        if len(inputs) != n or len(outputs) != n:
            raise UnsupportedCall(f"all_to_all: {len(inputs)} input and {len(outputs)} output "
                                  f"tensors for a group of {n} (one of each per rank)")
        dtypes = {t.dtype for t in (*inputs, *outputs)}
        if len(dtypes) > 1:
            raise UnsupportedCall(f"all_to_all: tensors of different dtypes "
                                  f"{sorted(map(str, dtypes))}")
        if any(t.is_sparse for t in (*inputs, *outputs)):
            raise UnsupportedCall("all_to_all moves dense tensors")
    except UnsupportedCall as mistake:
        _refuse(communicator, mistake)
    dtype = inputs[0].dtype
    flat_in = torch.cat([t.detach().reshape(-1).cpu() for t in inputs])
    flat_out = torch.empty(sum(o.numel() for o in outputs), dtype=dtype)
    src = view(flat_in, copy_only=True)
    dst = view(flat_out, copy_only=True)
    return Exchange(communicator, src, [t.numel() for t in inputs], dst,
                    [o.numel() for o in outputs], [_CopyOut(flat_out, outputs)])


__all__ = ["Exchange", "listed", "single"]
