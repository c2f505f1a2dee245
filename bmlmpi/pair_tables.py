"""An ``Alltoallv``'s pair counts, gathered once per set of counts: :class:`PairTables`.

A schedule needs every rank's counts (the pair matrix), which ``Alltoallv`` gives each rank
only its own row and column of, so a call gathers them (``2·size`` int64 per rank, one
``Allgather``). A program usually repeats one exchange: the communicator keeps the tables it
gathered, by this rank's own row and column. A call whose own counts match a kept table
sends only that table's digest: every rank sends ``[d, −d]`` in one ``MAX`` allreduce of two
int64 (``d`` = −1 where it keeps none), and where the result says every rank holds the same
table (max d = min d ≥ 0) that table is the call's, each rank's row and column in it being
its own. Otherwise every rank gathers the counts, as before: a rank whose counts changed
misses, so the others gather with it, and a pair whose two sides differ is refused on every
rank by the gathered table's check (:func:`bmlmpi.family.alltoallv_counts`). A table that
call refuses (a rank's row of −1, or a pair whose two sides differ) is never kept.

The digest of the table a call agreed on (:attr:`PairTables.digest`, None for one not kept)
is part of the blocking ``Alltoallv``'s fast-path signature (:mod:`bmlmpi.fast_path`): every
rank agrees on the table before it takes its entry, so a rank whose own counts did not change
never runs a schedule compiled for the pair matrix that other ranks have since changed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np
from mpi4py import MPI

#: Tables kept per communicator (the least recently used goes first).
KEPT = 8


def _digest(table: np.ndarray) -> int:
    """63 bits of a table's hash: a non-negative int64."""
    return int.from_bytes(hashlib.blake2b(table.tobytes(), digest_size=8).digest(),
                          "little") >> 1


class PairTables:
    """The pair tables one communicator gathered, by this rank's own counts (module
    docstring). ``gathered`` counts the full gathers, ``reused`` the calls that sent only a
    digest."""

    def __init__(self) -> None:
        self.tables: OrderedDict[bytes, tuple[np.ndarray, int]] = OrderedDict()
        self.gathered = 0
        self.reused = 0
        #: the digest of the table the last call agreed on; None where it was not kept
        self.digest: int | None = None
        #: this rank's row and column (never written to), by the specs they were read from
        #: (:func:`bmlmpi.family.alltoallv_counts`)
        self.rows: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def keep_row(self, specs: tuple, mine: np.ndarray) -> None:
        """Keep this rank's row and column ``mine`` read from ``specs`` (the least recently
        kept of more than :data:`KEPT` goes); nothing writes to it."""
        self.rows[specs] = mine
        while len(self.rows) > KEPT:
            self.rows.popitem(last=False)

    def agreed(self, mine: np.ndarray, comm: Any) -> np.ndarray:
        """The ``size × 2·size`` table of every rank's counts (``mine``: this rank's row then
        column, -1s where its buffer specs were refused), on ``comm`` (the
        :class:`~bmlmpi.api.Communicator`: its ``size``, ``Allreduce`` and ``Allgather``)."""
        size = comm.size
        key = mine.tobytes()
        kept = self.tables.get(key) if size > 1 else None
        if size > 1:
            d = kept[1] if kept is not None else -1
            both = np.empty(2, dtype=np.int64)
            comm.Allreduce(np.array([d, -d], dtype=np.int64), both, op=MPI.MAX,
                           algorithm="native", reproducible=False)
            if kept is not None and both[0] == -both[1]:
                self.tables.move_to_end(key)
                self.reused += 1
                self.digest = kept[1]
                return kept[0].copy()
        if size > 1:
            every = np.empty(mine.size * size, dtype=np.int64)
            comm.Allgather(mine, every)
            self.gathered += 1
        else:
            every = mine.copy()   # (one rank has nothing to gather)
        table = every.reshape(size, mine.size)
        self.digest = None
        if (table >= 0).all() and (table[:, :size] == table[:, size:].T).all():
            self.digest = _digest(table)
            self.tables[key] = (table.copy(), self.digest)
            self.tables.move_to_end(key)
            while len(self.tables) > KEPT:
                self.tables.popitem(last=False)
        return table
