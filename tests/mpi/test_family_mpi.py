"""The collective family (reduce-scatter, allgather, reduce, broadcast) and the persistent
calls: every algorithm each collective lists × dtypes × ops, in place and not, roots first,
middle and last, uneven counts with zeros, against numpy's exact result and mpi4py's own
call, with position- and rank-dependent data. One test per collective loops over its cases
(few test ids, one argument check per new signature). The layout that takes every dtype
takes all of them at 1-4 ranks and one of each element size and kernel family beyond, with
every algorithm, op, root and mode at every N (tests/mpi/conftest.py says why). Reduce and
broadcast take each dtype and op at one root, the roots first, middle and last in turn
(``_roots_in_turn``), so every root runs every algorithm and count at every N."""

import numpy as np
import pytest
from conftest import OP_IDS, OPS, all_ranks_agree, every_dtype, rank_input, reference
from mpi4py import MPI

import bmlmpi

REDUCING_OPS = list(zip(OPS, OP_IDS, strict=True))
FEW_DTYPES = [np.int32, np.uint8, np.float64, np.complex64]


def _large(what) -> list:
    """The large layout (pipelined schedules), at up to 6 ranks: the oversubscribed launches
    beyond spend minutes on it (the smaller layouts still run there)."""
    return [what] if MPI.COMM_WORLD.Get_size() <= 6 else []


def _few(size: int) -> list:
    """The dtypes of the layouts beyond the one that takes every dtype: fewer at the large
    rank counts, where each call costs most (oversubscribed launches)."""
    return FEW_DTYPES if size <= 6 else [np.int32, np.float64]


def _cases(dtypes):
    """(dtype, op, op id) for every dtype with SUM and AVG, and the other ops on a few.
    The tests give every dtype on one layout (the reduction kernels themselves are
    Allreduce's, tested there) and a few dtypes on every other, to keep the launches short."""
    for dtype in dtypes:
        for op, op_id in REDUCING_OPS:
            if op not in (MPI.SUM, bmlmpi.AVG) and dtype not in FEW_DTYPES:
                continue
            if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
                continue
            yield dtype, op, op_id


def _exact_in(dtype, n, size, op) -> bool:
    """Whether the reduction fits ``dtype`` (no overflow): MPI libraries then agree with
    numpy (Open MPI's 8-bit SUM saturates where numpy wraps)."""
    kind = np.dtype(dtype).kind
    wide = reference(n, size, np.complex128 if kind == "c" else np.float64, op)
    return np.array_equal(reference(n, size, dtype, op).astype(wide.dtype), wide)


def _block_counts(size: int, base: int) -> list[list[int]]:
    """Equal blocks, uneven blocks with zeros, and (base 0) all empty."""
    even = [base] * size
    uneven = [(r * 5 + base) % 4 for r in range(size)]  # zeros where (5r + base) % 4 == 0
    uneven[-1] += 1
    return [even, uneven] if base else [even, [0] * size]


def _roots(size: int) -> list[int]:
    return sorted({0, size // 2, size - 1})


def _roots_in_turn(size: int, cases: list) -> list[tuple[int, tuple]]:
    """(root, case) pairs: each case at one root, the roots first, middle and last in turn,
    where there are at least as many cases as roots; every case at every root otherwise. A
    root changes the schedule (which rank sends what to whom), not what a dtype or op does
    to the data, so every root still runs every algorithm and count at every N, each with
    several dtypes and ops, at a third of the calls."""
    roots = _roots(size)
    if len(cases) < len(roots):
        return [(root, case) for case in cases for root in roots]
    return [(roots[i % len(roots)], case) for i, case in enumerate(cases)]


def _communicator(comm, algorithm: str, monkeypatch) -> bmlmpi.Communicator:
    """The communicator of ``algorithm``; hierarchical's pretends nodes of 2 consecutive
    ranks (the variable is read when the communicator is built), so that both of its tiers
    run (``test_hierarchical_on_pretended_nodes`` takes nodes of 3)."""
    if algorithm != "hierarchical":
        return bmlmpi.Communicator(comm, algorithm=algorithm)
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", "2")
    try:
        return bmlmpi.Communicator(comm, algorithm=algorithm)
    finally:
        monkeypatch.delenv("BMLMPI_RANKS_PER_NODE")


def _first_bad(got, want) -> str:
    bad = np.nonzero(got != want)[0]
    return "shape" if got.shape != want.shape else f"index {bad[0]} got {got[bad[0]]} " \
        f"want {want[bad[0]]}"


@pytest.mark.mpi
def test_reduce_scatter(comm, monkeypatch):
    size, rank = comm.size, comm.rank
    failures = []
    for algorithm in bmlmpi.algorithms("reduce_scatter"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        for counts in _block_counts(size, 3) + _block_counts(size, 0) + _large([1031] * size):
            total, off = sum(counts), int(np.cumsum([0] + counts)[rank])
            block = len(set(counts)) == 1
            # every dtype on the uneven blocks; every op on a few dtypes everywhere
            full = len(set(counts)) > 1 and sum(counts) > 0
            for dtype, op, op_id in _cases(every_dtype(size) if full else _few(size)):
                x = rank_input(total, rank, dtype, op)
                want = reference(total, size, dtype, op)[off:off + counts[rank]]
                for in_place in (False, True):
                    for use_block in ((True, False) if block else (False,)):
                        what = (f"{algorithm} counts={counts} {np.dtype(dtype).name} {op_id} "
                                f"in_place={in_place} block={use_block}")
                        if in_place:
                            out = x.copy()
                            args = (MPI.IN_PLACE, out)
                        else:
                            out = np.full(counts[rank], 77, dtype)
                            args = (x, out)
                        if use_block:
                            ctx.Reduce_scatter_block(*args, op)
                        else:
                            ctx.Reduce_scatter(*args, counts, op)
                        got = out[:counts[rank]]
                        if not np.array_equal(got, want):
                            failures.append(f"{what}: {_first_bad(got, want)}")
                        if not in_place and not np.array_equal(
                                x, rank_input(total, rank, dtype, op)):
                            failures.append(f"{what}: sendbuf modified")
                if op is not bmlmpi.AVG and _exact_in(dtype, total, size, op):
                    mine = np.empty(counts[rank], dtype)
                    comm.Reduce_scatter(x, mine, counts, op)
                    ours = np.empty(counts[rank], dtype)
                    ctx.Reduce_scatter(x, ours, counts, op)
                    if not np.array_equal(ours, mine):
                        failures.append(f"{algorithm} {counts} {op_id}: differs from mpi4py")
        ctx.Free()
    all_ranks_agree(comm, failures)


def _contribution(n: int, rank: int, dtype) -> np.ndarray:
    return rank_input(n, rank, dtype, MPI.SUM) + np.asarray(rank % 3, dtype=dtype)


@pytest.mark.mpi
def test_allgather(comm, monkeypatch):
    size, rank = comm.size, comm.rank
    failures = []
    for algorithm in bmlmpi.algorithms("allgather"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        for counts in _block_counts(size, 3) + _block_counts(size, 0) + _large([777] * size):
            total = sum(counts)
            off = np.cumsum([0] + counts).tolist()
            full = len(set(counts)) > 1 and sum(counts) > 0
            for dtype in (every_dtype(size) + [np.bool_]) if full else _few(size):
                parts = [_contribution(c, r, dtype) for r, c in enumerate(counts)]
                want = np.concatenate(parts)
                mine = parts[rank]
                for in_place in (False, True):
                    what = f"{algorithm} counts={counts} {np.dtype(dtype).name} in_place={in_place}"
                    # Allgatherv, packed
                    out = np.zeros(total, dtype)
                    if in_place:
                        out[off[rank]:off[rank + 1]] = mine
                    ctx.Allgatherv(MPI.IN_PLACE if in_place else mine, [out, counts])
                    if not np.array_equal(out, want):
                        failures.append(f"{what} v: {_first_bad(out, want)}")
                    # Allgatherv, slots in reverse rank order with gaps
                    displs, at = [0] * size, 2
                    for r in reversed(range(size)):
                        displs[r] = at
                        at += counts[r] + 1
                    out = np.zeros(at, dtype)
                    if in_place:
                        out[displs[rank]:displs[rank] + counts[rank]] = mine
                    ctx.Allgatherv(MPI.IN_PLACE if in_place else mine, [out, counts, displs, None])
                    expect = np.zeros(at, dtype)
                    for r in range(size):
                        expect[displs[r]:displs[r] + counts[r]] = parts[r]
                    if not np.array_equal(out, expect):
                        failures.append(f"{what} v displs: {_first_bad(out, expect)}")
                    if len(set(counts)) == 1:
                        out = np.zeros(total, dtype)
                        if in_place:
                            out[off[rank]:off[rank + 1]] = mine
                        ctx.Allgather(MPI.IN_PLACE if in_place else mine, out)
                        if not np.array_equal(out, want):
                            failures.append(f"{what}: {_first_bad(out, want)}")
                if counts[0] == 3 and len(set(counts)) == 1:
                    ref = np.empty(total, dtype)
                    comm.Allgather(mine, ref)
                    if not np.array_equal(ref, want):
                        failures.append(f"{what}: numpy's expectation differs from mpi4py")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_reduce(comm, monkeypatch):
    size, rank = comm.size, comm.rank
    failures = []
    for algorithm in bmlmpi.algorithms("reduce"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        for n in (0, 1, 5, 3 * size + 1, *_large(1031)):
            cases = list(_cases(every_dtype(size) if n == 3 * size + 1 else _few(size)))
            for root, (dtype, op, op_id) in _roots_in_turn(size, cases):
                x = rank_input(n, rank, dtype, op)
                want = reference(n, size, dtype, op)
                for in_place in (False, True):
                    what = (f"{algorithm} n={n} {np.dtype(dtype).name} {op_id} root={root} "
                            f"in_place={in_place}")
                    out = np.full(n, 77, dtype) if rank == root else None
                    if in_place and rank == root:
                        out = x.copy()
                        ctx.Reduce(MPI.IN_PLACE, out, op, root)
                    else:
                        ctx.Reduce(x, out, op, root)
                    if rank == root and not np.array_equal(out, want):
                        failures.append(f"{what}: {_first_bad(out, want)}")
                    if not np.array_equal(x, rank_input(n, rank, dtype, op)):
                        failures.append(f"{what}: sendbuf modified")
                if n == 5 and op is not bmlmpi.AVG and _exact_in(dtype, n, size, op):
                    ref = np.empty(n, dtype)
                    comm.Reduce(x, ref, op, size - 1)
                    ours = np.empty(n, dtype)
                    ctx.Reduce(x, ours, op, size - 1)
                    if rank == size - 1 and not np.array_equal(ours, ref):
                        failures.append(f"{algorithm} {op_id}: differs from mpi4py")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_bcast(comm, monkeypatch):
    size, rank = comm.size, comm.rank
    failures = []
    for algorithm in bmlmpi.algorithms("bcast"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        for n in (0, 1, 5, 3 * size + 1, *_large(4099)):
            dtypes = (every_dtype(size) + [np.bool_]) if n == 3 * size + 1 else _few(size)
            for root, dtype in _roots_in_turn(size, dtypes):
                buf = _contribution(n, rank, dtype)
                ctx.Bcast(buf, root)
                want = _contribution(n, root, dtype)
                if not np.array_equal(buf, want):
                    failures.append(f"{algorithm} n={n} {np.dtype(dtype).name} root={root}: "
                                    f"{_first_bad(buf, want)}")
            ref = _contribution(n, rank, np.int64)
            comm.Bcast(ref, size - 1)
            ours = _contribution(n, rank, np.int64)
            ctx.Bcast([ours, MPI.INT64_T], size - 1)
            if not np.array_equal(ours, ref):
                failures.append(f"{algorithm} n={n}: differs from mpi4py")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_module_level_calls_and_nonblocking(comm):
    """The module-level calls on a user communicator, and the I-forms waited on in reverse
    order (each Wait progresses every outstanding call of the communicator)."""
    size, rank = comm.size, comm.rank
    failures = []
    x = rank_input(4 * size, rank, np.float64, MPI.SUM)
    rs = np.empty(4)
    bmlmpi.Reduce_scatter_block(x, rs, comm=comm)
    want = reference(4 * size, size, np.float64, MPI.SUM)[4 * rank:4 * rank + 4]
    if not np.array_equal(rs, want):
        failures.append("module-level Reduce_scatter_block")
    ag = np.empty(3 * size, np.int16)
    bmlmpi.Allgather(np.full(3, rank, np.int16), ag, comm=comm)
    if not np.array_equal(ag, np.repeat(np.arange(size, dtype=np.int16), 3)):
        failures.append("module-level Allgather")
    bc = np.full(6, rank, np.int32)
    bmlmpi.Bcast(bc, size - 1, comm=comm)
    if not np.array_equal(bc, np.full(6, size - 1, np.int32)):
        failures.append("module-level Bcast")
    red = np.empty(7)
    bmlmpi.Reduce(np.full(7, rank + 1.0), red if rank == 0 else None, comm=comm)
    if rank == 0 and not np.array_equal(red, np.full(7, size * (size + 1) / 2)):
        failures.append("module-level Reduce")
    # non-blocking, several outstanding, waited on in reverse order
    for algorithm in bmlmpi.algorithms("allgather"):
        ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
        outs = [np.empty(2 * size, np.int64) for _ in range(3)]
        reqs = [ctx.Iallgather(np.full(2, 10 * i + rank, np.int64), outs[i]) for i in range(3)]
        b = np.full(5, rank, np.float32)
        reqs.append(ctx.Ibcast(b, 0))
        for q in reversed(reqs):
            q.Wait()
        for i in range(3):
            if not np.array_equal(outs[i], np.repeat(10 * i + np.arange(size), 2)):
                failures.append(f"{algorithm}: Iallgather {i}")
        if not np.array_equal(b, np.zeros(5, np.float32)):
            failures.append(f"{algorithm}: Ibcast")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", bmlmpi.algorithms())
def test_allreduce_init(comm, algorithm):
    """Persistent allreduce: compiled once, started many times, the input changed between
    starts (read at every start), in place and not, Test until done."""
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
    failures = []
    n = 3 * comm.size + 2
    for dtype, op in ((np.float64, MPI.SUM), (np.int32, MPI.MAX), (np.int64, bmlmpi.AVG)):
        x = np.empty(n, dtype)
        out = np.empty(n, dtype)
        req = ctx.Allreduce_init(x, out, op)
        inp = np.empty(n, dtype)
        req_ip = ctx.Allreduce_init(MPI.IN_PLACE, inp, op)
        for it in range(3):
            x[:] = rank_input(n, comm.rank + it, dtype, op)
            want = reference(n, comm.size, dtype, op) if it == 0 else None
            req.Start()
            if it % 2:
                while not req.Test():
                    pass
            else:
                req.Wait()
            if want is not None and not np.array_equal(out, want):
                failures.append(f"{np.dtype(dtype).name} start {it}: {_first_bad(out, want)}")
            check = np.empty(n, dtype)
            comm.Allreduce(x, check, MPI.SUM if op is bmlmpi.AVG else op)
            if op is bmlmpi.AVG:
                check //= comm.size
            if not np.array_equal(out, check):
                failures.append(f"{np.dtype(dtype).name} start {it}: differs from mpi4py")
            inp[:] = x
            req_ip.Start()
            req_ip.Wait()
            if not np.array_equal(inp, check):
                failures.append(f"{np.dtype(dtype).name} start {it} in place")
        assert req.Test()  # inactive: true at once
        req.Free()
        req_ip.Free()
        with pytest.raises(ValueError):
            req.Start()
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_family_init(comm):
    """Persistent forms of the family, each started twice with new input."""
    size, rank = comm.size, comm.rank
    failures = []
    for collective in ("reduce_scatter", "allgather", "reduce", "bcast"):
        for algorithm in bmlmpi.algorithms(collective):
            ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
            counts = [(r % 3) + 1 for r in range(size)]
            total = sum(counts)
            off = int(np.sum(counts[:rank]))
            x = np.empty(total, np.int64)
            out = np.empty(counts[rank], np.int64)
            full = np.empty(total, np.int64)
            if collective == "reduce_scatter":
                req = ctx.Reduce_scatter_init(x, out, counts, MPI.SUM)
            elif collective == "allgather":
                req = ctx.Allgatherv_init(x[:counts[rank]], [full, counts])
            elif collective == "reduce":
                req = ctx.Reduce_init(x, full, MPI.SUM, size - 1)
            else:
                req = ctx.Bcast_init(full, size // 2)
            for it in range(2):
                x[:] = np.arange(total) * (rank + 1) + it
                full[:] = x
                req.Start()
                req.Wait()
                ref = np.empty(total, np.int64)
                if collective == "reduce_scatter":
                    comm.Allreduce(x, ref)
                    ok = np.array_equal(out, ref[off:off + counts[rank]])
                elif collective == "allgather":
                    comm.Allgatherv(x[:counts[rank]], [ref, counts])
                    ok = np.array_equal(full, ref)
                elif collective == "reduce":
                    comm.Allreduce(x, ref)
                    ok = rank != size - 1 or np.array_equal(full, ref)
                else:
                    ref[:] = np.arange(total) * (size // 2 + 1) + it
                    ok = np.array_equal(full, ref)
                if not ok:
                    failures.append(f"{collective} {algorithm} start {it}")
            req.Free()
            ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_mismatches_raise_on_every_rank(comm):
    """Counts, roots, ops or collectives that differ across ranks raise on every rank."""
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    ctx = bmlmpi.Communicator(comm)
    rank, size = comm.rank, comm.size
    # different recvcounts
    counts = [2] * size
    if rank == 0:
        counts[0] = 3
    with pytest.raises((bmlmpi.ArgumentMismatch, ValueError)):
        ctx.Reduce_scatter(np.zeros(sum(counts)), np.zeros(counts[rank]), counts)
    # different roots
    with pytest.raises(bmlmpi.ArgumentMismatch):
        ctx.Bcast(np.zeros(4), root=rank % 2)
    # one rank refuses its arguments (a bad root): the others raise RemoteArgumentError
    with pytest.raises(ValueError):
        ctx.Reduce(np.zeros(3), np.zeros(3), root=size if rank == 0 else 0)
    # different collectives at the same point
    buf = np.zeros(2 * size)
    with pytest.raises(bmlmpi.ArgumentMismatch):
        if rank == 0:
            ctx.Allgather(np.zeros(2), buf)
        else:
            ctx.Reduce_scatter_block(buf, np.zeros(2))
    # an algorithm that does not serve the collective: refused on every rank
    with pytest.raises(ValueError):
        ctx.Bcast(np.zeros(2), algorithm="no-such")
    # the communicator still works
    out = np.zeros(size)
    ctx.Allgather(np.array([float(rank)]), out)
    assert np.array_equal(out, np.arange(size))
    ctx.Free()


@pytest.mark.mpi
def test_repeated_blocking_calls_read_new_data(comm):
    """The same signature many times (the blocking native path after its first calls): each
    call reads the data as it is then, for every collective with a blocking fast form."""
    size, rank = comm.size, comm.rank
    ctx = bmlmpi.Communicator(comm)
    failures = []
    counts = [r % 3 + 1 for r in range(size)]
    x, rs = np.empty(3 * size), np.empty(3)
    v, rv = np.empty(sum(counts), np.int64), np.empty(counts[rank], np.int64)
    g, gout = np.empty(2, np.int32), np.empty(2 * size, np.int32)
    red, b = np.empty(5), np.empty(4)
    for it in range(6):
        x[:] = np.arange(3 * size) * (rank + 1) + it
        ctx.Reduce_scatter_block(x, rs, MPI.MAX)
        want = np.arange(3 * size)[3 * rank:3 * rank + 3] * size + it
        if not np.array_equal(rs, want):
            failures.append(f"Reduce_scatter_block {it}")
        v[:] = np.arange(sum(counts)) + it * rank
        ctx.Reduce_scatter(v, rv, counts, MPI.SUM)
        lo = sum(counts[:rank])
        want = (np.arange(sum(counts)) * size + it * size * (size - 1) // 2)[lo:lo + counts[rank]]
        if not np.array_equal(rv, want):
            failures.append(f"Reduce_scatter {it}")
        g[:] = [rank, it]
        ctx.Allgather(g, gout)
        if not np.array_equal(gout, np.ravel([[r, it] for r in range(size)])):
            failures.append(f"Allgather {it}")
        ctx.Reduce(np.full(5, float(rank + it)), red, MPI.SUM, size - 1)
        if rank == size - 1 and not np.array_equal(red, np.full(5, size * (size - 1) / 2
                                                                  + size * it)):
            failures.append(f"Reduce {it}")
        b[:] = rank * 10 + it
        ctx.Bcast(b, it % size)
        if not np.array_equal(b, np.full(4, (it % size) * 10 + it)):
            failures.append(f"Bcast {it}")
    ctx.Free()
    all_ranks_agree(comm, failures)


def _scheduled_fast_calls(ctx) -> int:
    """Calls that took a scheduled signature's fast path (its entries' counters)."""
    return sum(e.calls for e in ctx._fast_path.entries.values() if e.plan is not None)


@pytest.mark.mpi
def test_scheduled_fast_path_reads_new_data(comm, monkeypatch):
    """Every scheduled algorithm of every collective, the same signatures called again and
    again (in place and not, uneven counts with zeros, a middle root): each later call
    takes the signature's fast path (the cached plan, buffers carved out of the new
    arguments) and reads its data as it is then, position- and rank-dependent."""
    size, rank = comm.size, comm.rank
    failures = []
    rounds = 4
    counts = [(r * 5 + 1) % 4 for r in range(size)]  # zeros where 5r + 1 is a multiple of 4
    counts[-1] += 1
    lo, total, root = sum(counts[:rank]), sum(counts), size // 2
    collectives = ("reduce_scatter", "allgather", "reduce", "bcast")
    names = sorted({a for c in collectives for a in bmlmpi.algorithms(c)} - {"auto", "native"})
    for algorithm in names:
        ctx = _communicator(comm, algorithm, monkeypatch)
        serves = {c: algorithm in bmlmpi.algorithms(c) for c in collectives}
        # the blocking signatures of one round: 3 reduce-scatters, 2 allgathers, 1 and 1
        signatures = sum(n for c, n in zip(collectives, (3, 2, 1, 1), strict=True)
                         if serves[c])
        for it in range(rounds):
            def data(n, r, it=it):
                return np.arange(n, dtype=np.int64) * (r + 1) + 7 * it + r

            def summed(n, it=it):
                return sum(data(n, r, it) for r in range(size))
            if serves["reduce_scatter"]:
                x, rs = data(3 * size, rank), np.full(3, -1, np.int64)
                ctx.Reduce_scatter_block(x, rs, MPI.SUM)
                inplace = data(3 * size, rank)
                ctx.Reduce_scatter_block(MPI.IN_PLACE, inplace, MPI.SUM)
                v, rv = data(total, rank), np.full(counts[rank], -1, np.int64)
                ctx.Reduce_scatter(v, rv, counts, MPI.SUM)
                want = summed(3 * size)[3 * rank:3 * rank + 3]
                for got, what in ((rs, "Reduce_scatter_block"), (inplace[:3], "in place")):
                    if not np.array_equal(got, want):
                        failures.append(f"{algorithm} {what} round {it}")
                if not np.array_equal(rv, summed(total)[lo:lo + counts[rank]]):
                    failures.append(f"{algorithm} Reduce_scatter round {it}")
            if serves["allgather"]:
                g, gout = data(3, rank), np.full(3 * size, -1, np.int64)
                ctx.Allgather(g, gout)
                gin = np.full(3 * size, -1, np.int64)
                gin[3 * rank:3 * rank + 3] = data(3, rank)
                ctx.Allgather(MPI.IN_PLACE, gin)
                want = np.concatenate([data(3, r) for r in range(size)])
                for got, what in ((gout, "Allgather"), (gin, "Allgather in place")):
                    if not np.array_equal(got, want):
                        failures.append(f"{algorithm} {what} round {it}")
            if serves["reduce"]:
                red = np.full(6, -1, np.int64) if rank == root else None
                ctx.Reduce(data(5, rank), red, MPI.SUM, root)
                if rank == root and not (np.array_equal(red[:5], summed(5)) and red[5] == -1):
                    failures.append(f"{algorithm} Reduce round {it}")
            if serves["bcast"]:
                b = data(4, rank)
                ctx.Bcast(b, root)
                if not np.array_equal(b, data(4, root)):
                    failures.append(f"{algorithm} Bcast round {it}")
        fast = _scheduled_fast_calls(ctx)
        if fast != (rounds - 1) * signatures:
            failures.append(f"{algorithm}: {fast} fast calls, not {(rounds - 1) * signatures}")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_hierarchical_on_pretended_nodes(comm, monkeypatch):
    """Hierarchical on two tiers with nodes of 3 consecutive ranks (unequal where 3 does not
    divide the size; the tests above take nodes of 2 for every dtype and op): reduce-scatter
    and allgather on MPI's block layout (equal, uneven with zeros, large), reduce and
    broadcast from every kind of root, in place and not, against numpy's exact result and
    mpi4py's own call."""
    size, rank = comm.size, comm.rank
    failures = []
    from bmlmpi.topology.nodes import consecutive_nodes
    for per_node in (3,):
        monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", str(per_node))
        ctx = bmlmpi.Communicator(comm, algorithm="hierarchical")
        monkeypatch.delenv("BMLMPI_RANKS_PER_NODE")
        if ctx.nodes() != consecutive_nodes(size, per_node):
            failures.append(f"{per_node}/node: nodes {ctx.nodes()}")
        for counts in _block_counts(size, 3) + [[0] * size] + _large([1031] * size):
            total, off = sum(counts), np.cumsum([0] + counts).tolist()
            label = f"{per_node}/node counts={counts}"
            for dtype, op, op_id in ((np.int32, MPI.SUM, "sum"), (np.float64, MPI.MAX, "max"),
                                     (np.int64, bmlmpi.AVG, "avg"))[:3 if size <= 6 else 2]:
                x = rank_input(total, rank, dtype, op)
                want = reference(total, size, dtype, op)[off[rank]:off[rank + 1]]
                for in_place in (False, True):
                    out = x.copy() if in_place else np.full(counts[rank], 77, dtype)
                    ctx.Reduce_scatter(MPI.IN_PLACE if in_place else x, out, counts, op)
                    if not np.array_equal(out[:counts[rank]], want):
                        failures.append(f"{label} RS {op_id} in_place={in_place}: "
                                        f"{_first_bad(out[:counts[rank]], want)}")
                if op is MPI.SUM:
                    ref = np.empty(counts[rank], dtype)
                    comm.Reduce_scatter(x, ref, counts, op)
                    if not np.array_equal(ref, want):
                        failures.append(f"{label}: mpi4py's Reduce_scatter differs")
                    if len(set(counts)) == 1:
                        blk = np.empty(counts[rank], dtype)
                        ctx.Reduce_scatter_block(x, blk, op)
                        if not np.array_equal(blk, want):
                            failures.append(f"{label} RS block: {_first_bad(blk, want)}")
            for dtype in (np.int16, np.float64):
                parts = [_contribution(c, r, dtype) for r, c in enumerate(counts)]
                want, mine = np.concatenate(parts), parts[rank]
                for in_place in (False, True):
                    out = np.zeros(total, dtype)
                    if in_place:
                        out[off[rank]:off[rank + 1]] = mine
                    ctx.Allgatherv(MPI.IN_PLACE if in_place else mine, [out, counts])
                    if not np.array_equal(out, want):
                        failures.append(f"{label} AG in_place={in_place}: "
                                        f"{_first_bad(out, want)}")
                displs, at = [0] * size, 1
                for r in reversed(range(size)):
                    displs[r], at = at, at + counts[r] + 2
                out, ref = np.zeros(at, dtype), np.zeros(at, dtype)
                ctx.Allgatherv(mine, [out, counts, displs, None])
                comm.Allgatherv(mine, [ref, counts, displs, None])
                if not np.array_equal(out, ref):
                    failures.append(f"{label} AG displs: {_first_bad(out, ref)}")
                if len(set(counts)) == 1:
                    out, ref = np.empty(total, dtype), np.empty(total, dtype)
                    ctx.Allgather(mine, out)
                    comm.Allgather(mine, ref)
                    if not np.array_equal(out, ref):
                        failures.append(f"{label} Allgather: {_first_bad(out, ref)}")
        for n in (0, 5, 3 * size + 1, *_large(1031)):
            for root in _roots(size):
                x = rank_input(n, rank, np.float64, MPI.SUM)
                out = np.full(n, 77.0) if rank == root else None
                ctx.Reduce(x, out, MPI.SUM, root)
                ref = np.empty(n) if rank == root else None
                comm.Reduce(x, ref, MPI.SUM, root)
                if rank == root and not np.array_equal(out, ref):
                    failures.append(f"{per_node}/node Reduce n={n} root={root}: "
                                    f"{_first_bad(out, ref)}")
                buf = _contribution(n, rank, np.int32)
                ctx.Bcast(buf, root)
                if not np.array_equal(buf, _contribution(n, root, np.int32)):
                    failures.append(f"{per_node}/node Bcast n={n} root={root}")
        # the node tier ran in shared memory (these nodes share this machine's memory), on
        # every rank whose node holds another
        from bmlmpi.shm import ShmRun
        nodes = ctx.nodes()
        shared = len(nodes.members[nodes.node_of(rank)]) > 1
        for method, args in (("Ireduce_scatter_block", (np.ones(4 * size), np.empty(4))),
                             ("Iallgather", (np.ones(4), np.empty(4 * size))),
                             ("Ireduce", (np.ones(9), np.empty(9), MPI.SUM, 0)),
                             ("Ibcast", (np.ones(9), size - 1))):
            req = getattr(ctx, method)(*args)  # started alone: its run exists at once
            if shared and not isinstance(req.run, ShmRun):
                failures.append(f"{per_node}/node {method}: not in shared memory")
            req.Wait()
        ctx.Free()
    all_ranks_agree(comm, failures)


class _DeviceStandIn:
    """A stand-in for a GPU array: ``__cuda_array_interface__`` over host memory (``mem``),
    which is what bmlmpi recognises a device array by. Its staging is replaced in the test
    by copies that behave as cupy's (device to host before, host to device after), so a
    result that reaches ``mem`` by any other way than the staging's copy back cannot pass."""

    def __init__(self, mem: np.ndarray):
        self.mem = mem

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.mem.shape, "typestr": self.mem.dtype.str,
                "data": (self.mem.ctypes.data, False), "version": 3}


@pytest.mark.mpi
def test_device_buffers_are_staged(comm, monkeypatch):
    """Every family call takes device arrays (and ``[buf, ...]`` specs of them) as
    ``Allreduce`` does: staged through host memory, the result copied back; the persistent
    forms refuse them on every rank. Runs without a GPU (the stand-in above); the cupy
    version is tests/mpi/test_device_allreduce_mpi.py's, where a GPU exists."""
    from bmlmpi.kernels import gpu
    size, rank = comm.size, comm.rank
    staged = []

    def to_host_staging(dev, *, copy_in=True, copy_out=True):
        host = dev.mem.copy() if copy_in else np.full_like(dev.mem, 55)
        staged.append(dev)

        def finish():
            if copy_out:
                dev.mem[...] = host
        return host, finish

    monkeypatch.setattr(gpu, "to_host_staging", to_host_staging)
    failures = []

    def algorithms(collective):
        # staging is the same for every algorithm: a schedule's and mpi4py's own
        return [a for a in bmlmpi.algorithms(collective) if a in ("bml", "native")]

    def was_staged(label, before):
        if len(staged) == before:
            failures.append(f"{label}: no buffer was staged")

    counts = [(r * 5 + 3) % 4 for r in range(size)]
    total, off = sum(counts), np.cumsum([0] + counts).tolist()
    for algorithm in algorithms("reduce_scatter"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        x = rank_input(total, rank, np.int64, MPI.SUM)
        want = reference(total, size, np.int64, MPI.SUM)[off[rank]:off[rank + 1]]
        dev_x, dev_out = _DeviceStandIn(x.copy()), _DeviceStandIn(np.full(counts[rank], 7))
        before = len(staged)
        ctx.Reduce_scatter(dev_x, [dev_out, MPI.INT64_T], counts, MPI.SUM)
        was_staged(f"{algorithm} Reduce_scatter", before)
        if not np.array_equal(dev_out.mem, want) or not np.array_equal(dev_x.mem, x):
            failures.append(f"{algorithm} Reduce_scatter")
        dev_io = _DeviceStandIn(x.copy())
        ctx.Reduce_scatter(MPI.IN_PLACE, dev_io, counts, bmlmpi.AVG)
        avg = reference(total, size, np.int64, bmlmpi.AVG)[off[rank]:off[rank + 1]]
        if not np.array_equal(dev_io.mem[:counts[rank]], avg):
            failures.append(f"{algorithm} Reduce_scatter in place")
        ctx.Free()
    for algorithm in algorithms("allgather"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        parts = [_contribution(c, r, np.float32) for r, c in enumerate(counts)]
        dev_out = _DeviceStandIn(np.zeros(total + 3, np.float32))
        before = len(staged)
        req = ctx.Iallgatherv(_DeviceStandIn(parts[rank].copy()), [dev_out, counts])
        req.Wait()
        was_staged(f"{algorithm} Iallgatherv", before)
        want = np.concatenate(parts + [np.zeros(3, np.float32)])
        if not np.array_equal(dev_out.mem, want):
            failures.append(f"{algorithm} Iallgatherv: {_first_bad(dev_out.mem, want)}")
        ctx.Free()
    for algorithm in algorithms("reduce"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        root = size - 1
        x = rank_input(11, rank, np.float64, MPI.MAX)
        dev_out = _DeviceStandIn(np.full(11, -1.0))
        ctx.Reduce(_DeviceStandIn(x), dev_out if rank == root else None, MPI.MAX, root)
        if rank == root and not np.array_equal(dev_out.mem,
                                               reference(11, size, np.float64, MPI.MAX)):
            failures.append(f"{algorithm} Reduce")
        ctx.Free()
    for algorithm in algorithms("bcast"):
        ctx = _communicator(comm, algorithm, monkeypatch)
        dev = _DeviceStandIn(_contribution(9, rank, np.int16))
        before = len(staged)
        ctx.Bcast([dev, MPI.INT16_T], size // 2)
        was_staged(f"{algorithm} Bcast", before)
        if not np.array_equal(dev.mem, _contribution(9, size // 2, np.int16)):
            failures.append(f"{algorithm} Bcast")
        ctx.Free()
    # a persistent request cannot stage at every start: refused on every rank, nothing
    # copied back
    ctx = bmlmpi.Communicator(comm)
    dev = _DeviceStandIn(np.arange(4.0))
    with pytest.raises((bmlmpi.BufferSpecError, bmlmpi.RemoteArgumentError)):
        ctx.Bcast_init(dev, 0)
    if not np.array_equal(dev.mem, np.arange(4.0)):
        failures.append("Bcast_init wrote the device buffer")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_scheduled_avg_takes_the_fast_path(comm):
    """AVG on a scheduled signature: later blocking calls take its fast path, as an
    allreduce's do, and divide the same part the checked path divides (this rank's block of
    a reduce-scatter, the root's result of a reduce; nothing on the other ranks)."""
    size, rank = comm.size, comm.rank
    failures = []
    ctx = bmlmpi.Communicator(comm, algorithm="ring")
    root = size - 1
    for it in range(4):
        def data(n, r, it=it):  # multiples of size: the averages are exact
            return size * (np.arange(n, dtype=np.float64) * (r + 1) + 7 * it + r)

        def average(n, it=it):
            return sum(data(n, r, it) for r in range(size)) / size
        before = _scheduled_fast_calls(ctx)
        block = np.full(3, -1.0)
        ctx.Reduce_scatter_block(data(3 * size, rank), block, bmlmpi.AVG)
        if not np.array_equal(block, average(3 * size)[3 * rank:3 * rank + 3]):
            failures.append(f"Reduce_scatter_block AVG round {it}: {block}")
        reduced = np.full(5, -1.0)
        ctx.Reduce(data(5, rank), reduced, bmlmpi.AVG, root, algorithm="tree")
        if rank == root and not np.array_equal(reduced, average(5)):
            failures.append(f"Reduce AVG round {it}: {reduced}")
        if rank != root and not np.array_equal(reduced, np.full(5, -1.0)):
            failures.append(f"Reduce AVG round {it} wrote a non-root's recvbuf")
        fast = _scheduled_fast_calls(ctx) - before
        if fast != (2 if it else 0):
            failures.append(f"round {it}: {fast} fast calls, not {2 if it else 0}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("reducing, gathering", [("native", "native"), ("tree", "ring")])
def test_a_first_call_with_the_input_in_the_output_opens_no_fast_path(comm, reducing,
                                                                      gathering):
    """A first call whose sendbuf is the receive buffer's own memory under a second name
    (the checked path reads it as in place) must not teach the fast path to read the input
    from the output: later calls of the same shapes with a separate sendbuf reduce and
    gather that sendbuf."""
    size, rank = comm.size, comm.rank
    failures = []
    ctx = bmlmpi.Communicator(comm)
    root = size - 1
    for it in range(4):
        def data(n, r, it=it):
            return np.arange(n, dtype=np.int64) * (r + 1) + 11 * it + r
        aliased = it < 2  # (a native entry opens at the second call: agreed by then)
        got = np.full(4, -5, np.int64)
        if aliased:
            got[:] = data(4, rank)
        ctx.Reduce(got if aliased else data(4, rank), got, MPI.SUM, root, algorithm=reducing)
        if rank == root and not np.array_equal(got, sum(data(4, r) for r in range(size))):
            failures.append(f"Reduce {reducing} call {it}: {got}")
        gathered = np.full(2 * size, -5, np.int64)
        mine = gathered[2 * rank:2 * rank + 2]
        if aliased:
            mine[:] = data(2, rank)
        ctx.Allgather(mine if aliased else data(2, rank), gathered, algorithm=gathering)
        if not np.array_equal(gathered, np.concatenate([data(2, r) for r in range(size)])):
            failures.append(f"Allgather {gathering} call {it}: {gathered}")
    ctx.Free()
    all_ranks_agree(comm, failures)
