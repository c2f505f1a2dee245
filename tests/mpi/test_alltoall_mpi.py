"""All-to-all: ``Alltoall`` and ``Alltoallv``, blocking, ``I…`` and persistent, in place and
not, with every algorithm (``pairwise``, ``bruck``, ``bcube``, ``native``, ``auto``), an
integer and a float dtype, equal blocks and uneven counts with zeros at displacements of
their own, against mpi4py's own ``Alltoall(v)`` on the same inputs (exact), with position-
and rank-dependent data; and the refusals (docs/contracts.md): counts that differ between
the two sides of a pair, a block past the buffer's end, dtypes that differ. One test per
algorithm loops over its cases (few test ids; beyond 6 ranks, where every rank count of
the suite is oversubscribed, one dtype and the uneven case not in place); ``shm`` and
``hierarchical`` (on pretended nodes of 2) one blocking ``Alltoallv`` and one ``Ialltoall``
in place each."""

import functools

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi
from bmlmpi.buffers import BufferSpecError

ALGORITHMS = ["pairwise", "bruck", "bcube", "native", "auto"]


@pytest.fixture(scope="module")
def c():
    """One communicator for the module's calls (building one costs more than the calls at
    the oversubscribed rank counts)."""
    communicator = bmlmpi.Communicator(MPI.COMM_WORLD)
    yield communicator
    communicator.Free()


def _dtypes(size: int) -> list:
    return [np.float64, np.int32] if size <= 6 else [np.float64]


def _values(n: int, rank: int, dtype, salt: int = 0) -> np.ndarray:
    """Position- and rank-dependent values, exact in every dtype used here."""
    return ((np.arange(n) * 7 + rank * 1009 + salt * 31) % 100003).astype(dtype)


def _pairs(size: int) -> np.ndarray:
    """Uneven pair counts with zeros: rank i sends ``m[i, j]`` elements to rank j (the
    diagonal included, some rows and columns empty)."""
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    m = (i * 3 + j * 5 + 1) % 4
    if size > 2:
        m[size - 1, :] = 0  # the last rank sends nothing
    return m


def _symmetric_pairs(size: int) -> np.ndarray:
    """Uneven symmetric counts with zeros (an in-place Alltoallv sends what it receives)."""
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    m = (np.minimum(i, j) * 3 + np.maximum(i, j) + 2) % 4
    m[0, 0] = 0
    if size > 2:
        m[0, size - 1] = m[size - 1, 0] = 0
    return m


def _spaced(counts, gap: int) -> list[int]:
    """Displacements with ``gap`` elements between blocks, in reverse rank order (MPI allows
    any order)."""
    displs, at = [0] * len(counts), 0
    for r in reversed(range(len(counts))):
        displs[r] = at
        at += counts[r] + gap
    return displs


def _check(failures: list, what: str, got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want):
        failures.append(f"{what}: got {got.tolist()[:12]} want {want.tolist()[:12]}")


def _run(c, form: str, algorithm: str, sendbuf, recvbuf, vector: bool, refill=None):
    """One call of ``form``: blocking (three times: a schedule's entry opens at the first, a
    native one at the second, once the signature was agreed; the last takes it where it
    opened), ``I`` or persistent (two starts); ``refill()`` before each (an in-place call's
    input restored)."""
    name = "Alltoallv" if vector else "Alltoall"
    refill = refill or (lambda: None)
    if form == "blocking":
        for _ in range(3):
            refill()
            getattr(c, name)(sendbuf, recvbuf, algorithm=algorithm)
    elif form == "I":
        refill()
        getattr(c, "I" + name.lower())(sendbuf, recvbuf, algorithm=algorithm).Wait()
    else:
        req = getattr(c, name + "_init")(sendbuf, recvbuf, algorithm=algorithm)
        for _ in range(2):
            refill()
            req.Start()
            req.Wait()
        req.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_matches_mpi4py(comm, c, algorithm):
    size, rank = comm.size, comm.rank
    failures: list = []
    for d, dtype in enumerate(_dtypes(size)):
        # every form with the first dtype, the blocking one with the second (the forms
        # share the call's preparation and its executor; the dtype only its byte counts)
        forms = ["blocking", "I", "persistent"] if d == 0 else ["blocking"]
        mpitype = MPI.INT32_T if np.dtype(dtype).kind == "i" else MPI.DOUBLE
        if size <= 6:
            # equal blocks, not in place and in place
            block = 3
            send = _values(block * size, rank, dtype)
            want = np.zeros_like(send)
            comm.Alltoall(send, want)
            for form in forms:
                got = np.full_like(send, -1)
                _run(c, form, algorithm, send, got, False)
                _check(failures, f"Alltoall {form} {dtype.__name__}", got, want)
                buf = send.copy()
                _run(c, form, algorithm, MPI.IN_PLACE, buf, False,
                     functools.partial(np.copyto, buf, send))
                _check(failures, f"Alltoall in place {form} {dtype.__name__}", buf, want)
        # uneven counts with zeros, blocks at displacements of their own (gaps, reversed)
        m = _pairs(size)
        scounts, rcounts = list(m[rank, :]), list(m[:, rank])
        sdispls, rdispls = _spaced(scounts, 1), _spaced(rcounts, 2)
        send = _values(sum(scounts) + size, rank, dtype)
        rlen = sum(rcounts) + 2 * size
        want = np.full(rlen, -1, dtype)
        comm.Alltoallv([send, (scounts, sdispls), mpitype],
                       [want, (rcounts, rdispls), mpitype])
        for form in forms:
            got = np.full(rlen, -1, dtype)
            _run(c, form, algorithm, [send, (scounts, sdispls), mpitype],
                 [got, (rcounts, rdispls), mpitype], True)
            _check(failures, f"Alltoallv {form} {dtype.__name__}", got, want)
        if size > 6:
            continue
        # in place: symmetric uneven counts with zeros at spaced displacements
        m = _symmetric_pairs(size)
        counts = list(m[rank, :])
        displs = _spaced(counts, 1)
        start = _values(sum(counts) + size, rank, dtype, salt=1)
        want = start.copy()
        comm.Alltoallv(MPI.IN_PLACE, [want, (counts, displs), mpitype])
        for form in forms:
            buf = start.copy()
            _run(c, form, algorithm, MPI.IN_PLACE, [buf, (counts, displs), mpitype], True,
                 functools.partial(np.copyto, buf, start))
            _check(failures, f"Alltoallv in place {form} {dtype.__name__}", buf, want)
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_the_module_level_drop_ins(comm):
    size, rank = comm.size, comm.rank
    send = _values(2 * size, rank, np.int64)
    want = np.zeros_like(send)
    comm.Alltoall(send, want)
    got = np.zeros_like(send)
    bmlmpi.Alltoall(send, got, comm=comm, algorithm="pairwise")
    assert np.array_equal(got, want)
    got[:] = 0
    bmlmpi.Ialltoall(send, got, comm=comm).Wait()
    assert np.array_equal(got, want)
    counts = [2] * size
    got[:] = 0
    req = bmlmpi.Alltoallv_init([send, counts], [got, counts], comm=comm, algorithm="bruck")
    req.Start()
    req.Wait()
    req.Free()
    assert np.array_equal(got, want)


def _refused_everywhere(comm, call, here, elsewhere=None) -> None:
    """``call(c)`` raises ``here`` on this rank (``elsewhere`` on the others: None, the same)
    on a fresh communicator, which is usable afterwards."""
    c = bmlmpi.Communicator(comm)
    try:
        with pytest.raises(here if elsewhere is None else elsewhere):
            call(c)
        send = np.arange(comm.size, dtype=np.int32)
        got = np.zeros_like(send)
        c.Alltoall(send, got, algorithm="pairwise")  # usable: every rank's next call runs
        want = np.zeros_like(send)
        comm.Alltoall(send, want)
        assert np.array_equal(got, want)
    finally:
        c.Free()


@pytest.mark.mpi
def test_refusals_on_every_rank(comm):
    size, rank = comm.size, comm.rank
    if size < 2 or size > 6:
        pytest.skip("a refusal between ranks needs 2 of them; the same code beyond 6")
    m = _pairs(size)
    scounts, rcounts = list(m[rank, :]), list(m[:, rank])

    def mismatched(c):
        # rank 1 expects one element more from rank 0 than rank 0 sends it
        mine = list(rcounts)
        if rank == 1:
            mine[0] += 1
        c.Alltoallv([np.zeros(sum(scounts)), scounts],
                    [np.zeros(sum(mine)), mine], algorithm="pairwise")
    _refused_everywhere(comm, mismatched, bmlmpi.ArgumentMismatch)

    def past_the_end(c):
        displs = _spaced(rcounts, 0)
        if rank == 0:
            displs[0] = sum(rcounts) + 5  # block 0 lands past the buffer's end
        c.Alltoallv([np.zeros(sum(scounts)), scounts],
                    [np.zeros(sum(rcounts)), (rcounts, displs)], algorithm="bruck")
    _refused_everywhere(comm, past_the_end,
                        BufferSpecError if rank == 0 else bmlmpi.RemoteArgumentError)

    def dtypes_differ(c):
        dtype = np.float32 if rank == 0 else np.int32
        c.Alltoall(np.zeros(size, dtype), np.zeros(size, dtype), algorithm="native")
    _refused_everywhere(comm, dtypes_differ, bmlmpi.ArgumentMismatch)

    def blocks_differ(c):
        n = 2 if rank == size - 1 else 1
        c.Alltoall(np.zeros(n * size), np.zeros(n * size), algorithm="bcube")
    _refused_everywhere(comm, blocks_differ, bmlmpi.ArgumentMismatch)

    def send_and_receive_differ(c):
        # locally wrong: the send and receive buffers differ in dtype on rank 0
        recv = np.zeros(size, np.float64 if rank == 0 else np.int32)
        c.Alltoall(np.zeros(size, np.int32), recv)
    _refused_everywhere(comm, send_and_receive_differ,
                        BufferSpecError if rank == 0 else bmlmpi.RemoteArgumentError)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_shared_memory_and_hierarchical_match_mpi4py(comm, c, algorithm, monkeypatch):
    """``shm`` through the node's shared-memory window (one node), ``hierarchical`` on
    pretended nodes of 2 consecutive ranks (inside, across, inside again; a communicator of
    its own): the uneven ``Alltoallv`` with zeros at spaced displacements blocking, the equal
    ``Alltoall`` in place non-blocking, against mpi4py's own on the same inputs."""
    if algorithm == "hierarchical":
        monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", "2")
        c = bmlmpi.Communicator(comm)
    try:
        size, rank = comm.size, comm.rank
        failures: list = []
        m = _pairs(size)
        scounts, rcounts = list(m[rank, :]), list(m[:, rank])
        sdispls, rdispls = _spaced(scounts, 1), _spaced(rcounts, 2)
        send = _values(sum(scounts) + size, rank, np.int64)
        rlen = sum(rcounts) + 2 * size
        want = np.full(rlen, -1, np.int64)
        comm.Alltoallv([send, (scounts, sdispls), MPI.INT64_T],
                       [want, (rcounts, rdispls), MPI.INT64_T])
        got = np.full(rlen, -1, np.int64)
        c.Alltoallv([send, (scounts, sdispls), MPI.INT64_T],
                    [got, (rcounts, rdispls), MPI.INT64_T], algorithm=algorithm)
        _check(failures, "Alltoallv", got, want)
        start = _values(3 * size, rank, np.float64, salt=2)
        want = np.zeros_like(start)
        comm.Alltoall(start, want)
        buf = start.copy()
        c.Ialltoall(MPI.IN_PLACE, buf, algorithm=algorithm).Wait()
        _check(failures, "Ialltoall in place", buf, want)
        all_ranks_agree(comm, failures)
    finally:
        if algorithm == "hierarchical":
            c.Free()


@pytest.mark.mpi
def test_a_repeated_alltoallv_sends_a_digest_not_the_counts(comm, c):
    """The control messages of ``Alltoallv`` (bmlmpi.pair_tables): the first call of a set of
    counts gathers them (one ``Allgather``); a repeat, blocking or ``I…``, sends one digest
    (an ``Allreduce`` of 2 int64) and no counts; a rank whose counts no longer match its
    peers' makes every rank gather again and be refused alike; counts seen before are
    agreed by digest again; every result against mpi4py's own. Counts of their own (the
    module's communicator has agreed others); 2 to 4 ranks (the same code beyond)."""
    size, rank = comm.size, comm.rank
    if not 2 <= size <= 4:
        pytest.skip("one rank gathers nothing; beyond 4 ranks the same code")
    sent: list = []

    def counting(name):
        call = getattr(c, name)

        def counted(*args, **kw):
            sent.append((name, np.asarray(args[0]).size))
            return call(*args, **kw)
        return counted
    for name in ("Allgather", "Allreduce"):
        setattr(c, name, counting(name))
    try:
        failures: list = []

        def exchange(m, form, mismatch=False):
            scounts, rcounts = list(m[rank, :]), list(m[:, rank])
            if mismatch and rank == 1:
                rcounts[0] += 1
            send = _values(sum(scounts), rank, np.int64)
            got = np.full(sum(rcounts), -1, np.int64)
            args = ([send, scounts], [got, rcounts])
            if form == "I":
                c.Ialltoallv(*args).Wait()
            else:
                c.Alltoallv(*args)
            want = np.full(sum(rcounts), -1, np.int64)
            comm.Alltoallv([send, scounts], [want, rcounts])
            _check(failures, f"Alltoallv {form}", got, want)

        m = _pairs(size) + 2
        for form in ("blocking", "blocking", "I", "blocking"):
            exchange(m, form)
        gathers = [n for what, n in sent if what == "Allgather"]
        digests = [n for what, n in sent if what == "Allreduce"]
        assert gathers == [2 * size] and digests == [2] * 4, sent
        with pytest.raises(bmlmpi.ArgumentMismatch):
            exchange(m, "blocking", mismatch=True)
        exchange(m, "blocking")          # the counts seen before: a digest
        exchange(m + 1, "I")             # new counts: gathered
        assert [w for w, _ in sent[5:]] == ["Allreduce", "Allgather", "Allreduce",
                                            "Allreduce", "Allgather"], [w for w, _ in sent]
        all_ranks_agree(comm, failures)
    finally:
        del c.Allgather, c.Allreduce


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "pairwise"])
def test_a_repeated_blocking_alltoallv_takes_its_fast_path(comm, c, algorithm):
    """A blocking ``Alltoallv`` whose specs (buffers' shapes and dtypes, counts,
    displacements, datatype) and agreed pair counts ran before skips the checked path: its
    counts are agreed by digest, then its signature's fast-path entry runs (mpi4py's
    ``Alltoallv`` under the watchdog, or the cached plan driven in the calling thread), no
    spec read again, nothing of the family engine. A signature whose counts change is not
    taken for the old one, on the ranks whose counts changed and on those whose own did not
    (the last rank changes the block it keeps, and at N >= 3 ranks 1 and 2 what they send
    each other: rank 0's specs stay the same, its entry's key then differs by the agreed
    pair counts alone; a plan compiled for the old pair matrix would misplace blocks or
    wait for messages that never come). Buffers of one length throughout, so only the
    counts tell the signatures apart; every result against mpi4py's own."""
    import sys
    from pathlib import Path

    size, rank = comm.size, comm.rank
    failures: list = []
    package = str(Path(bmlmpi.__file__).parent)
    width = 4 * size + 4   # room for any counts below
    seen: dict[str, int] = {}

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            name = frame.f_code.co_qualname
            seen[name] = seen.get(name, 0) + 1

    def exchange(m, salt, profiled=False):
        scounts, rcounts = list(m[rank, :]), list(m[:, rank])
        send = _values(width, rank, np.int64, salt)
        got = np.full(width, -1, np.int64)
        want = np.full(width, -1, np.int64)
        comm.Alltoallv([send, scounts, MPI.INT64_T], [want, rcounts, MPI.INT64_T])
        seen.clear()
        if profiled:
            sys.setprofile(watch)
        try:
            c.Alltoallv([send, scounts, MPI.INT64_T], [got, rcounts, MPI.INT64_T],
                        algorithm=algorithm)
        finally:
            sys.setprofile(None)
        _check(failures, f"Alltoallv {algorithm} salt {salt}: {m.tolist()}", got, want)

    ran = "FastPath.native" if algorithm == "native" else "FastPath.scheduled"

    def fast(what):
        checked = [n for n in seen if n.startswith("FamilyEngine.") or n == "_alltoallv_spec"]
        if seen.get(ran) != 1 or checked:
            failures.append(f"{what} ran {sorted(seen)}: want {ran} once and no checked "
                            f"path")

    m = _pairs(size) + 1
    exchange(m, 0)                    # checked: gathers the counts, agrees the signature
    exchange(m, 1)                    # checked (native: MPI's blocking call), opens the entry
    exchange(m, 2, profiled=True)     # its entry
    fast("the repeated call")
    other = m.copy()
    other[size - 1, size - 1] += 2
    if size >= 3:
        other[1, 2], other[2, 1] = 0, other[2, 1] + 3
    for salt in (3, 4, 5):
        exchange(other, salt)
    exchange(m, 6)                    # the first counts again: gathered (rank 0 kept others)
    exchange(m, 7, profiled=True)     # agreed by digest: their entry again
    fast("the first counts again")
    for salt in (8, 9, 10):   # every rank's counts change
        exchange(np.where(np.eye(size, dtype=bool), 0, m + 1), salt)
    all_ranks_agree(comm, failures)
