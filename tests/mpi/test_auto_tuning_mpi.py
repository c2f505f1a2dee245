"""auto by measurement under real ranks (bmlmpi.auto_tuning): the user's calls explore the
candidates with exact results, every rank commits alike (the slowest rank's times count), a
call naming its algorithm never reaches the tuner, and the tuning table carries the commits
to the next communicator. Times are injected, never asserted."""

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi
from bmlmpi.model import Calibration
from bmlmpi.reproducible import format as rf

FAMILY = ("reduce_scatter", "allgather", "reduce", "bcast")
#: a plausible calibration that times every collective's native call, so that auto prices
#: the schedules of each
PRICES = Calibration(alpha=1e-5, beta=1e-9, native=((8, 2e-5), (1 << 20, 1e-3)),
                     natives=tuple((c, b, t) for c in FAMILY
                                   for b, t in ((8, 2e-5), (1 << 20, 1e-3))))


@pytest.fixture
def own_table(tmp_path_factory, monkeypatch):
    """A tuning table of this test's own (none at first), no calibration measured,
    exploration blocks of one call (four calls per candidate) and no runoff, so that these
    tests of the pipeline stay short and commit after the one exploration (the blocks'
    statistics and the runoff are tests/unit/test_tuner_noise.py's;
    test_a_runoff_commits_every_rank_alike runs one)."""
    comm = MPI.COMM_WORLD
    where = comm.bcast(str(tmp_path_factory.mktemp("tuning")) if comm.rank == 0 else None)
    monkeypatch.setenv("BMLMPI_TUNING", f"{where}/table.jsonl")
    monkeypatch.setenv("BMLMPI_TUNING_BLOCK", "1")
    monkeypatch.setenv("BMLMPI_TUNING_RUNOFF", "0")
    monkeypatch.setenv("BMLMPI_CALIBRATE", "0")
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    return f"{where}/table.jsonl"


def data(n, rank, salt=0):
    """Position- and rank-dependent values whose sums are exact in float64."""
    return ((np.arange(n) * 7 + rank * 13 + salt) % 101).astype(np.float64)


def run(c, collective, n, salt, algorithm=None):
    """One blocking call of ``collective`` on ``c`` and mpi4py's on the world; both results."""
    world, r = MPI.COMM_WORLD, MPI.COMM_WORLD.rank
    size = world.size
    x = data(n * size, r, salt)
    if collective == "allreduce":
        out, ref = np.empty_like(x), np.empty_like(x)
        c.Allreduce(x, out, algorithm=algorithm)
        world.Allreduce(x, ref)
    elif collective == "reduce_scatter":
        out, ref = np.empty(n), np.empty(n)
        c.Reduce_scatter_block(x, out, algorithm=algorithm)
        world.Reduce_scatter_block(x, ref)
    elif collective == "allgather":
        out, ref = np.empty(n * size), np.empty(n * size)
        c.Allgather(x[:n], out, algorithm=algorithm)
        world.Allgather(x[:n], ref)
    elif collective == "reduce":
        out, ref = np.zeros_like(x), np.zeros_like(x)
        c.Reduce(x, out, root=0, algorithm=algorithm)
        world.Reduce(x, ref, root=0)
    else:
        out, ref = x.copy(), x.copy()
        c.Bcast(out, root=0, algorithm=algorithm)
        world.Bcast(ref, root=0)
    return out, ref


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", *FAMILY])
def test_every_explored_call_is_exact_and_the_ranks_commit_alike(own_table, collective,
                                                                  caplog):
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    n = 1000
    why = c.explain(n * world.size, np.float64, collective=collective)
    ran = []
    with caplog.at_level("DEBUG", logger="bmlmpi"):
        for call in range(20):
            out, ref = run(c, collective, n, call)
            assert np.array_equal(out, ref), (collective, call, c.recorder.calls()[-1])
            ran.append(c.recorder.calls()[-1]["chosen"])
    commits = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("auto committed")]
    assert len(commits) == (world.size > 1)   # logged once, at the commit
    after = c.explain(n * world.size, np.float64, collective=collective)
    if world.size == 1:
        assert why.rule == "one rank" and set(ran) == {why.chosen}
    else:
        names = [t.name for t in why.tuning.candidates]
        explored = 4 * len(names)
        assert why.rule == "exploring" and len(names) >= 2
        assert ran[:explored] == names * 4            # the rotation, the same on every rank
        assert after.rule in ("measured", "model", "rule") and after.tuning.state == "committed"
        assert set(ran[explored:]) == {after.chosen}  # committed: the chosen one runs
    assert world.allgather((ran, after.chosen)) == [(ran, after.chosen)] * world.size
    c.Free()


@pytest.mark.mpi
def test_the_slowest_ranks_times_decide(own_table):
    """The last rank's own times would pick the second candidate; on rank 0 it is slow. The
    proposals are MAX-reduced, so every rank commits to another, the same on all."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to choose between")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    n = 1 << 12
    tuner = c.tuning.tuner
    names = [t.name for t in c.explain(n, np.float64).tuning.candidates]
    fast = names[1]

    def injected(name):
        if name == fast:
            return 1e-5 if world.rank == world.size - 1 else (1e-2 if world.rank == 0 else 1e-3)
        return 1e-3 + 1e-4 * names.index(name)
    record = tuner.record
    tuner.record = lambda key, name, seconds: record(key, name, injected(name))
    x = data(n, world.rank)
    for _ in range(4 * len(names)):
        out, ref = np.empty(n), np.empty(n)
        c.Allreduce(x, out)
        world.Allreduce(x, ref)
        assert np.array_equal(out, ref)
    report = c.explain(n, np.float64).tuning
    assert report.state == "committed" and report.chosen != fast
    mine = min(names, key=injected)
    assert (mine == fast) == (world.rank == world.size - 1)
    assert world.allgather(report.chosen) == [report.chosen] * world.size
    measured = {t.name: t.measured for t in report.candidates}
    assert measured[fast] == 1e-2                # rank 0's median: the slowest rank counts
    c.Free()


@pytest.mark.mpi
def test_a_runoff_commits_every_rank_alike(own_table, monkeypatch):
    """A challenger whose median (85 us) beats the prior's (100 us) by more than the margin
    but whose second block was slow on one rank (3 ms): the gap is within the spread, so the
    two run off (a warm-up call each and four rounds of blocks in turn), every call exact;
    the challenger's blocks beat the prior's in every round but that one, and every rank
    commits it (measured), its median over seven blocks."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to choose between")
    monkeypatch.setenv("BMLMPI_TUNING_RUNOFF", "4")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    n = 1 << 12
    tuner = c.tuning.tuner
    report = c.explain(n, np.float64).tuning
    names = [t.name for t in report.candidates]
    prior = report.prior
    challenger = next(name for name in names if name != prior)
    seen: dict[str, int] = {}

    def injected(name):
        k = seen[name] = seen.get(name, -1) + 1   # 0: the warm-up call
        if name == prior:
            return 1e-4
        if name == challenger:
            return 3e-3 if (k == 2 and world.rank == world.size - 1) else 8.5e-5
        return 1e-3
    record = tuner.record
    tuner.record = lambda key, name, seconds: record(key, name, injected(name))
    x = data(n, world.rank)
    ran = []
    explored, runoff = 4 * len(names), 2 * (1 + 4)
    for call in range(explored + runoff + 3):
        out, ref = np.empty(n), np.empty(n)
        c.Allreduce(x, out)
        world.Allreduce(x, ref)
        assert np.array_equal(out, ref), (call, c.recorder.calls()[-1])
        ran.append(c.recorder.calls()[-1]["chosen"])
        if call == explored - 1:
            between = c.explain(n, np.float64)
            assert between.tuning.state == "exploring", str(between)
            assert set(between.tuning.runoff) == {prior, challenger}, str(between)
            assert "run off" in between.why, between.why
    pair = [name for name in names if name in (prior, challenger)]
    assert ran[:explored] == names * 4
    assert ran[explored:explored + runoff] == pair * 5
    report = c.explain(n, np.float64).tuning
    assert (report.state, report.chosen, report.why) == ("committed", challenger, "measured")
    assert set(ran[explored + runoff:]) == {challenger}
    blocks = {t.name: t.blocks for t in report.candidates}
    assert len(blocks[challenger]) == len(blocks[prior]) == 7
    assert max(blocks[challenger]) == 3e-3 and blocks[prior] == (1e-4,) * 7
    assert world.allgather((ran, report.chosen)) == [(ran, report.chosen)] * world.size
    c.Free()


@pytest.mark.mpi
def test_an_explored_call_is_timed_without_the_argument_agreement(own_table, monkeypatch):
    """The tuner's clock counts the argument agreements (the gathers of every rank's
    signature on the control channel): each candidate's first call agrees on its signature,
    yet no explored call's timed interval holds one, since the committed signature's fast
    path will run without any. The proposals are MAX-reduced as before."""
    from bmlmpi import agreement

    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to explore")
    gathers = [0]
    gather = agreement.Mailbox.gather

    def counted(self, *args, **kwargs):
        gathers[0] += 1
        return gather(self, *args, **kwargs)
    monkeypatch.setattr(agreement.Mailbox, "gather", counted)
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    tuning = c.tuning
    tuning.clock = lambda: float(gathers[0])
    timed = []
    record = tuning.tuner.record

    def kept(key, name, seconds):
        timed.append((key.collective, name, seconds))
        record(key, name, seconds)
    tuning.tuner.record = kept
    explored = 0
    for collective in ("allreduce", "bcast"):
        why = c.explain(64 * world.size, np.float64, collective=collective)
        calls = 4 * len(why.tuning.candidates)
        explored += calls
        for call in range(calls):
            out, ref = run(c, collective, 64, call)
            assert np.array_equal(out, ref), (collective, call)
        assert c.explain(64 * world.size, np.float64,
                         collective=collective).tuning.state == "committed"
    assert len(timed) == explored and gathers[0] >= 4   # every candidate agreed once
    assert [t for t in timed if t[2] != 0.0] == []
    c.Free()


@pytest.mark.mpi
def test_a_named_algorithm_never_reaches_the_tuner(own_table):
    world = MPI.COMM_WORLD
    for c, asked in ((bmlmpi.Communicator(world, timeout=60), "bml"),
                     (bmlmpi.Communicator(world, algorithm="bml", timeout=60), None)):
        for collective in ("allreduce", *FAMILY):
            for call in range(3):
                out, ref = run(c, collective, 64, call, algorithm=asked)
                assert np.array_equal(out, ref)
        assert c.tuning.tuner.keys() == [] and c.tuning.calls == {}
        assert not c.tuning.settled       # nor were the prices taken
        c.Free()


@pytest.mark.mpi
def test_the_next_communicator_starts_from_the_table(own_table):
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to choose between")
    n = 1 << 14   # 128 KiB, no calibration: every applicable record is a candidate
    first = bmlmpi.Communicator(world, timeout=60)
    out, ref = run(first, "allreduce", n // world.size, 0)   # the call that takes the prices
    explored = 4 * len(first.explain(n, np.float64).tuning.candidates)
    for call in range(explored):
        out, ref = run(first, "allreduce", n // world.size, 1 + call)
        assert np.array_equal(out, ref)
    committed = first.explain(n, np.float64).chosen
    assert first.explain(n, np.float64).tuning.state == "committed"
    first.Free()   # rank 0 merges the commit into the table
    world.Barrier()
    second = bmlmpi.Communicator(world, timeout=60)
    out, ref = run(second, "allreduce", n // world.size, 99)   # takes the prices: the table
    why = second.explain(n, np.float64)
    assert why.rule == "table" and why.chosen == committed, str(why)
    out, ref = run(second, "allreduce", n // world.size, 100)
    assert np.array_equal(out, ref) and second.recorder.calls()[-1]["chosen"] == committed
    # the non-blocking form of the tabled signature runs the table's choice too
    x = data(n, world.rank, 101)
    out, ref = np.empty_like(x), np.empty_like(x)
    second.Iallreduce(x, out).Wait()
    world.Allreduce(x, ref)
    assert np.array_equal(out, ref) and second.recorder.calls()[-1]["chosen"] == committed
    second.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_a_committed_signature_runs_the_named_algorithms_fast_path(own_table, collective,
                                                                   monkeypatch):
    """Once an 8 B signature has committed native (injected times), its calls take the same
    kind of fast-path entry as a call that names native (mpi4py's blocking call, the same
    method and arguments), and the fast path asks nothing of auto: no call reaches
    AutoTuning or the Tuner, so the committed auto call costs what the named one does."""
    from bmlmpi.auto_tuning import AutoTuning
    from bmlmpi.tuner import Tuner

    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to commit")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    tuner = c.tuning.tuner
    record = tuner.record
    tuner.record = lambda key, name, seconds: record(key, name,
                                                     1e-5 if name == "native" else 1e-3)
    n = 1   # one float64 per rank's block: 8 B a rank, 8 B x N the work buffer
    why = c.explain(n * world.size, np.float64, collective=collective)
    for call in range(4 * len(why.tuning.candidates) + 1):   # blocks of one call
        out, ref = run(c, collective, n, call)
        assert np.array_equal(out, ref)
        if c.explain(n * world.size, np.float64, collective=collective).tuning.state \
                == "committed":
            break
    assert c.explain(n * world.size, np.float64, collective=collective).chosen == "native"
    for call in range(2):   # the committed call opens its entry; the named one its own
        run(c, collective, n, 100 + call)
        run(c, collective, n, 200 + call, algorithm="native")
    entries = c._fast_path.entries
    method = "Allreduce" if collective == "allreduce" else "Reduce_scatter_block"
    # (the family keys the communicator's own algorithm, auto here, as None)
    auto = [e for k, e in entries.items() if k[0] == method and k[1] in ("auto", None)]
    named = [e for k, e in entries.items() if k[:2] == (method, "native")]
    assert len(auto) == len(named) == 1, list(entries)
    for e in (auto[0], named[0]):
        assert e.plan is None and e.native is not None   # mpi4py's blocking call
    assert (auto[0].native.method, auto[0].native.direct) == (named[0].native.method,
                                                              named[0].native.direct)
    asked = []
    for cls in (AutoTuning, Tuner):
        for name, fn in vars(cls).items():
            if callable(fn) and not name.startswith("__"):
                monkeypatch.setattr(cls, name, (lambda f, n: lambda *a, **k: (
                    asked.append(n), f(*a, **k))[1])(fn, f"{cls.__name__}.{name}"))
    before = c.recorder.calls()[-1]["seq"] if c.recorder.calls() else -1
    for call in range(20):
        out, ref = run(c, collective, n, 300 + call)
        assert np.array_equal(out, ref)
    assert asked == []
    ran = [r for r in c.recorder.calls() if r["seq"] > before]
    assert {r["chosen"] for r in ran} == {"native"}, ran
    c.Free()


def committed_path(collective: str, rank: int) -> tuple[str, ...]:
    """The only functions of bmlmpi a committed 8 B signature's call runs on ``rank``, once
    each, when a loop passes the same arrays again (FastPath.repeat for the allreduce,
    FastPath.family's Recent and FastPath.run for the rest): the public method and the fast
    path; for a reduce or a broadcast the notices (one poll of the control channel,
    docs/contracts.md: a rank's part may complete without a rank that refused); mpi4py's
    arguments carved where they are not the caller's own (the allgather's, broadcast's and
    all-to-all's bytes, a reduce's non-root, which hands MPI no receive buffer); the call's
    number from its one owner, the gate's claim from its. No signature key, no checked
    path, no executor, nothing of auto's."""
    if collective == "allreduce":
        return ("Communicator.Allreduce", "FastPath.repeat", "CallGate.enter",
                "CallNumbers.take")
    method = {"reduce_scatter": "Reduce_scatter_block", "allgather": "Allgather",
              "reduce": "Reduce", "bcast": "Bcast", "alltoall": "Alltoall"}[collective]
    path = [f"Communicator.{method}", "FastPath.family", "FastPath.run", "CallGate.enter",
            "FastPath.native", "CallNumbers.take"]
    if collective in ("reduce", "bcast"):
        path += ["CallAgreement.notice_waiting", "Mailbox.failure"]
    if collective in ("allgather", "bcast", "alltoall") or collective == "reduce" and rank != 0:
        path.append("NativeArgs.of")
    return tuple(path)


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", *FAMILY, "alltoall"])
def test_a_committed_small_call_runs_nothing_but_its_fast_path(own_table, collective,
                                                              monkeypatch):
    """A loop of one committed 8 B auto signature (native, injected times) over the same
    arrays: each call runs exactly the functions of committed_path, once each (a profiler
    counts every Python function called; NativeArgs.of carves no buffer here: mpi4py
    reads the allgather's, the broadcast's and the all-to-all's bytes from the arrays as
    they are), and the
    results are exact. A function added to the path, or a lookup made per call that the
    signature could keep, fails here; times are not asserted."""
    import gc
    import sys
    from pathlib import Path

    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to commit")
    c = bmlmpi.Communicator(world, timeout=60)
    c.Allreduce(np.ones(1), np.empty(1))   # the first auto call, after which prices are taken
    tuner = c.tuning.tuner
    record = tuner.record
    monkeypatch.setattr(tuner, "record", lambda key, name, seconds: record(
        key, name, 1e-5 if name == "native" else 1e-3))
    n, size, r = 2, world.size, world.rank
    x = data(n * size, r)
    part = x[:n]   # (one view: a user's loop passes the same arrays)
    out = np.empty(n if collective == "reduce_scatter" else n * size)
    ref = np.empty_like(out)
    calls = {"allreduce": lambda: c.Allreduce(x, out),
             "reduce_scatter": lambda: c.Reduce_scatter_block(x, out),
             "allgather": lambda: c.Allgather(part, out),
             "reduce": lambda: c.Reduce(x, out, root=0),
             "bcast": lambda: c.Bcast(out, root=0),
             "alltoall": lambda: c.Alltoall(x, out)}
    theirs = {"allreduce": lambda: world.Allreduce(x, ref),
              "reduce_scatter": lambda: world.Reduce_scatter_block(x, ref),
              "allgather": lambda: world.Allgather(part, ref),
              "reduce": lambda: world.Reduce(x, ref, root=0),
              "bcast": lambda: world.Bcast(ref, root=0),
              "alltoall": lambda: world.Alltoall(x, ref)}
    call = calls[collective]
    for _ in range(100):   # the exploration (blocks of one call), the commit, the entry
        call()
        # (an all-to-all's total: every rank's n·size elements)
        total = n * size * (size if collective == "alltoall" else 1)
        key = c.tuning.key(collective, total, x.dtype, "sum", 0)
        if tuner.committed(key) is not None:
            break
    assert tuner.committed(key) == "native"
    call()
    call()
    package = str(Path(bmlmpi.__file__).parent)
    seen: dict[str, int] = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            name = frame.f_code.co_qualname
            seen[name] = seen.get(name, 0) + 1
    rounds = 10
    failures = []
    # a communicator an earlier test dropped is finalized now, not by the cyclic collector
    # inside a profiled call (its Watchdog.close was counted once, under load)
    gc.collect()
    gc.disable()
    try:
        for i in range(rounds):
            if collective == "bcast":
                out[:] = x[:out.size] if r == 0 else -1
                ref[:] = out
            else:
                out[:] = -1
                ref[:] = -1
            sys.setprofile(profile)
            try:
                call()
            finally:
                sys.setprofile(None)
            theirs[collective]()
            if (collective != "reduce" or r == 0) and not np.array_equal(out, ref):
                failures.append(f"call {i}: {out} != {ref}")
    finally:
        gc.enable()
    want = {name: rounds for name in committed_path(collective, r)}
    if seen != want:
        failures.append(f"ran {dict(sorted(seen.items()))}, want each of "
                        f"{sorted(want)} once a call")
    c.Free()
    all_ranks_agree(world, failures)


@pytest.mark.mpi
def test_the_other_forms_and_buckets_run_what_the_blocking_calls_committed(own_table):
    """docs/tuning.md's "the other forms": after the blocking calls of a signature commit
    (injected times make a candidate other than the prior win), its Iallreduce, its
    persistent Allreduce_init and a GradientBuckets allreduce of the same signature run the
    committed algorithm (the flight recorder says which ran), exactly."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to commit")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    n = 64    # 64 float64 per rank's block: a 512 B x N allreduce
    why = c.explain(n * world.size, np.float64)
    names = [t.name for t in why.tuning.candidates]
    winner = next(name for name in reversed(names) if name not in (why.chosen, "native"))
    tuner = c.tuning.tuner
    record = tuner.record
    tuner.record = lambda key, name, seconds: record(key, name,
                                                     1e-5 if name == winner else 1e-3)
    for call in range(4 * len(names)):   # blocks of one call
        out, ref = run(c, "allreduce", n, call)
        assert np.array_equal(out, ref)
    after = c.explain(n * world.size, np.float64)
    assert (after.chosen, after.rule) == (winner, "measured"), str(after)
    x = data(n * world.size, world.rank, 7)
    ref = np.empty_like(x)
    world.Allreduce(x, ref)
    ran = {}
    out = np.empty_like(x)
    c.Iallreduce(x, out).Wait()
    ran["Iallreduce"] = (c.recorder.calls()[-1]["chosen"], np.array_equal(out, ref))
    out = np.empty_like(x)
    req = c.Allreduce_init(x, out)
    for _ in range(2):
        out[:] = -1
        req.Start()
        req.Wait()
        ran["Allreduce_init"] = (c.recorder.calls()[-1]["chosen"], np.array_equal(out, ref))
    req.Free()
    grad = x.copy()
    buckets = bmlmpi.GradientBuckets([grad], comm=c, op=MPI.SUM, plan="layer")
    buckets.mark_ready(0)
    buckets.wait()
    ran["GradientBuckets"] = (c.recorder.calls()[-1]["chosen"], np.array_equal(grad, ref))
    assert ran == {form: (winner, True) for form in ran}, ran
    c.Free()


@pytest.mark.mpi
def test_explain_counts_the_exploration_in_blocks(own_table, monkeypatch):
    """While a signature explores, explain names the exploration's calls as the Tuner makes
    them: per candidate one warm-up call and three blocks (two calls each here); from 1 MiB
    no warm-up call, and each block's counted calls after three settling calls."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to explore")
    monkeypatch.setenv("BMLMPI_TUNING_BLOCK", "2")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    why = c.explain(64 * world.size, np.float64)
    names = [t.name for t in why.tuning.candidates]
    assert why.rule == "exploring"
    assert f"blocking call 1 of the {len(names) * 7} " in why.why, why.why
    assert "in blocks of 2 counted calls on" in why.why, why.why
    big = c.explain((1 << 20) // 8, np.float64)
    names = [t.name for t in big.tuning.candidates]
    assert f"blocking call 1 of the {len(names) * 3 * (3 + 2)} " in big.why, big.why
    assert "in blocks of 2 counted calls after 3 settling calls not counted" in big.why
    c.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_a_reproducible_signature_explores_and_commits_its_own_candidates(own_table,
                                                                          collective):
    """A reproducible ``auto`` call (the communicator's mode) is a signature of its own,
    priced on its words (a float64 value two int64 words): its blocking calls explore its
    candidates (injected times: one that is not the prior fastest), every rank commits to
    it, ``explain(..., reproducible=True)`` shows the commit, and the plain signature of the
    same arrays (``reproducible=False``) is still to explore. Every call, whichever
    candidate ran it, gives the bits of the one-rank reduction in the format."""
    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to choose between")
    c = bmlmpi.Communicator(world, timeout=60, reproducible=True)
    c.calibration = PRICES
    n = 256 * world.size    # the whole input's values; a reduce-scatter's block: 256
    why = c.explain(n, np.float64, collective=collective)
    assert (why.count, why.itemsize, why.rule) == (2 * n, 8, "exploring")
    names = [t.name for t in why.tuning.candidates]
    assert len(names) >= 2
    fast = next(name for name in reversed(names) if name != why.tuning.prior)
    tuner, ran = c.tuning.tuner, []
    record = tuner.record

    def injected(key, name, seconds):
        ran.append(name)
        record(key, name, 1e-5 if name == fast else 1e-3)
    tuner.record = injected
    rng = np.random.default_rng(world.rank)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    parts = world.allgather(x)
    agreed = np.max([rf.block_exponents(p) for p in parts], axis=0)
    want = rf.decode(sum(rf.encode(p, agreed) for p in parts), agreed, np.float64)
    per = n // world.size
    if collective == "reduce_scatter":
        want = want[world.rank * per:(world.rank + 1) * per]
    failures = []
    for call in range(4 * len(names) + 2):
        out = np.empty(per if collective == "reduce_scatter" else n)
        if collective == "allreduce":
            c.Allreduce(x, out)
        else:
            c.Reduce_scatter_block(x, out)
        if out.tobytes() != want.tobytes():
            failures.append(f"call {call} ({(ran or ['?'])[-1]}): not the reference bits")
    all_ranks_agree(world, failures)
    assert ran[:4 * len(names)] == names * 4   # every candidate explored, in rotation
    after = c.explain(n, np.float64, collective=collective, reproducible=True)
    assert (after.rule, after.chosen, after.tuning.state) == ("measured", fast, "committed")
    plain = c.explain(n, np.float64, collective=collective, reproducible=False)
    assert (plain.count, plain.itemsize, plain.rule) == (n, 8, "exploring")
    assert world.allgather(after.chosen) == [fast] * world.size
    c.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", *FAMILY])
def test_an_exploration_times_the_candidates_fast_paths(own_table, collective):
    """After each candidate's first call (checked: it agrees on the signature and opens the
    candidate's fast-path entry), the exploration's calls run the candidates' entries
    (AutoTuning.explore_fast), the calls the committed signature will make, not the checked
    path: at most one more checked call per candidate (a native one's first call may run
    before its signature was agreed), every result exact, the rotation as before."""
    import sys
    from pathlib import Path

    world = MPI.COMM_WORLD
    if world.size == 1:
        pytest.skip("one rank has nothing to explore")
    c = bmlmpi.Communicator(world, timeout=60)
    c.calibration = PRICES
    n = 8
    names = [t.name for t in c.explain(n * world.size, np.float64,
                                       collective=collective).tuning.candidates]
    package = str(Path(bmlmpi.__file__).parent)
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.add(frame.f_code.co_qualname)
    failures, fast, ran = [], [], []
    for call in range(4 * len(names)):
        seen.clear()
        sys.setprofile(profile)
        try:
            out, ref = run(c, collective, n, call)
        finally:
            sys.setprofile(None)
        if not np.array_equal(out, ref):
            failures.append(f"call {call}: {out} != {ref}")
        # (AutoTuning.explore: the checked path's step that times an exploring call)
        fast.append("FastPath.run" in seen and "AutoTuning.explore" not in seen)
        ran.append(c.recorder.calls()[-1]["chosen"])
    c_ = len(names)
    if ran != names * 4:
        failures.append(f"ran {ran}, want the rotation {names * 4}")
    if any(fast[:c_]):
        failures.append(f"a candidate's first call took a fast path: {fast[:c_]}")
    checked = [ran[i] for i in range(c_, 4 * c_) if not fast[i]]
    if any(checked.count(name) > 1 for name in names):
        failures.append(f"explored calls on the checked path: {checked}")
    if c.explain(n * world.size, np.float64, collective=collective).tuning.state != "committed":
        failures.append("not committed after the exploration")
    c.Free()
    all_ranks_agree(world, failures)
