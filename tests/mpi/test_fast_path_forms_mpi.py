"""The fast paths refuse nothing the checked path accepted, and say nothing different: every
collective, every algorithm, every argument form the checked first call takes (a root
receive buffer larger than the data, in place with a larger receive buffer, structured and
byte-string dtypes, buffer specs) gives the same exact result on calls 3 and 4 (the fast path's)
as on calls 1 and 2, with data that depends on the position, the rank and the call.

Also what a call meets after ``Free()`` (:class:`bmlmpi.CommunicatorFreed` from every form,
persistent requests made before included, never a crash) and a second thread entering any
form of call while one is inside (``RuntimeError``, nothing sent, the communicator usable
after): docs/contracts.md, "Teardown, threads, and smaller rules"."""

import threading
import time

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi

# Sized for the test command: every collective, algorithm and form at up to 4 ranks (the rank
# counts these defects were found at, and the smaller); at 5 to 12 oversubscribed ranks the
# same code paths run in the rest of tests/mpi.
pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.size > 4,
                                reason="sized for the test command: runs at 1-4 ranks")

CALLS = 4   # the first calls are checked; from the third on, the fast path where one opens
N = 7       # elements per rank: odd, so that no block size divides evenly by accident
STRUCT = np.dtype([("a", "<i4"), ("b", "<f8")])   # packed: 12 bytes, no float alignment


def values(rank: int, call: int, n: int, dtype=np.float64) -> np.ndarray:
    """Position-, rank- and call-dependent data (exact in every dtype used here)."""
    i = np.arange(n)
    v = (i * 7 + rank * 3 + call * 5) % 11 + 1
    dt = np.dtype(dtype)
    if dt == STRUCT:
        out = np.empty(n, STRUCT)
        out["a"] = v * 1000 + rank
        out["b"] = i * 0.5 - rank - call
        return out
    if dt.kind == "S":
        return np.array([f"{rank}:{call}:{x}".encode()[:dt.itemsize] for x in i], dt)
    return v.astype(dt)


def reduced(size: int, call: int, n: int, dtype=np.float64) -> np.ndarray:
    return sum(values(r, call, n, dtype) for r in range(size)).astype(dtype)


def counts_of(size: int) -> list[int]:
    return [1 + r % 3 for r in range(size)]   # uneven blocks, never empty


# -- one function per (collective, form): a call's failures (empty: exact) ---------------------
def allreduce_plain(c, call, alg):
    size, rank = c.size, c.rank
    out = np.full(N, -1.0)
    c.Allreduce(values(rank, call, N), out, algorithm=alg)
    return out, reduced(size, call, N)


def allreduce_in_place(c, call, alg):
    buf = values(c.rank, call, N)
    c.Allreduce(MPI.IN_PLACE, buf, algorithm=alg)
    return buf, reduced(c.size, call, N)


def allreduce_larger_recv(c, call, alg):
    out = np.full(N + 3, -1.0)
    c.Allreduce(values(c.rank, call, N), out, algorithm=alg)
    return out, np.concatenate([reduced(c.size, call, N), np.full(3, -1.0)])


def allreduce_spec(c, call, alg):
    a = values(c.rank, call, N, np.int32)
    out = np.full(N, -1, np.int32)
    c.Allreduce([a, 4, MPI.INT], [out, 4, MPI.INT], algorithm=alg)
    want = out.copy()
    want[:4] = reduced(c.size, call, N, np.int32)[:4]
    want[4:] = -1
    return out, want


def rsb_plain(c, call, alg):
    size, rank = c.size, c.rank
    out = np.full(2, -1.0)
    c.Reduce_scatter_block(values(rank, call, 2 * size), out, algorithm=alg)
    return out, reduced(size, call, 2 * size)[2 * rank:2 * rank + 2]


def rsb_in_place(c, call, alg):
    size, rank = c.size, c.rank
    buf = values(rank, call, 2 * size)
    c.Reduce_scatter_block(MPI.IN_PLACE, buf, algorithm=alg)
    return buf[:2], reduced(size, call, 2 * size)[2 * rank:2 * rank + 2]


def rs_counts(c, call, alg):
    size, rank = c.size, c.rank
    counts = counts_of(size)
    at = sum(counts[:rank])
    out = np.full(counts[rank], -1.0)
    c.Reduce_scatter(values(rank, call, sum(counts)), out, counts, algorithm=alg)
    return out, reduced(size, call, sum(counts))[at:at + counts[rank]]


def rs_in_place_larger(c, call, alg):
    size, rank = c.size, c.rank
    counts = counts_of(size)
    total = sum(counts)
    buf = np.concatenate([values(rank, call, total), np.full(3, -7.0)])
    c.Reduce_scatter(MPI.IN_PLACE, buf, counts, algorithm=alg)
    # this rank's block lands at the start; the elements past all blocks stay as they were
    at = sum(counts[:rank])
    got = np.concatenate([buf[:counts[rank]], buf[total:]])
    return got, np.concatenate([reduced(size, call, total)[at:at + counts[rank]],
                                np.full(3, -7.0)])


def _gathered(size, call, n, dtype):
    return np.concatenate([values(r, call, n, dtype) for r in range(size)])


def allgather_of(dtype):
    def form(c, call, alg):
        size, rank = c.size, c.rank
        out = np.zeros(size * 3, dtype)
        c.Allgather(values(rank, call, 3, dtype), out, algorithm=alg)
        return out, _gathered(size, call, 3, dtype)
    return form


def allgather_in_place(c, call, alg):
    size, rank = c.size, c.rank
    out = np.zeros(size * 3, np.int64)
    out[3 * rank:3 * rank + 3] = values(rank, call, 3, np.int64)
    c.Allgather(MPI.IN_PLACE, out, algorithm=alg)
    return out, _gathered(size, call, 3, np.int64)


def allgather_spec(c, call, alg):
    size, rank = c.size, c.rank
    out = np.zeros(size * 3, np.int32)
    c.Allgather([values(rank, call, 3, np.int32), MPI.INT], [out, MPI.INT], algorithm=alg)
    return out, _gathered(size, call, 3, np.int32)


def allgatherv_counts(c, call, alg):
    size, rank = c.size, c.rank
    counts = counts_of(size)
    out = np.zeros(sum(counts), STRUCT)
    c.Allgatherv(values(rank, call, counts[rank], STRUCT), [out, counts], algorithm=alg)
    return out, np.concatenate([values(r, call, counts[r], STRUCT) for r in range(size)])


def reduce_of(larger: bool, in_place: bool = False):
    def form(c, call, alg):
        size, rank = c.size, c.rank
        root = size - 1
        send = values(rank, call, N)
        extra = 2 if larger else 0
        out = np.full(N + extra, -1.0) if rank == root else None
        if in_place and rank == root:
            out[:N] = send
            send = MPI.IN_PLACE
        c.Reduce(send, out, MPI.SUM, root, algorithm=alg)
        if rank != root:
            return np.zeros(0), np.zeros(0)
        return out, np.concatenate([reduced(size, call, N), np.full(extra, -1.0)])
    return form


def bcast_of(dtype):
    def form(c, call, alg):
        size, rank = c.size, c.rank
        root = size - 1
        buf = values(rank, call, N, dtype) if rank == root else np.zeros(N, dtype)
        c.Bcast(buf, root, algorithm=alg)
        return buf, values(root, call, N, dtype)
    return form


FORMS = {
    "allreduce": {"plain": allreduce_plain, "in place": allreduce_in_place,
                  "larger recvbuf": allreduce_larger_recv, "spec": allreduce_spec},
    "reduce_scatter": {"block": rsb_plain, "block in place": rsb_in_place,
                       "counts": rs_counts, "in place, larger recvbuf": rs_in_place_larger},
    "allgather": {"int32": allgather_of(np.int32), "structured": allgather_of(STRUCT),
                  "bytes": allgather_of(np.dtype("S6")), "in place": allgather_in_place,
                  "spec": allgather_spec, "v structured": allgatherv_counts},
    "reduce": {"plain": reduce_of(False), "larger root recvbuf": reduce_of(True),
               "in place": reduce_of(False, True)},
    "bcast": {"float64": bcast_of(np.float64), "structured": bcast_of(STRUCT),
              "bytes": bcast_of(np.dtype("S6"))},
}


def run_forms(comm, c, collective, algorithms):
    failures = []
    for alg in algorithms:
        for name, form in FORMS[collective].items():
            for call in range(CALLS):
                try:
                    got, want = form(c, call, alg)
                except Exception as exc:  # noqa: BLE001 - every rank's outcome is compared
                    failures.append(f"{alg} {name} call {call}: {type(exc).__name__}: {exc}")
                    break
                if got.tobytes() != want.tobytes():
                    failures.append(f"{alg} {name} call {call}: {got} != {want}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("collective", list(FORMS))
def test_every_form_is_exact_on_the_fast_path(comm, collective):
    """Each algorithm named per call, on a plain communicator."""
    c = bmlmpi.Communicator(comm)
    try:
        run_forms(comm, c, collective, (bmlmpi.algorithms() if collective == "allreduce"
                                        else bmlmpi.algorithms(collective)))
    finally:
        c.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "auto", "ring"])
@pytest.mark.parametrize("collective", list(FORMS))
def test_every_form_is_exact_with_the_communicators_algorithm(comm, algorithm, collective):
    """The communicator's own algorithm (``algorithm=None`` per call): a ``ring``
    communicator's ``Reduce`` and ``Bcast`` fall back to ``auto``."""
    c = bmlmpi.Communicator(comm, algorithm=algorithm)
    try:
        run_forms(comm, c, collective, [None])
    finally:
        c.Free()


def _requests(c):
    """The forms the blocking fast path refused or got wrong, for their ``I…`` and
    persistent calls: name -> (fill(call): the inputs of that call written in place,
    spell() -> (method, arguments), result(call) -> (got, want))."""
    size, rank = c.size, c.rank
    root = size - 1
    counts = counts_of(size)
    total = sum(counts)
    at = sum(counts[:rank])
    send = np.zeros(N)
    rbig = np.full(N + 2, -1.0)
    inplace = np.zeros(total + 3)
    gathered = np.zeros(3 * size, STRUCT)
    mine = np.zeros(3, STRUCT)
    bbuf = np.zeros(N, np.dtype("S6"))
    cases = {
        "Reduce, larger root recvbuf": (
            lambda call: send.__setitem__(slice(None), values(rank, call, N)),
            lambda: ("Reduce", (send, rbig if rank == root else None, MPI.SUM, root)),
            lambda call: (rbig, np.concatenate([reduced(size, call, N), np.full(2, -1.0)]))
            if rank == root else (np.zeros(0), np.zeros(0))),
        "Reduce_scatter in place, larger recvbuf": (
            lambda call: inplace.__setitem__(slice(None), np.concatenate(
                [values(rank, call, total), np.full(3, -7.0)])),
            lambda: ("Reduce_scatter", (MPI.IN_PLACE, inplace, counts, MPI.SUM)),
            lambda call: (np.concatenate([inplace[:counts[rank]], inplace[total:]]),
                          np.concatenate([reduced(size, call, total)[at:at + counts[rank]],
                                          np.full(3, -7.0)]))),
        "Allgather structured": (
            lambda call: mine.__setitem__(slice(None), values(rank, call, 3, STRUCT)),
            lambda: ("Allgather", (mine, gathered)),
            lambda call: (gathered, _gathered(size, call, 3, STRUCT))),
        "Bcast bytes": (
            lambda call: bbuf.__setitem__(slice(None), values(rank, call, N, bbuf.dtype)
                                          if rank == root else np.zeros(N, bbuf.dtype)),
            lambda: ("Bcast", (bbuf, root)),
            lambda call: (bbuf, values(root, call, N, bbuf.dtype))),
    }
    return cases


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["I", "init"])
@pytest.mark.parametrize("algorithm", ["native", "auto", "ring"])
def test_the_refused_forms_as_requests(comm, algorithm, mode):
    """The same forms non-blocking (``mode`` "I": a request per call) and persistent
    ("init": one request, started once per call); a ``ring`` communicator's ``Reduce`` and
    ``Bcast`` fall back to ``auto``."""
    c = bmlmpi.Communicator(comm, algorithm=algorithm)
    failures = []
    try:
        for name, (fill, spell, result) in _requests(c).items():
            method, args = spell()
            req = None
            for call in range(CALLS):
                fill(call)
                try:
                    if mode == "I":
                        getattr(c, "I" + method.lower())(*args).Wait()
                    else:
                        if req is None:
                            req = getattr(c, method + "_init")(*args)
                        req.Start()
                        req.Wait()
                except Exception as exc:  # noqa: BLE001 - every rank's outcome is compared
                    failures.append(f"{name} call {call}: {type(exc).__name__}: {exc}")
                    break
                got, want = result(call)
                if got.tobytes() != want.tobytes():
                    failures.append(f"{name} call {call}: {got} != {want}")
            if req is not None:
                req.Free()
        all_ranks_agree(comm, failures)
    finally:
        c.Free()


# -- after Free() ------------------------------------------------------------------------------
def _every_call(c, reqs):
    """Every public call on ``c``, each a thunk (name, call)."""
    size = c.size
    x, y = np.ones(4), np.zeros(4)
    big, part = np.ones(2 * size), np.zeros(2)
    gathered = np.zeros(4 * size)
    calls = [
        ("Allreduce", lambda: c.Allreduce(x, y)),
        ("Allreduce in place", lambda: c.Allreduce(MPI.IN_PLACE, y)),
        ("Allreduce fp16", lambda: c.Allreduce(x, y, compression="fp16")),
        ("Iallreduce", lambda: c.Iallreduce(x, y)),
        ("allreduce", lambda: c.allreduce(x)),
        ("Allreduce_init", lambda: c.Allreduce_init(x, y)),
        ("Reduce_scatter_block", lambda: c.Reduce_scatter_block(big, part)),
        ("Ireduce_scatter_block", lambda: c.Ireduce_scatter_block(big, part)),
        ("Reduce_scatter_block_init", lambda: c.Reduce_scatter_block_init(big, part)),
        ("Reduce_scatter", lambda: c.Reduce_scatter(big, part, [2] * size)),
        ("Ireduce_scatter", lambda: c.Ireduce_scatter(big, part, [2] * size)),
        ("Reduce_scatter_init", lambda: c.Reduce_scatter_init(big, part, [2] * size)),
        ("Allgather", lambda: c.Allgather(x, gathered)),
        ("Iallgather", lambda: c.Iallgather(x, gathered)),
        ("Allgather_init", lambda: c.Allgather_init(x, gathered)),
        ("Allgatherv", lambda: c.Allgatherv(x, gathered)),
        ("Iallgatherv", lambda: c.Iallgatherv(x, gathered)),
        ("Allgatherv_init", lambda: c.Allgatherv_init(x, gathered)),
        ("Reduce", lambda: c.Reduce(x, y, MPI.SUM, 0)),
        ("Ireduce", lambda: c.Ireduce(x, y, MPI.SUM, 0)),
        ("Reduce_init", lambda: c.Reduce_init(x, y, MPI.SUM, 0)),
        ("Bcast", lambda: c.Bcast(y, 0)),
        ("Ibcast", lambda: c.Ibcast(y, 0)),
        ("Bcast_init", lambda: c.Bcast_init(y, 0)),
        ("explain", lambda: c.explain(4, np.float64)),
    ]
    calls += [(f"Start of {name}", req.Start) for name, req in reqs]
    return calls


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "auto", "shm", "ring"])
def test_a_freed_communicator_refuses_every_call(comm, algorithm):
    """Every form, fast paths opened and persistent requests started before ``Free()``:
    :class:`bmlmpi.CommunicatorFreed` on every rank, nothing sent, no crash; a second
    ``Free()`` does nothing."""
    c = bmlmpi.Communicator(comm, algorithm=algorithm)
    size = c.size
    x, y = np.arange(4.0) + c.rank, np.zeros(4)
    big, part, gathered = np.arange(2.0 * size), np.zeros(2), np.zeros(4 * size)
    reqs = [("Allreduce_init", c.Allreduce_init(x, y)),
            ("Reduce_scatter_block_init", c.Reduce_scatter_block_init(big, part)),
            ("Allgather_init", c.Allgather_init(x, gathered)),
            ("Reduce_init", c.Reduce_init(x, y, MPI.SUM, 0)),
            ("Bcast_init", c.Bcast_init(y, 0))]
    for _ in range(3):   # the fast paths open
        for _, req in reqs:
            req.Start()
            req.Wait()
        c.Allreduce(x, y)
        c.Reduce(x, y, MPI.SUM, 0)
        c.Allgather(x, gathered)
        c.Bcast(y, 0)
    c.Free()
    failures = []
    for name, thunk in _every_call(c, reqs):
        try:
            thunk()
            failures.append(f"{name} after Free() was not refused")
        except bmlmpi.CommunicatorFreed as exc:
            if not isinstance(exc, RuntimeError) or "was freed" not in str(exc):
                failures.append(f"{name}: {exc!r}")
        except Exception as exc:  # noqa: BLE001 - any other outcome is the failure
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    try:
        c.Free()
    except Exception as exc:  # noqa: BLE001
        failures.append(f"a second Free(): {type(exc).__name__}: {exc}")
    for _, req in reqs:
        req.Free()
    all_ranks_agree(comm, failures)


# -- two threads -------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("inside", ["Allreduce", "Allgather"])
@pytest.mark.parametrize("algorithm", ["native", "auto", "ring"])
def test_a_second_thread_is_refused_by_every_form(comm, algorithm, inside):
    """While one thread is inside a call (the checked first call of a signature, waiting for
    the other ranks), every form of call from another thread raises ``RuntimeError`` before
    anything is sent; afterwards every rank's calls pair as before, with exact results."""
    if comm.size < 2:
        pytest.skip("needs two ranks (a call that waits)")
    c = bmlmpi.Communicator(comm, algorithm=algorithm)
    size, rank = c.size, c.rank
    x, y = np.arange(4.0) + rank, np.zeros(4)
    gathered = np.zeros(4 * size)
    req = c.Allgather_init(x, gathered)
    first = {"Allreduce": lambda: c.Allreduce(x * 2, np.zeros(4)),
             "Allgather": lambda: c.Allgather(x[:2], np.zeros(2 * size))}[inside]
    failures = []
    if rank == 0:
        t = threading.Thread(target=first)
        t.start()
        end = time.monotonic() + 30
        while c.family.gate.owner is None and time.monotonic() < end:
            time.sleep(1e-3)
        local = ("explain", "choose")   # no communication: no call to refuse
        for name, thunk in [*_every_call(c, [("Allgather_init", req)]), ("Free", c.Free)]:
            if name in local:
                continue
            try:
                thunk()
                failures.append(f"{name} from a second thread was not refused")
            except RuntimeError as exc:
                if "two threads" not in str(exc):
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
        comm.Barrier()   # the others join the first thread's call now
        t.join(60)
        if t.is_alive():
            failures.append("the first thread's call did not end")
    else:
        comm.Barrier()
        first()
    # every rank's next calls pair as before
    c.Allreduce(x, y)
    if not np.array_equal(y, np.arange(4.0) * size + size * (size - 1) / 2):
        failures.append(f"Allreduce after: {y}")
    r = c.Iallgather(x, gathered)
    r.Wait()
    want = np.concatenate([np.arange(4.0) + q for q in range(size)])
    if not np.array_equal(gathered, want):
        failures.append(f"Iallgather after: {gathered}")
    gathered[:] = 0
    req.Start()
    req.Wait()
    if not np.array_equal(gathered, want):
        failures.append(f"persistent Allgather after: {gathered}")
    req.Free()
    c.Free()
    all_ranks_agree(comm, failures)
