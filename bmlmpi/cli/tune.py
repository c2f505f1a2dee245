"""``bmlmpi-calibrate --tune``: fill the tuning table ahead of time, as a tuning run fills
MPICH's collective-selection JSON. For each collective and size it makes the blocking
``auto`` calls a job would make, through the same :class:`bmlmpi.tuner.Tuner`, until every
rank has committed the signature; the communicator's ``Free()`` then merges the commits into
the table (:mod:`bmlmpi.tuning_table`: ``BMLMPI_TUNING``, else beside the calibration cache),
which the next job on these ranks reads (docs/tuning.md, "Tuning ahead of time").

Signatures the table already holds are measured again: a tuning run replaces them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import tuning_table
from ..api import Communicator
from ..calibrate import mpi_library
from ..selection import algorithms
from ..tuner import size_class

#: What ``--collectives all`` tunes: every collective with a blocking ``auto`` call.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "reduce", "bcast")
#: The default sizes: 8 B to 64 MiB, every fourth power of two.
DEFAULT_SIZES = tuple(8 << (2 * i) for i in range(13))


def _most_calls(ctx: Communicator, collective: str, nbytes: int) -> int:
    """A bound on one signature's calls: its exploration takes
    :meth:`~bmlmpi.tuner.Tuner.calls_per_candidate` calls per candidate (a warm-up call or
    each block's settling calls, and ``rounds`` blocks), every algorithm of the collective
    may be one, and a runoff of two may follow (:meth:`~bmlmpi.tuner.Tuner.most_calls`)."""
    tuner = ctx.tuning.tuner
    return 1 + tuner.most_calls(size_class(nbytes), len(algorithms(collective)))


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str) -> list[int]:
    """``"8,64K,1M"`` → bytes (K, M, G: powers of 1024); ValueError names a bad one."""
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", part, re.IGNORECASE)
        if m is None or int(m.group(1)) < 1:
            raise ValueError(f"not a size in bytes: {part!r} (e.g. 8, 64K, 16M)")
        sizes.append(int(m.group(1)) * _UNITS[m.group(2).upper()])
    if not sizes:
        raise ValueError("no sizes given")
    return sorted(set(sizes))


def parse_collectives(text: str) -> list[str]:
    """``"allreduce,bcast"`` or ``"all"`` → collective names; ValueError names a bad one."""
    asked = [c.strip().lower() for c in text.split(",") if c.strip()]
    if asked == ["all"]:
        return list(COLLECTIVES)
    bad = [c for c in asked if c not in COLLECTIVES]
    if bad or not asked:
        raise ValueError(f"not collectives a tuning run times: {', '.join(bad) or text!r} "
                         f"(choose among {', '.join(COLLECTIVES)}, or all)")
    return list(dict.fromkeys(asked))


def _call(ctx: Communicator, collective: str, nbytes: int,
          dtype: np.dtype) -> tuple[Callable[[], None], int, int]:
    """One blocking ``auto`` call of ``collective`` whose work buffer holds about ``nbytes``
    (whole blocks of one element at least per rank), with position- and rank-dependent data:
    (the call, the work buffer's element count, the root)."""
    rank, size = ctx.rank, ctx.size
    per = max(1, nbytes // dtype.itemsize // size)   # elements per rank's block
    total = per * size
    x = ((np.arange(total) * 7 + rank * 13) % 101).astype(dtype)
    whole, block = np.empty_like(x), np.empty(per, dtype)
    calls = {  # each collective's blocking call, mpi4py's positional arguments
        "allreduce": lambda: ctx.Allreduce(x, whole),
        "reduce_scatter": lambda: ctx.Reduce_scatter_block(x, block),
        "allgather": lambda: ctx.Allgather(x[:per], whole),
        "reduce": lambda: ctx.Reduce(x, whole, root=0),
        "bcast": lambda: ctx.Bcast(x, root=0),
    }
    return calls[collective], total, 0


def tune(comm: MPI.Comm, collectives: Sequence[str], sizes: Sequence[int],
         dtype: np.dtype, printer: Callable[[str], None] = print,
         timeout: float | None = None) -> int:
    """Commit every (collective, size) signature of ``dtype`` (op SUM, root 0) on ``comm``'s
    ranks through ``auto``'s own calls, and merge the commits into the tuning table
    (collective; rank 0 prints each commit and the table's path). 0 on success."""
    if comm.Get_size() == 1:
        if comm.Get_rank() == 0:
            printer("# one rank: nothing to tune (every collective is a copy, native's); "
                    "no table written")
        return 0
    ctx = Communicator(comm, timeout=timeout)
    tuning = ctx.tuning
    primed = False
    try:
        for collective in collectives:
            for nbytes in sizes:
                call, total, root = _call(ctx, collective, nbytes, dtype)
                if not primed:
                    # the first auto call takes the prices (the cached calibration, the
                    # table); the table's entries are then dropped, so that every signature
                    # this run tunes is measured again
                    call()
                    tuning.tuner.forget_seeds()
                    primed = True
                key = tuning.key(collective, total, dtype, "sum", root)
                most = _most_calls(ctx, collective, total * dtype.itemsize)
                for _ in range(most):
                    if key is None or tuning.tuner.committed(key) is not None:
                        break
                    call()
                else:
                    raise RuntimeError(f"bmlmpi-calibrate --tune: {collective} of "
                                       f"{total * dtype.itemsize} B did not commit within "
                                       f"{most} calls")
                report = ctx.explain(total, dtype, collective=collective)
                if ctx.rank == 0:
                    printer(str(report.tuning) if report.tuning is not None else
                            f"{collective} {total * dtype.itemsize} B: {report.chosen} "
                            f"(nothing to tune: {report.why})")
        layout = tuning.layout()
        path = tuning_table.table_path(MPI.Get_processor_name()[:64], mpi_library(),
                                       ctx.size, layout)
    finally:
        ctx.Free()   # rank 0 merges the commits into the table
    if comm.Get_rank() == 0:
        printer(f"# tuning table: {path}")
    return 0
