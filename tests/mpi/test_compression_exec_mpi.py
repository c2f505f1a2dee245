"""The compressed allreduce's dense and 16-bit wire paths run through bmlmpi's one executor
(execute.Run) for every schedule: the same bits on every rank, within the wire's rounding of the
float32 sum of what the ranks sent, the steps seen by a RunObserver, tag blocks of calls in
flight kept apart. Position- and rank-dependent data."""

import numpy as np
import pytest
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute
from bmlmpi.compression import bf16, fp16, tdf, threshold
from bmlmpi.compression.engine import TAG_SPAN
from bmlmpi.kernels import wire_formats

ALGS = ["bml", "ring", "tree", "multitree"]


def data(n: int, rank: int, it: int) -> np.ndarray:
    """Values over several binades that depend on the position, the rank and the iteration."""
    i = np.arange(n)
    mant = ((i * 7 + rank * 3 + it * 5) % 13 - 6) + 0.371 * np.sin(i * 0.7 + rank)
    return (mant * 2.0 ** ((i + rank) % 9 - 4)).astype(np.float32)


@pytest.fixture(scope="module", params=ALGS)
def comm(request):
    c = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=request.param)
    yield c
    c.Free()


def same_on_every_rank(comm, out) -> bool:
    everyone = comm.comm.allgather(out.tobytes())
    return all(e == everyone[0] for e in everyone)


class StepCount(execute.RunObserver):
    def __init__(self):
        self.runs = set()
        self.steps = 0

    def complete(self, run, lane):
        self.runs.add(run)
        self.steps += 1


@pytest.mark.mpi
@pytest.mark.parametrize("mk", [fp16, bf16])
def test_wire_path_is_the_sum_within_its_rounding(comm, mk):
    c = mk()
    c.record, c.path = True, "dense"
    n = 2049
    out = np.empty(n, np.float32)
    seen = StepCount()
    with execute.observing(seen):
        for it in range(3):
            comm.Allreduce(data(n, comm.rank, it), out, MPI.SUM, compression=c)
            sent = np.stack(comm.comm.allgather(c.history[-1][2].astype(np.float64)))
            want = sent.sum(axis=0)           # what the ranks sent, summed exactly
            # every partial sum is rounded once per reduction step (at most N roundings of
            # a value at most N·M): the wire's rounding of the float32 sum
            m = np.abs(sent).max()
            tol = comm.size * comm.size * wire_formats.get(c.wire).unit * m
            assert np.abs(out.astype(np.float64) - want).max() <= tol
            assert same_on_every_rank(comm, out)
    assert set(c.calls) == {"wire"}
    if comm.size > 1:
        assert seen.runs and seen.steps >= len(seen.runs)
        run = next(iter(seen.runs))
        assert run.plan.comms == [comm.compression.comm]   # the private duplicate
        assert run.buf.dtype == np.uint16                    # the codes travel
        assert c.bytes_sent["wire"] == 3 * run.plan.sched.sent_elements() * 2
    else:
        assert not seen.runs


@pytest.mark.mpi
def test_dense_filtered_path_runs_the_executor(comm):
    c = threshold(0.5)
    c.record, c.path = True, "dense"
    n = 1500
    out = np.empty(n, np.float32)
    seen = StepCount()
    with execute.observing(seen):
        comm.Allreduce(data(n, comm.rank, 0), out, MPI.SUM, compression=c)
    sent = np.stack(comm.comm.allgather(c.history[-1][2]))
    want = np.zeros(n, np.float32)
    for row in sent:                  # float32 sums: equal within float32 association
        want += row
    assert np.allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(sent).max())
    assert same_on_every_rank(comm, out)
    assert set(c.calls) == {"dense"}
    if comm.size > 1:
        assert seen.runs
        assert all(r.buf.dtype == np.float32 and r.plan.comms == [comm.compression.comm]
                   for r in seen.runs)


@pytest.mark.mpi
def test_calls_in_flight_use_disjoint_tag_blocks(comm):
    makers = [fp16, lambda: tdf(0.5, 1.0, 0.5, "bf16"), lambda: threshold(0.25)]
    cs = [mk() for mk in makers]
    for c in cs:
        c.path = "dense"
    n = 777
    outs = [np.empty(n, np.float32) for _ in cs]
    seen = StepCount()
    with execute.observing(seen):
        reqs = [comm.Iallreduce(data(n, comm.rank, k), out, MPI.SUM, compression=c)
                for k, (c, out) in enumerate(zip(cs, outs, strict=True))]
        for r in reversed(reqs):
            r.Wait()
    for out in outs:
        assert same_on_every_rank(comm, out)
    if comm.size > 1:
        bases = sorted(r.tag_base for r in seen.runs)
        assert len(bases) == 3
        assert all(b - a >= TAG_SPAN for a, b in zip(bases, bases[1:], strict=False))


@pytest.mark.mpi
def test_random_filter_drops_the_same_positions_on_every_rank(comm):
    """A direct call's default key holds its buffer's address (different in every process):
    G-RP's draw must not depend on it."""
    c = tdf(1e9, 0.0, 0.5, None)   # G-SMP selects everything: G-RP alone decides
    c.record = True
    pad = np.empty(comm.rank * 13 + 1)   # shift the next allocation differently per rank
    out = np.empty(4096, np.float32)
    comm.Allreduce(data(4096, comm.rank, 0) + 1000, out, MPI.SUM, compression=c)
    kept = c.history[-1][2] != 0          # no input is 0: sent is 0 exactly where dropped
    everyone = comm.comm.allgather(np.packbits(kept).tobytes())
    assert all(e == everyone[0] for e in everyone)
    del pad
