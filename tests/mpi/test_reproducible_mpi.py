"""Reproducible allreduces (docs/reproducible.md) on real ranks: every algorithm, blocking,
``I…`` and persistent, in place and not, returns the bits of one reference (the same addends
reduced on one rank in the reproducible format, :mod:`bmlmpi.reproducible.format`), whichever
rank holds which contribution and with ranks adding zeros; integer-valued data equals
``math.fsum``; PROD and compression are refused on every rank, integers and MIN/MAX pass
through. Small: a few hundred values a call."""

import math

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi
from bmlmpi.call_formats import ReproducibleRefused
from bmlmpi.reproducible import format as rf

DTYPES = [np.float16, np.float32, np.float64, np.complex128]
#: values a call: two blocks of the format and a part of a third (complex: twice the reals)
COUNT = 300


def contribution(k: int, dtype, n: int = COUNT) -> np.ndarray:
    """Contribution ``k``: mixed magnitudes (float16: within its range), a position- and
    ``k``-dependent pattern, so that a misplaced range or contribution changes the bits; every
    other block of the format (256 reals, a complex value two) scaled by 2^-8, so that
    neighbouring blocks have other cuts and a value decoded at another block's cut changes
    the bits."""
    rng = np.random.default_rng(1000 + k)
    span = 3 if np.dtype(dtype) == np.float16 else 8
    reals = 2 if np.dtype(dtype).kind == "c" else 1
    block = np.arange(n) * reals // rf.BLOCK
    mag = 10.0 ** rng.integers(-span, span, n) * 2.0 ** (-8 * (block % 2))
    x = rng.standard_normal(n) * mag
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(n) * mag[::-1]
    return x.astype(dtype)


def reference(parts: list[np.ndarray], avg_over: int | None = None) -> np.ndarray:
    """The reproducible reduction of ``parts`` on this one rank, in the format's steps."""
    agreed = np.max([rf.block_exponents(p) for p in parts], axis=0)
    words = sum(rf.encode(p, agreed) for p in parts)
    special = None
    if agreed[:, 1].any():
        special = np.bitwise_or.reduce([rf.specials(p, agreed) for p in parts])
    out = rf.decode(words, agreed, parts[0].dtype, special)
    return out if avg_over is None else rf.average(out, avg_over)


def _check(failures: list, what: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.tobytes() != want.tobytes():
        bad = int(np.sum(got.view(np.uint8) != want.view(np.uint8)))
        failures.append(f"{what}: {bad} bytes differ from the reference")


@pytest.fixture(scope="module")
def repro():
    # a named algorithm: no calibration at construction, no measuring auto (calls name theirs)
    c = bmlmpi.Communicator(MPI.COMM_WORLD, "native", reproducible=True, timeout=60)
    yield c
    c.Free()


@pytest.mark.mpi
def test_every_algorithm_and_form_gives_the_reference_bits(repro):
    """Each algorithm with one dtype (each dtype meets two algorithms, once in place and
    once not for each form)."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    wanted = {}
    for j, algorithm in enumerate(bmlmpi.algorithms("allreduce")):
        dtype = DTYPES[j % len(DTYPES)]
        if dtype not in wanted:
            parts = [contribution(k, dtype) for k in range(size)]
            wanted[dtype] = (parts[rank], reference(parts))
        mine, want = wanted[dtype]
        in_place = (j // len(DTYPES)) % 2 == 0
        what = f"{algorithm} {np.dtype(dtype)}"
        buf = mine.copy()
        c.Allreduce(MPI.IN_PLACE if in_place else mine, buf, algorithm=algorithm)
        _check(failures, f"{what} blocking in_place={in_place}", buf, want)
        buf = mine.copy()
        c.Iallreduce(mine if in_place else MPI.IN_PLACE, buf, algorithm=algorithm).Wait()
        _check(failures, f"{what} I in_place={not in_place}", buf, want)
        persistent = c.Allreduce_init(MPI.IN_PLACE if in_place else mine, buf,
                                      algorithm=algorithm)
        for _ in range(2 if j == 0 else 1):  # each start agrees its cuts again
            buf[:] = mine
            persistent.Start()
            persistent.Wait()
            _check(failures, f"{what} persistent in_place={in_place}", buf, want)
        persistent.Free()
    all_ranks_agree(MPI.COMM_WORLD, failures)


def _fast_calls(c) -> int:
    """The blocking reproducible calls that took a fast-path entry so far."""
    return sum(e.calls for e in c._fast_path.entries.values() if e.wire is not None)


@pytest.mark.mpi
def test_repeated_blocking_calls_take_the_fast_path_with_the_reference_bits(repro):
    """A blocking signature's later calls take its fast-path entry (FastPath.carried; where
    the algorithm serves reduce-scatter and allgather, at N > 1, summed where the addends
    meet, as the buffer the entry kept shows; auto's once it has explored), and every call,
    the checked first one included, gives the reference bits:
    every algorithm, in place and not, counts below the rank count, a flagged block, AVG.
    A communicator of its own: no signature of it ran before."""
    c = bmlmpi.Communicator(MPI.COMM_WORLD, "native", reproducible=True, timeout=60)
    try:
        failures = _fast_path_cases(c)
    finally:
        c.Free()
    all_ranks_agree(MPI.COMM_WORLD, failures)


def _fast_path_cases(c) -> list[str]:
    rank, size = c.rank, c.size
    failures = []
    cases = [(np.float32, COUNT, MPI.SUM), (np.float64, COUNT, bmlmpi.AVG),
             (np.complex128, 7, MPI.SUM), (np.float16, 1, MPI.SUM),
             (np.float32, size + 1, bmlmpi.AVG)]
    for j, algorithm in enumerate(bmlmpi.algorithms("allreduce")):
        dtype, n, op = cases[j % len(cases)]
        parts = [contribution(k, dtype, n) for k in range(size)]
        if j == 0:
            parts[0][n // 2] = np.nan   # a flagged block: its special bytes exchanged
        want = reference(parts, size if op is bmlmpi.AVG else None)
        mine = parts[rank]
        for in_place in (False, True):
            before = _fast_calls(c)
            for i in range(3):
                buf = mine.copy()
                c.Allreduce(MPI.IN_PLACE if in_place else mine, buf, op=op,
                            algorithm=algorithm)
                _check(failures, f"{algorithm} {np.dtype(dtype)} x {n} in_place={in_place} "
                                 f"call {i}", buf, want)
            # auto's signature explores its candidates first, on the checked path, where
            # its calls are counted, and opens its entry once committed (from the tuning
            # table at once, after its exploration otherwise): tests/mpi/
            # test_auto_tuning_mpi.py counts them; at one rank there is nothing to explore
            if (algorithm != "auto" or size == 1) and _fast_calls(c) - before != 2:
                failures.append(f"{algorithm} in_place={in_place}: "
                                f"{_fast_calls(c) - before} fast calls, not 2")
        if algorithm != "auto":
            _check_path(failures, c, algorithm, dtype)
    return failures


def _check_path(failures: list, c, algorithm: str, dtype) -> None:
    """Which path the fast-path calls of ``algorithm`` took: at N > 1 the pipelined meet
    where the algorithm serves no all-to-all (a meet plan compiled, no buffer kept by the
    carrier: the run's scratch holds the received pieces), else the column of the
    all-to-all (its values' dtype, one row a rank) kept where the algorithm serves the
    reduce-scatter and the allgather (summed where the addends meet), else the int64
    words."""
    serves = set(bmlmpi.algorithms("reduce_scatter")) & set(bmlmpi.algorithms("allgather"))
    pipelines = c.size > 1 and algorithm not in bmlmpi.algorithms("alltoall")
    meets = c.size > 1 and algorithm in serves and not pipelines
    kept = [e.wire.kept for e in c._fast_path.entries.values()
            if e.wire is not None and e.algorithm == algorithm and e.wire.kept is not None]
    if pipelines:
        if kept:
            failures.append(f"{algorithm}: kept {kept[0].dtype} {kept[0].shape}, expected "
                            f"the pipelined meet")
        if not any(key[0] == "meet" for key in c._cache.plans):
            failures.append(f"{algorithm}: no pipelined meet's plan compiled")
        return
    if not kept:
        failures.append(f"{algorithm}: no fast-path entry kept a buffer")
    for k in kept:
        took = k.ndim == 2 and k.shape[0] == c.size and k.dtype == np.dtype(dtype)
        if took != meets or (not meets and k.dtype != np.int64):
            failures.append(f"{algorithm}: kept {k.dtype} {k.shape}, summed where the "
                            f"addends meet: {took}, expected {meets}")


@pytest.mark.mpi
def test_ranks_on_the_fast_and_the_checked_path_meet_in_one_call(repro):
    """Rank 0 completes an Iallreduce before a blocking call whose signature is open (its
    fast path), the others leave theirs outstanding (their checked path): the call's MPI
    exchanges pair up, and every rank gets the reference bits."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    parts = [contribution(k, np.float64) for k in range(size)]
    want = reference(parts)
    for algorithm in ("ring", "native", "tree"):
        buf = np.empty_like(parts[rank])
        c.Allreduce(parts[rank], buf, algorithm=algorithm)   # opens the signature's entry
        for outstanding in ("native", "bml"):
            other = np.empty_like(parts[rank])
            req = c.Iallreduce(parts[rank], other, algorithm=outstanding)
            if rank == 0:
                req.Wait()
            buf = np.empty_like(parts[rank])
            c.Allreduce(parts[rank], buf, algorithm=algorithm)
            req.Wait()
            _check(failures, f"{algorithm} beside an outstanding {outstanding}", buf, want)
            _check(failures, f"the outstanding {outstanding}", other, want)
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_any_placement_of_the_contributions_gives_the_same_bits(repro):
    """Rank r holds contribution perm[r] for several permutations; AVG divides once."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    sums = [contribution(k, np.float64) for k in range(size)]
    avgs = [contribution(k, np.float32) for k in range(size)]
    want, avg = reference(sums), reference(avgs, avg_over=size)
    for shift, flip in ((0, False), (1, False), (0, True)):
        k = (size - 1 - rank if flip else rank + shift) % size
        out = np.empty_like(sums[k])
        c.Allreduce(sums[k], out, algorithm="ring")
        _check(failures, f"float64 shift {shift} flip {flip}", out, want)
        out = np.empty_like(avgs[k])
        c.Allreduce(avgs[k], out, op=bmlmpi.AVG, algorithm="tree")
        _check(failures, f"float32 AVG shift {shift} flip {flip}", out, avg)
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_ranks_adding_zeros_and_a_smaller_communicator_give_the_same_bits(repro):
    """The last rank adds zeros: the bits of the other ranks' contributions reduced among
    themselves (a sub-communicator), and of the one-rank reference."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    holders = max(size - 1, 1)
    for dtype in (np.float16, np.complex128):
        parts = [contribution(k, dtype) for k in range(holders)]
        want = reference(parts)
        mine = parts[rank] if rank < holders else np.zeros_like(parts[0])
        out = np.empty_like(mine)
        c.Allreduce(mine, out, algorithm="bml")
        _check(failures, f"{np.dtype(dtype)} with a zero rank", out, want)
    # every rank builds one communicator (the zero rank one of its own), so that the ranks'
    # communicators keep one creation order (the flight recorder's files are named by it)
    holding = rank < holders
    sub_comm = MPI.COMM_WORLD.Split(0 if holding else 1, rank)
    sub = bmlmpi.Communicator(sub_comm, "native", reproducible=True, timeout=60)
    try:
        for dtype in (np.float16, np.complex128):
            parts = [contribution(k, dtype) for k in range(holders)]
            if holding:
                out = np.empty_like(parts[0])
                sub.Allreduce(parts[rank], out, algorithm="native")
                _check(failures, f"{np.dtype(dtype)} on {holders} ranks", out,
                       reference(parts))
    finally:
        sub.Free()
        sub_comm.Free()
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_integer_valued_data_equals_math_fsum(repro):
    c = repro
    rank, size = c.rank, c.size
    failures = []
    i = np.arange(COUNT)
    for dtype in (np.float32, np.float64):
        parts = [((i * 37 + k * 1001) % 4099 - 2000.0) * 2.0 ** (k % 3) for k in range(size)]
        want = np.array([math.fsum(p[j] for p in parts) for j in range(COUNT)], dtype)
        out = np.empty(COUNT, dtype)
        c.Allreduce(parts[rank].astype(dtype), out, algorithm="multitree")
        _check(failures, f"{np.dtype(dtype)} integer-valued", out, want)
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_special_values_follow_the_rules_on_every_algorithm(repro):
    """A NaN, infinities and -0 on some ranks: the flagged blocks' bytes are exchanged."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    parts = [contribution(k, np.float64) for k in range(size)]
    for k, p in enumerate(parts):
        p[3] = -0.0                     # -0 everywhere: the result is -0
        p[260 + k % 2] = np.inf         # +inf; -inf on one rank at 261 when size > 1
    parts[-1][261] = -np.inf
    parts[0][5] = np.nan
    want = reference(parts)
    assert np.signbit(want[3]) and want[3] == 0 and np.isnan(want[5])
    for algorithm in ("native", "ring"):
        out = np.empty_like(parts[rank])
        c.Allreduce(parts[rank], out, algorithm=algorithm)
        _check(failures, f"specials {algorithm}", out, want)
    all_ranks_agree(MPI.COMM_WORLD, failures)


def _outcome(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        return type(exc).__name__
    return None


@pytest.mark.mpi
def test_prod_and_compression_are_refused_on_every_rank(repro):
    c = repro
    x = np.arange(1.0, 9.0)
    failures = []
    for what, fn in (("PROD", lambda: c.Allreduce(x, np.empty_like(x), op=MPI.PROD)),
                     ("compression", lambda: c.Allreduce(x, np.empty_like(x),
                                                         compression="fp16"))):
        got = _outcome(fn)
        if got != "ReproducibleRefused":
            failures.append(f"{what}: {got}")
    all_ranks_agree(MPI.COMM_WORLD, failures)
    assert issubclass(ReproducibleRefused, ValueError)
    out = np.empty_like(x)
    c.Allreduce(x, out, op=MPI.PROD, reproducible=False)   # the call's own mode wins
    assert np.array_equal(out, x ** c.size)


@pytest.mark.mpi
def test_integers_min_and_max_pass_through(repro):
    c = repro
    rank = c.rank
    failures = []
    ints = (np.arange(COUNT, dtype=np.int64) * 3 + rank) % 101
    floats = contribution(rank, np.float32)
    for what, x, op in (("int64 SUM", ints, MPI.SUM), ("float32 MIN", floats, MPI.MIN),
                        ("float32 MAX", floats, MPI.MAX)):
        out, want = np.empty_like(x), np.empty_like(x)
        c.Allreduce(x, out, op=op)
        MPI.COMM_WORLD.Allreduce(x, want, op=op)
        _check(failures, what, out, want)
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_ranks_that_differ_in_the_mode_fail_on_every_rank(repro):
    c = repro
    if c.size == 1:
        pytest.skip("one rank agrees with itself")
    x = contribution(c.rank, np.float32, 10)
    got = _outcome(lambda: c.Allreduce(x, np.empty_like(x), algorithm="ring",
                                       reproducible=c.rank != 0))
    all_ranks_agree(MPI.COMM_WORLD, [] if got == "ArgumentMismatch" else [f"raised {got}"])


@pytest.mark.mpi
def test_reduce_scatter_and_reduce_give_the_reference_bits(repro):
    """Every algorithm of each, blocking, ``I…`` and persistent in turn, in place and not;
    the blocks and the root's result are the reference's."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    per = 150
    for j, algorithm in enumerate(bmlmpi.algorithms("reduce_scatter")):
        dtype = DTYPES[j % len(DTYPES)]
        parts = [contribution(k, dtype, per * size) for k in range(size)]
        want = reference(parts)
        mine = want[rank * per:(rank + 1) * per]
        buf = parts[rank].copy()
        form = ("blocking", "I", "persistent")[j % 3]
        what = f"Reduce_scatter_block {algorithm} {np.dtype(dtype)} {form}"
        if form == "blocking":
            c.Reduce_scatter_block(MPI.IN_PLACE, buf, algorithm=algorithm)
        elif form == "I":
            c.Ireduce_scatter_block(parts[rank], buf[:per], algorithm=algorithm).Wait()
        else:
            persistent = c.Reduce_scatter_block_init(parts[rank], buf[:per],
                                                     algorithm=algorithm)
            persistent.Start()
            persistent.Wait()
            persistent.Free()
        _check(failures, what, buf[:per], mine)
        counts = [per + (r == 0) - (r == size - 1) for r in range(size)]
        out = np.empty(counts[rank], dtype)
        c.Reduce_scatter(parts[rank], out, counts, algorithm=algorithm)
        at = sum(counts[:rank])
        _check(failures, f"Reduce_scatter {algorithm} {np.dtype(dtype)}", out,
               want[at:at + counts[rank]])
    for j, algorithm in enumerate(bmlmpi.algorithms("reduce")):
        dtype = DTYPES[j % len(DTYPES)]
        parts = [contribution(k, dtype) for k in range(size)]
        want, root = reference(parts), j % size
        out = parts[rank].copy() if rank == root else None
        what = f"Reduce {algorithm} {np.dtype(dtype)} root {root}"
        if j % 2:
            c.Ireduce(MPI.IN_PLACE if rank == root else parts[rank], out, root=root,
                      algorithm=algorithm).Wait()
        else:
            c.Reduce(parts[rank], np.empty_like(parts[rank]) if out is None else out,
                     root=root, algorithm=algorithm)
        if rank == root:
            _check(failures, what, out, want)
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_the_family_takes_the_mode_per_call(repro):
    """``reproducible=`` on Reduce_scatter(_block) and Reduce, blocking, ``I…`` and
    ``_init``, on a plain communicator: the reference's bits; a plain call of the same arrays
    before and after (its fast-path entry opened) stays plain, the reproducible one stays
    reproducible; on the reproducible communicator ``reproducible=False`` runs the plain
    call (equal to mpi4py's on integer-valued data)."""
    c = repro
    rank, size = c.rank, c.size
    failures = []
    per = 70
    plain = bmlmpi.Communicator(MPI.COMM_WORLD, "native", timeout=60)
    try:
        parts = [contribution(k, np.float64, per * size) for k in range(size)]
        whole = reference(parts)
        mine, x = whole[rank * per:(rank + 1) * per], parts[rank]
        for algorithm in ("ring", "native"):
            for i in range(3):   # the plain signature's entry opens after its first call
                out = np.empty(per)
                plain.Reduce_scatter_block(x, out, algorithm=algorithm)
                out = np.empty(per)
                plain.Reduce_scatter_block(x, out, algorithm=algorithm, reproducible=True)
                _check(failures, f"Reduce_scatter_block {algorithm} call {i}", out, mine)
            out = np.empty(per)
            plain.Ireduce_scatter_block(x, out, algorithm=algorithm, reproducible=True).Wait()
            _check(failures, f"Ireduce_scatter_block {algorithm}", out, mine)
            persistent = plain.Reduce_scatter_block_init(x, out, algorithm=algorithm,
                                                         reproducible=True)
            persistent.Start()
            persistent.Wait()
            persistent.Free()
            _check(failures, f"Reduce_scatter_block_init {algorithm}", out, mine)
            counts = [per] * size
            for form in ("blocking", "I", "init"):
                out = np.empty(per)
                if form == "blocking":
                    plain.Reduce_scatter(x, out, counts, algorithm=algorithm, reproducible=True)
                elif form == "I":
                    plain.Ireduce_scatter(x, out, counts, algorithm=algorithm,
                                          reproducible=True).Wait()
                else:
                    persistent = plain.Reduce_scatter_init(x, out, counts, algorithm=algorithm,
                                                           reproducible=True)
                    persistent.Start()
                    persistent.Wait()
                    persistent.Free()
                _check(failures, f"Reduce_scatter {form} {algorithm}", out, mine)
        for algorithm in ("tree", "native"):
            for form in ("blocking", "blocking", "I", "init"):
                out = np.empty_like(parts[rank])
                if form == "blocking":
                    plain.Reduce(x, out, root=0, algorithm=algorithm)   # plain, then ...
                    plain.Reduce(x, out, root=0, algorithm=algorithm, reproducible=True)
                elif form == "I":
                    plain.Ireduce(x, out, root=0, algorithm=algorithm,
                                  reproducible=True).Wait()
                else:
                    persistent = plain.Reduce_init(x, out, root=0, algorithm=algorithm,
                                                   reproducible=True)
                    persistent.Start()
                    persistent.Wait()
                    persistent.Free()
                if rank == 0:
                    _check(failures, f"Reduce {form} {algorithm}", out, whole)
        ints = [((np.arange(per * size) * 7 + k) % 13 - 6.0) for k in range(size)]
        exact = np.sum(ints, axis=0)
        out = np.empty(per)
        c.Reduce_scatter_block(ints[rank], out, algorithm="ring", reproducible=False)
        _check(failures, "the reproducible communicator's plain call", out,
               exact[rank * per:(rank + 1) * per])
    finally:
        plain.Free()
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_gradient_buckets_are_reproducible(repro):
    """Per-layer buckets give each array's reference (AVG); one fused bucket gives the same
    bits on two algorithms."""
    c = repro
    rank, size = c.rank, c.size
    shapes = ((40, 7), (300,), (5,))
    layers = [[contribution(10 * i + k, np.float32, int(np.prod(s))).reshape(s)
               for k in range(size)] for i, s in enumerate(shapes)]
    failures = []
    grads = [layer[rank].copy() for layer in layers]
    with bmlmpi.GradientBuckets(grads, comm=c, plan="layer") as buckets:
        for i in range(len(grads)):
            buckets.mark_ready(i)
        buckets.wait()
    for i, layer in enumerate(layers):
        want = reference([a.reshape(-1) for a in layer], avg_over=size)
        _check(failures, f"layer {i}", grads[i].reshape(-1), want)
    fused = {}
    for algorithm in ("ring", "tree"):
        other = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm, timeout=60)
        try:
            grads = [layer[rank].copy() for layer in layers]
            with bmlmpi.GradientBuckets(grads, comm=other, plan="single",
                                        reproducible=True) as buckets:
                for i in range(len(grads)):
                    buckets.mark_ready(i)
                buckets.wait()
            fused[algorithm] = b"".join(g.tobytes() for g in grads)
        finally:
            other.Free()
    if fused["ring"] != fused["tree"]:
        failures.append("one fused bucket: ring and tree differ")
    all_ranks_agree(MPI.COMM_WORLD, failures)


@pytest.mark.mpi
def test_a_rank_that_never_starts_makes_the_others_hit_the_deadline():
    """The block exponents' MAX waits under the deadline: the ranks that started raise, the
    communicator is revoked on them, nothing hangs."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("needs two ranks")
    c = bmlmpi.Communicator(world, "ring", timeout=1.5, validate=False, reproducible=True)
    x = contribution(world.rank, np.float32, 64)
    failures = []
    if world.rank != 0:
        got = _outcome(lambda: c.Iallreduce(x, np.empty_like(x)))
        if got not in ("DeadlineExceeded", "CommunicatorRevoked"):
            failures.append(f"raised {got}")
        if _outcome(lambda: c.Allreduce(x, np.empty_like(x))) != "CommunicatorRevoked":
            failures.append("the communicator is not revoked after the deadline")
    world.Barrier()
    all_ranks_agree(world, failures)
    c.Free()
