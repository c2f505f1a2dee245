"""Every algorithm, dtype, op, count, in-place or not, against numpy and comm.Allreduce.

Every datatype runs at 1-4 ranks; at 5, 6, 8, 9 and 12 ranks the datatypes of
``conftest.DTYPES_BEYOND_4`` (one of each element size and kernel family) run with every
algorithm, op, count and mode, so a misplaced range fails at every N
(tests/mpi/conftest.py says why)."""

import numpy as np
import pytest
from conftest import ALL_DTYPES, OP_IDS, OPS, SHAPES, all_ranks_agree, rank_input, reference
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute

ALGORITHMS = bmlmpi.algorithms()


def _counts(size: int) -> list[int]:
    return [0, 1, 5, 3 * size - 1, 3 * size + 1, 1031]


def _run_case(ctx, comm, n, dtype, op, in_place):
    x = rank_input(n, comm.rank, dtype, op)
    if in_place:
        out = x.copy()
        ctx.Allreduce(MPI.IN_PLACE, out, op=op)
    else:
        out = np.full_like(x, 99)
        ctx.Allreduce(x, out, op=op)
        assert np.array_equal(x, rank_input(n, comm.rank, dtype, op)), "sendbuf modified"
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_op_count_and_mode(comm, algorithm, dtype):
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
    failures = []
    for op, op_id in zip(OPS, OP_IDS, strict=True):
        if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
            continue
        for n in _counts(comm.size):
            want = reference(n, comm.size, dtype, op)
            for in_place in (False, True):
                got = _run_case(ctx, comm, n, dtype, op, in_place)
                if not np.array_equal(got, want):
                    bad = np.nonzero(got != want)[0]
                    failures.append(f"{op_id} n={n} in_place={in_place}: first bad index "
                                    f"{bad[0]} got {got[bad[0]]} want {want[bad[0]]}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "native"])
def test_matches_native_mpi_allreduce(comm, algorithm):
    """Same answer as the MPI library's own Allreduce wherever that is exact (no overflow:
    Open MPI's optimised 8-bit integer SUM saturates instead of wrapping)."""
    failures = []
    for dtype in (np.int8, np.int32, np.uint16, np.float16, np.float32, np.float64,
                  np.complex128):
        for op in (MPI.SUM, MPI.MIN, MPI.MAX, MPI.PROD):
            if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
                continue
            n = 4099
            x = rank_input(n, comm.rank, dtype, op)
            wide = reference(n, comm.size, np.complex128 if np.dtype(dtype).kind == "c"
                             else np.float64, op)
            if not np.array_equal(reference(n, comm.size, dtype, op).astype(wide.dtype), wide):
                continue  # overflows this dtype: MPI libraries differ (wrap vs saturate)
            ours, native = np.empty_like(x), np.empty_like(x)
            bmlmpi.Allreduce(x, ours, op=op, comm=comm, algorithm=algorithm)
            comm.Allreduce(x, native, op=op)
            if not np.array_equal(ours, native):
                failures.append(f"{np.dtype(dtype).name} {op}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_explicit_shapes(comm):
    shapes = SHAPES.get(comm.size, [])
    failures = []
    for shape in shapes:
        ctx = bmlmpi.Communicator(comm, algorithm="bml", topology=shape)
        for n in (0, 1, 7, 1000, 12_345):
            for dtype, op in ((np.int64, MPI.SUM), (np.float32, MPI.MAX),
                              (np.float64, bmlmpi.AVG)):
                want = reference(n, comm.size, dtype, op)
                got = _run_case(ctx, comm, n, dtype, op, in_place=bool(n % 2))
                if not np.array_equal(got, want):
                    failures.append(f"shape {shape} n={n} {np.dtype(dtype).name}")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_buffer_specs_and_module_functions(comm):
    n = 37
    x = rank_input(n, comm.rank, np.float32, MPI.SUM)
    want = reference(n, comm.size, np.float32, MPI.SUM)
    out = np.zeros(n, np.float32)
    bmlmpi.Allreduce([x, MPI.FLOAT], [out, MPI.FLOAT], op=MPI.SUM, comm=comm)
    assert np.array_equal(out, want)
    out[:] = 0
    bmlmpi.Allreduce([x, n, MPI.FLOAT], [out, n, MPI.FLOAT], comm=comm, algorithm="bml")
    assert np.array_equal(out, want)
    # raw bytes reinterpreted through an MPI datatype
    raw = bytearray(x.tobytes())
    dst = bytearray(len(raw))
    bmlmpi.Allreduce([raw, MPI.FLOAT], [dst, MPI.FLOAT], comm=comm, algorithm="bml")
    assert np.array_equal(np.frombuffer(dst, np.float32), want)
    # a 2-D array and a larger receive buffer (only the first count elements are written)
    x2 = np.arange(12, dtype=np.int32).reshape(3, 4) + comm.rank
    big = np.full(20, -1, np.int32)
    bmlmpi.Allreduce(x2, big, comm=comm, algorithm="bml")
    assert np.array_equal(big[:12], np.arange(12) * comm.size + comm.size * (comm.size - 1) // 2)
    assert (big[12:] == -1).all()
    # allreduce returns a new array with the input's shape
    ctx = bmlmpi.Communicator(comm)
    got = ctx.allreduce(x2, op=MPI.MAX)
    assert got.shape == (3, 4) and np.array_equal(got, np.arange(12).reshape(3, 4) +
                                                  comm.size - 1)
    ctx.Free()


@pytest.mark.mpi
def test_iallreduce_many_outstanding_waited_in_any_order(comm):
    ctx = bmlmpi.Communicator(comm, algorithm="bml")
    xs = [rank_input(1000 + i, comm.rank, np.int64, MPI.SUM) for i in range(4)]
    outs = [np.empty_like(x) for x in xs]
    reqs = [ctx.Iallreduce(x, o) for x, o in zip(xs, outs, strict=True)]
    order = [3, 1, 0, 2] if comm.rank % 2 else [0, 1, 2, 3]
    for i in order:
        reqs[i].Wait()
    for i, o in enumerate(outs):
        assert np.array_equal(o, reference(1000 + i, comm.size, np.int64, MPI.SUM))
    req = bmlmpi.Iallreduce(xs[0], outs[0], comm=comm, algorithm="native")
    while not req.Test():
        pass
    ctx.Free()


def start_odd_ranks_first(comm, ctx, xs: list, outs: list) -> list:
    """``ctx.Iallreduce(x, out)`` for each pair, the odd ranks' calls started before the even
    ranks'. A ring rank receives from its left neighbour, of the other parity: the odd ranks'
    first steps cannot complete before the even ranks send, so they have posted no second
    step when the even ranks start theirs."""
    def start() -> list:
        return [ctx.Iallreduce(x, o) for x, o in zip(xs, outs, strict=True)]

    odd = comm.rank % 2 == 1
    reqs = start() if odd else []
    comm.Barrier()
    return reqs if odd else start()


@pytest.mark.mpi
@pytest.mark.parametrize("made_by", ["Dup", "Split", "Create"])
def test_sibling_calls_never_take_each_others_messages(comm, made_by):
    """Outstanding calls of one signature whose second steps neighbouring ranks post in
    opposite orders, on communicators made every way: each call gets exactly its own
    reduction. Calls of one signature are told apart only by their tags; Open MPI gives a
    communicator made by Split or Create no MPI_TAG_UB, and with the standard's least
    bound assumed instead every call shared one tag slot, so a rank's second-step receive of
    one call took a neighbour's second-step message of a sibling (results mixed between the
    calls, no error anywhere)."""
    if comm.size == 1:
        pytest.skip("one rank sends nothing")
    base = {"Dup": lambda: comm.Dup(), "Split": lambda: comm.Split(0, comm.rank),
            "Create": lambda: comm.Create(comm.Get_group())}[made_by]()
    ctx = bmlmpi.Communicator(base, algorithm="ring")
    n, calls = 1001, 3
    xs = [rank_input(n, comm.rank, np.int64, MPI.SUM) + 1000 * k for k in range(calls)]
    outs = [np.full(n, -1, np.int64) for _ in range(calls)]
    ctx.Allreduce(xs[0], outs[0])   # the signature's agreement, which needs every rank
    want = [reference(n, comm.size, np.int64, MPI.SUM) + 1000 * k * comm.size
            for k in range(calls)]
    assert np.array_equal(outs[0], want[0])

    reqs = start_odd_ranks_first(comm, ctx, xs, outs)
    odd = comm.rank % 2 == 1
    # Each rank takes its calls one by one through the first step, so that each posts its
    # second: in call order on even ranks, in reverse on odd ones.
    for k in (range(calls - 1, -1, -1) if odd else range(calls)):
        run = reqs[k].run
        assert execute.poll_until(lambda run=run: run.test() or run.step >= 1, 30), \
            f"call {k} did not get through its first step"
    for req in reqs:
        req.Wait()
    wrong = [k for k in range(calls) if not np.array_equal(outs[k], want[k])]
    ctx.Free()
    base.Free()
    all_ranks_agree(comm, [f"call {k} got a wrong result" for k in wrong])


@pytest.mark.mpi
def test_more_calls_of_one_signature_outstanding_than_tag_slots(comm):
    """Tag slots cycle (a signature's calls ``k`` and ``k + slots`` share tags): with more
    calls of one signature outstanding than there are slots, the call reusing a slot posts
    nothing until the call holding it completes. Without that, odd ranks that take their
    calls through the first step newest first made calls 0 and ``slots`` take each other's
    messages (both wrong, no error)."""
    if comm.size == 1:
        pytest.skip("one rank sends nothing")
    base = comm.Dup()
    ctx = bmlmpi.Communicator(base, algorithm="ring")
    n = 1001
    first = np.full(n, -1, np.int64)
    ctx.Allreduce(rank_input(n, comm.rank, np.int64, MPI.SUM), first)   # the agreement
    slots = ctx.tag_slots
    calls = slots + 2
    xs = [rank_input(n, comm.rank, np.int64, MPI.SUM) + 1000 * k for k in range(calls)]
    outs = [np.full(n, -1, np.int64) for _ in range(calls)]

    reqs = start_odd_ranks_first(comm, ctx, xs, outs)
    odd = comm.rank % 2 == 1
    # odd ranks push the slot's newer call first; a deferred one (run.after) posts nothing
    for k in ([slots, 0] if odd else [0, slots]):
        run = reqs[k].run
        assert execute.poll_until(
            lambda run=run: run.test() or run.step >= 1 or run.after is not None, 30), \
            f"call {k} did not get through its first step"
    for req in reqs:
        req.Wait()
    want = [reference(n, comm.size, np.int64, MPI.SUM) + 1000 * k * comm.size
            for k in range(calls)]
    wrong = [k for k in range(calls) if not np.array_equal(outs[k], want[k])]
    ctx.Free()
    base.Free()
    all_ranks_agree(comm, [f"call {k} got a wrong result" for k in wrong])


@pytest.mark.mpi
def test_algorithm_env_override_and_auto_rule(comm, monkeypatch):
    from bmlmpi import selection

    monkeypatch.setenv("BMLMPI_ALGORITHM", "native")
    assert selection.choose(1 << 28, 4, comm.size) == "native"
    assert not selection.calibration_wanted("auto")
    monkeypatch.setenv("BMLMPI_ALGORITHM", "ring")
    assert selection.choose(1, 4, comm.size) == "ring"
    monkeypatch.setenv("BMLMPI_ALGORITHM", "nonsense")
    with pytest.raises(ValueError, match="unknown algorithm"):
        selection.choose(4, 4, comm.size)
    monkeypatch.delenv("BMLMPI_ALGORITHM")
    # the calibration is taken at the first auto call it would price, not at construction
    # (refused where it cannot be true: a loaded machine's may be); the model's choice is one
    # of the candidates and the same on every rank
    ctx = bmlmpi.Communicator(comm)
    assert ctx.calibration is None and not ctx.tuning.settled
    x = np.ones(1000, dtype=np.float32)
    ctx.Allreduce(x, np.empty_like(x))
    assert ctx.tuning.settled == (comm.size > 1 and selection.calibration_wanted("auto"))
    picks = [ctx.plans.auto(n, 4) for n in (1, 1000, 1 << 20)]
    assert all(p in bmlmpi.algorithms() for p in picks)
    assert comm.allgather(picks) == [picks] * comm.size
    ctx.Free()
    monkeypatch.setenv("BMLMPI_TREE_ARRAY_BOUND", "100")
    assert "multitree" not in selection.candidates(100, 4)
    assert "tree" not in selection.candidates(101, 4)
