"""The collective records: what each collective's result must be, which the verifier checks.

A collective is a result contract over the ranks' input and output buffers, stated in the
terms of a :class:`~bmlmpi.schedules.types.Schedule` (a work buffer of ``count`` elements,
rank j's block ``[off_j, off_j + counts[j])`` where ``off = block_offsets(counts)``):

* ``allreduce``: every rank's output ``[0, count)`` is the reduction of every rank's input.
* ``reduce_scatter``: rank r's output ``[0, counts[r])`` is the reduction of every rank's
  input block r (``counts`` may be uneven and hold zeros; the input has ``count`` elements).
* ``allgather``: every rank's output ``[off_j, off_j + counts[j])`` is rank j's input (of
  ``counts[j]`` elements), for every j (MPI's ``Allgatherv`` with packed displacements; other
  displacements are a final copy of each block, the executor's).
* ``reduce``: the root's output ``[0, count)`` is the reduction; no other rank writes its
  output at all (MPI leaves a non-root recvbuf untouched).
* ``bcast``: every rank's output ``[0, count)`` is the root's input.
* ``alltoall``: ``counts`` is the ``size × size`` matrix, row-major: ``counts[i·size + j]``
  elements go from rank i to rank j (MPI's ``Alltoall`` has every entry equal; ``Alltoallv``'s
  per-pair counts may be uneven and hold zeros). Rank r's input is its row packed, block j
  for rank j; its output is its column packed, block j from rank j: output
  ``[Σ_{i<j} counts[i·size + r], …)`` is rank j's input from ``Σ_{i<r} counts[j·size + i]``.
  Other displacements are copies of each block into place, as for the allgather. ``count``
  is the work buffer, which the algorithm sizes (room for the blocks it relays). Its
  blocks pass through other ranks, so its receives may land at another offset
  (:attr:`~bmlmpi.schedules.types.Recv.target`, :attr:`Collective.relays`).

A new collective is one record, registered (:func:`register`): a subclass of
:class:`Collective` that states its contract (:meth:`~Collective.input_size`,
:meth:`~Collective.output_size`, :meth:`~Collective.plain_inputs`,
:meth:`~Collective.plain_outputs`, :meth:`~Collective.regions`) and names its block of the
tag space (``tag_kind``). The call pipeline runs it (:func:`called`) through the algorithms
whose records serve it; docs/architecture.md, "Adding a collective", says the rest.

Each record gives the sizes of a rank's input and output, the copies of the plain layout (the
input straight into the work buffer where it belongs, the result straight out of it), and the
contract as *regions*: ``(out_lo, out_hi, contributors, in_at)`` — output ``[out_lo, out_hi)``
must hold, element for element from input position ``in_at``, the reduction of exactly the
``contributors`` (one rank for a gather or broadcast), each exactly once; every output element
outside the regions must stay unwritten.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .types import Copy, block_offsets

#: The collectives the call pipeline runs, allreduce first (``native``, the MPI library's own
#: call, serves exactly these).
NAMES = ("allreduce", "reduce_scatter", "allgather", "reduce", "bcast", "alltoall")
#: Every built-in collective with a contract: the ones the call pipeline runs.
EVERY = NAMES
#: The blocks of the tag space a registered collective may take (the tag space has eight,
#: :mod:`bmlmpi.call_numbers`; the built-in collectives hold 0 to 5).
FREE_TAG_KINDS = (6, 7)

Region = tuple[int, int, tuple[int, ...], int]


@dataclass(frozen=True)
class Collective:
    """One collective's contract (module docstring)."""

    name: str
    reduces: bool  # the result combines several ranks' data with the op
    rooted: bool   # a root takes part differently (reduce, bcast)
    blocked: bool  # each rank owns a block (``counts``)
    relays: bool = False  # blocks pass through other ranks (``counts``: the pair matrix)
    #: Its block of the tag space, one per collective, so that calls of different
    #: collectives never match each other's messages (:mod:`bmlmpi.call_numbers`).
    tag_kind: int = 0
    #: Its call's arguments do not depend on the communicator's size, so a call prepared
    #: before a failure runs among the survivors as it was prepared (the others' counts are
    #: per member: they are prepared again for the survivors).
    size_free: bool = False
    #: Its schedules run in place on the output buffer, reading a separate input only where
    #: they must; the others' run through their layout's input and output copies, which the
    #: model prices.
    in_place: bool = False
    #: Every rank plays the same part (no root, no blocks of its own), so on a symmetric
    #: network the model may price a schedule set from rank 0's schedule alone.
    symmetric: bool = False
    #: Every calibration is measured on its calls (the model's constants and the MPI
    #: library's own call), and the fixed rule's size threshold was measured on it: ``auto``
    #: prices it with any calibration and applies the fixed rule without one. The others are
    #: priced only where the calibration timed their own call, and run the default record
    #: where there is no calibration at all.
    calibrated: bool = False

    def counts_problem(self, size: int, count: int,
                       counts: Sequence[int] | None) -> str | None:
        """What is wrong with ``counts`` for this collective on ``size`` ranks (None: nothing)."""
        if self.relays:
            if counts is None or len(counts) != size * size or min(counts, default=0) < 0:
                return (f"{self.name}: pair counts {counts} must be {size}x{size} = "
                        f"{size * size} counts >= 0")
        elif self.blocked and (counts is None or len(counts) != size
                               or min(counts, default=0) < 0 or sum(counts) != count):
            return (f"{self.name}: block counts {counts} must be {size} counts >= 0 summing "
                    f"to {count}")
        return None

    def input_size(self, rank: int, count: int, root: int,
                   counts: Sequence[int] | None) -> int:
        """Elements of ``rank``'s input buffer."""
        if self.relays:
            return sum(row(counts, rank))
        return self._share(rank, count, root, counts, "allgather", "bcast")

    def output_size(self, rank: int, count: int, root: int,
                    counts: Sequence[int] | None) -> int:
        """Elements of ``rank``'s output buffer this collective writes."""
        if self.relays:
            return sum(column(counts, rank))
        return self._share(rank, count, root, counts, "reduce_scatter", "reduce")

    def _share(self, rank: int, count: int, root: int, counts: Sequence[int] | None,
               blocked: str, rooted: str) -> int:
        """``rank``'s block when this is ``blocked``, the whole buffer at the root only when
        it is ``rooted``, else the whole buffer."""
        if self.name == blocked:
            return counts[rank] if counts is not None else 0
        if self.name == rooted:
            return count if rank == root else 0
        return count

    def plain_inputs(self, rank: int, count: int, root: int,
                     counts: Sequence[int] | None) -> tuple[Copy, ...]:
        """The input copied to where it belongs in the work buffer (no permutation; an
        all-to-all's row at the start of the work buffer, its column right after it)."""
        n = self.input_size(rank, count, root, counts)
        at = block_offsets(counts)[rank] if self.name == "allgather" else 0
        return (Copy(0, n, at),) if n else ()

    def plain_outputs(self, rank: int, count: int, root: int,
                      counts: Sequence[int] | None) -> tuple[Copy, ...]:
        """The result copied out of where it lies in the work buffer (no permutation)."""
        n = self.output_size(rank, count, root, counts)
        if self.relays:
            at = self.input_size(rank, count, root, counts)
        else:
            at = block_offsets(counts)[rank] if self.name == "reduce_scatter" else 0
        return (Copy(at, at + n, 0),) if n else ()

    def regions(self, rank: int, live: Sequence[int], count: int, root: int,
                counts: Sequence[int] | None) -> list[Region]:
        """The contract for ``rank``'s output when ``live`` ranks take part."""
        everyone = tuple(live)
        if self.name == "allreduce":
            return [(0, count, everyone, 0)] if count else []
        if self.name == "reduce_scatter":
            off = block_offsets(counts)
            n = counts[rank]
            return [(0, n, everyone, off[rank])] if n else []
        if self.name == "allgather":
            off = block_offsets(counts)
            return [(off[j], off[j + 1], (j,), 0) for j in everyone if counts[j]]
        if self.name == "reduce":
            return [(0, count, everyone, 0)] if rank == root and count else []
        if self.name == "bcast":
            return [(0, count, (root,), 0)] if count else []
        if self.relays:
            into = block_offsets(column(counts, rank))
            return [(into[j], into[j + 1], (j,), sum(row(counts, j)[:rank]))
                    for j in everyone if into[j + 1] > into[j]]
        raise ValueError(f"unknown collective {self.name!r}")


COLLECTIVES: dict[str, Collective] = {
    "allreduce": Collective("allreduce", reduces=True, rooted=False, blocked=False,
                            size_free=True, in_place=True, symmetric=True, calibrated=True),
    "reduce_scatter": Collective("reduce_scatter", reduces=True, rooted=False, blocked=True,
                                 tag_kind=1),
    "allgather": Collective("allgather", reduces=False, rooted=False, blocked=True,
                            tag_kind=2),
    "reduce": Collective("reduce", reduces=True, rooted=True, blocked=False, tag_kind=3),
    "bcast": Collective("bcast", reduces=False, rooted=True, blocked=False, tag_kind=4),
    "alltoall": Collective("alltoall", reduces=False, rooted=False, blocked=False, relays=True,
                           tag_kind=5),
}
#: The collectives added by :func:`register`, which the call pipeline runs.
REGISTERED: dict[str, Collective] = {}


def register(record: Collective) -> Collective:
    """Add the collective ``record`` (replacing one registered under its name): the verifier,
    the model, the algorithm records and the call pipeline serve it from then on. Refused: a
    built-in collective's name, and a tag block not in :data:`FREE_TAG_KINDS` or another
    registered collective's."""
    name = record.name
    if name in EVERY or not name:
        raise ValueError(f"{name!r} cannot name a new collective (built in: {', '.join(EVERY)})")
    taken = {c.tag_kind for c in REGISTERED.values() if c.name != name}
    if record.tag_kind not in FREE_TAG_KINDS or record.tag_kind in taken:
        free = sorted(set(FREE_TAG_KINDS) - taken)
        raise ValueError(f"collective {name!r}: tag_kind {record.tag_kind} is not free; free: "
                         f"{free}")
    COLLECTIVES[name] = REGISTERED[name] = record
    return record


def unregister(name: str) -> None:
    """Remove a collective added by :func:`register` (a test's own toy)."""
    if name in REGISTERED:
        del REGISTERED[name]
        del COLLECTIVES[name]


def called() -> tuple[str, ...]:
    """The collectives the call pipeline runs: :data:`NAMES` and the registered ones."""
    return (*NAMES, *REGISTERED)


def every() -> tuple[str, ...]:
    """Every collective with a contract: :data:`EVERY` and the registered ones."""
    return (*EVERY, *REGISTERED)


def pair_size(counts: Sequence[int]) -> int:
    """The rank count of a ``size × size`` pair matrix."""
    size = math.isqrt(len(counts))
    if size * size != len(counts):
        raise ValueError(f"{len(counts)} pair counts are not a square matrix")
    return size


def row(counts: Sequence[int], rank: int) -> tuple[int, ...]:
    """What ``rank`` sends each rank: row ``rank`` of the pair matrix ``counts``."""
    size = pair_size(counts)
    return tuple(counts[rank * size:(rank + 1) * size])


def column(counts: Sequence[int], rank: int) -> tuple[int, ...]:
    """What ``rank`` receives from each rank: column ``rank`` of the pair matrix ``counts``."""
    size = pair_size(counts)
    return tuple(counts[j * size + rank] for j in range(size))


def collective(name: str) -> Collective:
    """The record of collective ``name`` (one of :func:`every`)."""
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(every())}") from None


__all__ = ["COLLECTIVES", "EVERY", "FREE_TAG_KINDS", "NAMES", "REGISTERED", "Collective",
           "Region",
           "called", "collective", "column", "every", "pair_size", "register", "row",
           "unregister"]
