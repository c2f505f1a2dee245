"""bmlmpi against mpi4py 4.1: every Allreduce/Iallreduce call mpi4py accepts gives mpi4py's
exact result, or raises a documented error on every rank (docs/api.md, "Conformance with mpi4py").

Each case runs the same inputs through ``comm.Allreduce`` (mpi4py, the MPI library's answer)
and through bmlmpi, and checks both against values derived from the communicator's size, as
mpi4py's own tests do. Inputs depend on the rank and the element's position, so a misplaced
range or a missing rank changes the result.
"""

import array
import time

import numpy as np
import pytest
from conftest import all_ranks_agree
from dlpack_exporters import CtypesDLPack, DLPack1, LegacyDLPack
from mpi4py import MPI
from mpi4py.util import dtlib

import bmlmpi

OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
ALGORITHMS = ["auto", "bml", "ring", "tree"]
N_ELEMS = 13

# MPI datatypes mpi4py maps to a numpy dtype whose arithmetic is not what MPI does with them
# (logical and character types, packed bytes, Fortran quadruple precision, which numpy's
# float128 is not on x86): bmlmpi refuses them (docs/api.md, "Conformance with mpi4py").
REFUSED_DATATYPES = ("LOGICAL", "LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8", "F_BOOL",
                     "BOOL", "C_BOOL", "CXX_BOOL", "CHAR", "CHARACTER", "WCHAR", "PACKED", "BYTE",
                     "REAL16", "COMPLEX32")


def _numeric_datatypes():
    """Every predefined MPI datatype mpi4py maps to a numeric (integer/float/complex) dtype."""
    out = []
    for name in sorted(dir(MPI)):
        dt = getattr(MPI, name)
        if not isinstance(dt, MPI.Datatype) or dt == MPI.DATATYPE_NULL:
            continue
        try:
            np_dtype = dtlib.to_numpy_dtype(dt)
        except (ValueError, KeyError):
            continue
        if dt.Get_size() == 0:  # declared by the MPI library but not built (e.g. COMPLEX32)
            continue
        if np_dtype.kind in "iufc" or name in REFUSED_DATATYPES:
            out.append((name, dt, np_dtype))
    return out


DATATYPES = _numeric_datatypes()


def values(n: int, rank: int, dtype, opname: str) -> np.ndarray:
    """Rank- and position-dependent input whose reduction is exact in every dtype at N <= 12."""
    i = np.arange(n)
    if opname == "prod":
        vals = np.where((i + rank) % 4 == 0, 2, 1)    # at most 3 factors of 2 per element
    else:
        vals = (i * 7 + rank * 3) % 11
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return (vals % 2).astype(dtype)
    if dtype.kind in "SU":
        return vals.astype(np.uint8).view("S1").astype(dtype)
    out = vals.astype(dtype)
    if dtype.kind == "c" and opname != "prod":
        out = out + 1j * ((i + 2 * rank) % 5).astype(dtype)
    return out


def expected(n: int, ranks, dtype, opname: str) -> np.ndarray:
    """The exact result over ``ranks``, folded in Python integers/complex (no dtype rounding)."""
    cols = [values(n, r, np.complex128, opname) for r in ranks]
    if opname == "sum":
        res = sum(cols)
    elif opname == "prod":
        res = np.prod(cols, axis=0)
    elif opname == "min":
        res = np.min(np.real(cols), axis=0)
    else:
        res = np.max(np.real(cols), axis=0)
    if np.dtype(dtype).kind != "c":
        res = np.real(res)
    return np.asarray(res).astype(dtype)


def same(got: np.ndarray, ref: np.ndarray) -> bool:
    """Bit-identical, except long double, whose 80-bit values sit in 16 bytes with padding."""
    if got.dtype in (np.longdouble, np.clongdouble):
        return got.shape == ref.shape and bool(np.array_equal(got, ref))
    return got.tobytes() == ref.tobytes()


def outcome(fn, *args, **kwargs):
    """(fn's result, None) or (None, "ErrorType: message")."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - the comparison records which error
        return None, f"{type(exc).__name__}: {exc}"


# -- every predefined numeric datatype, every op, in place and not -----------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("opname", list(OPS))
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_every_datatype_and_op(comm, opname, in_place):
    op = OPS[opname]
    n = N_ELEMS
    failures = []
    ranks = range(comm.size)
    # one algorithm per (datatype, op), rotating, so that over the four ops every datatype
    # meets every algorithm (the launcher runs this file at 1-4 ranks: keep it seconds)
    for i, (name, dt, np_dtype) in enumerate(DATATYPES):
        algorithm = ALGORITHMS[(i + list(OPS).index(opname)) % len(ALGORITHMS)]
        x = values(n, comm.rank, np_dtype, opname)
        send = MPI.IN_PLACE if in_place else [x, dt]
        ref = x.copy() if in_place else np.zeros_like(x)
        _, ref_err = outcome(comm.Allreduce, send, [ref, dt], op)
        got = x.copy() if in_place else np.zeros_like(x)
        _, err = outcome(bmlmpi.Allreduce, send, [got, dt], op, comm=comm, algorithm=algorithm)
        what = f"{name} {opname} {algorithm}"
        if name in REFUSED_DATATYPES:
            if err is None:
                failures.append(f"{what}: documented as refused but accepted")
            continue
        if ref_err is not None:
            if err is None:
                failures.append(f"{what}: mpi4py refused ({ref_err}) but bmlmpi accepted")
            continue
        if err is not None:
            failures.append(f"{what}: mpi4py accepted but bmlmpi raised {err}")
            continue
        if not same(got, ref):
            failures.append(f"{what}: differs from mpi4py: {got} vs {ref}")
        if not np.array_equal(got, expected(n, ranks, np_dtype, opname)):
            failures.append(f"{what}: {got} is not the expected reduction")
    all_ranks_agree(comm, failures)


# -- every buffer-spec form ---------------------------------------------------------------------

def _spec_forms(dtype, mpi_dtype, n):
    """(label, make) pairs: make(values) returns (spec, whole) where whole() is the spec's
    entire buffer as a flat array of ``dtype`` in memory order, with the ``n`` values (or the
    result) at ``[pad:pad + n]`` and the padding (9s) around them untouched by a correct call."""
    dtype = np.dtype(dtype)

    def padded(v, before, after):
        return np.concatenate([np.full(before, 9, dtype), v, np.full(after, 9, dtype)])

    def plain(v):
        a = v.copy()
        return a, lambda: a

    def typed(v):
        a = v.copy()
        return [a, mpi_dtype], lambda: a

    def typechar(v):
        a = v.copy()
        return [a, dtype.char], lambda: a

    def counted(v):
        a = padded(v, 0, 3)
        return [a, n, mpi_dtype], lambda: a

    def displaced(v):
        a = padded(v, PAD, 1)
        return [a, (n, PAD), mpi_dtype], lambda: a

    def four_items(v):
        a = padded(v, PAD, 0)
        return [a, n, PAD, mpi_dtype], lambda: a

    def raw_bytes(v):
        b = bytearray(v.tobytes())
        return [b, mpi_dtype], lambda: np.frombuffer(b, dtype)

    def memview(v):
        b = bytearray(v.tobytes())
        return [memoryview(b), mpi_dtype], lambda: np.frombuffer(b, dtype)

    def arr_array(v):
        a = array.array(dtype.char, v.tolist())
        return a, lambda: np.frombuffer(a, dtype)

    def two_d(v):
        a = v.reshape(1, n).copy()
        return a, lambda: a.reshape(-1)

    def fortran(v):
        # 2 x 7 in Fortran order: memory holds the n values then one pad element
        a = np.asfortranarray(padded(v, 0, 1).reshape(2, -1, order="F"))
        return [a, n, mpi_dtype], lambda: a.reshape(-1, order="F")

    def legacy(v):
        a = v.copy()
        return LegacyDLPack(a), lambda: a

    def dlpack1(v):
        a = v.copy()
        return DLPack1(a), lambda: a

    forms = [("array", plain), ("[buf, MPI type]", typed), ("[buf, typechar]", typechar),
             ("[buf, count, type]", counted), ("[buf, (count, displ), type]", displaced),
             ("[buf, count, displ, type]", four_items), ("bytearray", raw_bytes),
             ("memoryview", memview), ("array.array", arr_array), ("2-D", two_d),
             ("Fortran-ordered", fortran), ("legacy DLPack", legacy), ("DLPack 1.0", dlpack1)]
    offset = {"[buf, (count, displ), type]": PAD, "[buf, count, displ, type]": PAD}
    return [(label, make, offset.get(label, 0)) for label, make in forms]


PAD = 2


@pytest.mark.mpi
@pytest.mark.parametrize("dtype,mpi_dtype", [(np.float64, MPI.DOUBLE), (np.int32, MPI.INT)],
                         ids=["double", "int"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_every_buffer_spec_form(comm, dtype, mpi_dtype, in_place):
    n = N_ELEMS
    forms = _spec_forms(dtype, mpi_dtype, n)
    x = values(n, comm.rank, dtype, "sum")
    want = expected(n, range(comm.size), dtype, "sum")
    failures = []
    for i, (send_label, make_send, _) in enumerate(forms):
        for j, (recv_label, make_recv, at) in enumerate(forms):
            # every form against itself (the only pairs in place), against a plain array both
            # ways, and against its neighbour in the list
            paired = i == j or (not in_place and (0 in (i, j) or j == (i + 1) % len(forms)))
            if not paired:
                continue
            results = []
            for run in ("mpi4py", "bmlmpi"):
                src, _ = make_send(x)
                dst, whole = make_recv(x if in_place else np.zeros(n, dtype))
                sbuf = MPI.IN_PLACE if in_place else src
                if run == "mpi4py":
                    _, err = outcome(comm.Allreduce, sbuf, dst, MPI.SUM)
                else:
                    _, err = outcome(bmlmpi.Allreduce, sbuf, dst, MPI.SUM, comm=comm,
                                     algorithm="bml")
                results.append((err, whole().copy()))
            (ref_err, ref), (err, got) = results
            what = f"send {send_label} / recv {recv_label}"
            if ref_err is not None:
                # mpi4py pairs only buffers of equal length; bmlmpi lets recvbuf be longer
                continue
            if err is not None:
                failures.append(f"{what}: mpi4py accepted, bmlmpi raised {err}")
            elif not same(got, ref):
                failures.append(f"{what}: {got} differs from mpi4py's {ref}")
            elif not np.array_equal(ref[at:at + n], want):
                failures.append(f"{what}: mpi4py's {ref} is not the expected {want}")
    all_ranks_agree(comm, failures)


# -- DLPack exporters -------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("exporter", [LegacyDLPack, DLPack1], ids=["legacy", "dlpack-1.0"])
def test_dlpack_exporters_as_send_and_receive_buffers(comm, exporter):
    n = N_ELEMS
    want = expected(n, range(comm.size), np.float32, "sum")
    failures = []
    for algorithm in ALGORITHMS:
        x = values(n, comm.rank, np.float32, "sum")
        out = np.zeros(n, np.float32)
        _, err = outcome(bmlmpi.Allreduce, exporter(x), exporter(out), comm=comm,
                         algorithm=algorithm)
        if err or not np.array_equal(out, want):
            failures.append(f"{algorithm}: {err or out}")
        inplace = x.copy()
        _, err = outcome(bmlmpi.Allreduce, MPI.IN_PLACE, exporter(inplace), comm=comm,
                         algorithm=algorithm)
        if err or not np.array_equal(inplace, want):
            failures.append(f"{algorithm} in place: {err or inplace}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_read_only_dlpack_receive_buffer_is_refused_as_mpi4py_refuses_it(comm):
    ro = np.zeros(4)
    ro.flags.writeable = False
    _, ref_err = outcome(lambda: comm.Allreduce(np.ones(4), DLPack1(ro)))
    _, err = outcome(lambda: bmlmpi.Allreduce(np.ones(4), DLPack1(ro), comm=comm))
    failures = []
    if ref_err is None:
        failures.append("mpi4py wrote into a read-only DLPack 1.0 buffer")
    if err is None or "read-only" not in err and "RemoteArgumentError" not in err:
        failures.append(f"bmlmpi: {err}")
    # a read-only DLPack 1.0 send buffer is fine for both
    out = np.zeros(4)
    _, err = outcome(lambda: bmlmpi.Allreduce(DLPack1(ro), out, comm=comm))
    if err or not (out == 0).all():
        failures.append(f"read-only send buffer: {err or out}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
@pytest.mark.parametrize("exporter", [LegacyDLPack, DLPack1], ids=["legacy", "dlpack-1.0"])
@pytest.mark.parametrize("side", ["send", "recv"])
def test_long_double_over_dlpack_names_the_reason(comm, dtype, exporter, side):
    a, b = np.ones(4, dtype), np.zeros(4, dtype)
    if side == "send":
        a = exporter(a)
    else:
        b = exporter(b)
    _, err = outcome(lambda: bmlmpi.Allreduce(a, b, comm=comm))
    failures = []
    if err is None:
        failures.append("accepted")
    elif not err.startswith("RemoteArgumentError") and "long double" not in err:
        failures.append(f"error does not name long double: {err}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_long_double_over_a_dlpack_that_carries_it(comm, dtype):
    """An exporter that writes long double tensors (as mpi4py's own tests build them; numpy's
    refuses): bmlmpi reduces them as mpi4py's comm.Allreduce does, send and receive side,
    legacy and 1.0 capsules, in place and not."""
    failures = []
    r = comm.rank
    base = (np.arange(7) + 3 * r).astype(dtype)
    if dtype == np.clongdouble:
        base = base + 1j * (np.arange(7) - r)
    for legacy in (False, True):
        for op in (MPI.SUM, MPI.MAX if dtype == np.longdouble else MPI.PROD):
            want = np.zeros_like(base)
            comm.Allreduce(CtypesDLPack(base.copy(), legacy=legacy),
                           CtypesDLPack(want, legacy=legacy), op=op)
            got = np.zeros_like(base)
            _, err = outcome(bmlmpi.Allreduce, CtypesDLPack(base.copy(), legacy=legacy),
                             CtypesDLPack(got, legacy=legacy), op=op, comm=comm)
            if err or not np.array_equal(got, want):
                failures.append(f"legacy={legacy} {op.Get_name()}: {err or got} != {want}")
            inplace = base.copy()
            _, err = outcome(bmlmpi.Allreduce, MPI.IN_PLACE,
                             CtypesDLPack(inplace, legacy=legacy), op=op, comm=comm)
            if err or not np.array_equal(inplace, want):
                failures.append(f"in place legacy={legacy} {op.Get_name()}: {err or inplace}")
    all_ranks_agree(comm, failures)


# -- zero-count specs ---------------------------------------------------------------------------

ZERO_COUNT = {
    "[None, MPI.INT]": lambda: [None, MPI.INT],
    "[None, 0, MPI.INT]": lambda: [None, 0, MPI.INT],
    "[None, (0, 0), MPI.INT]": lambda: [None, (0, 0), MPI.INT],
    "[None, 'i']": lambda: [None, "i"],
    "empty array": lambda: np.zeros(0, np.int32),
    "[empty array, MPI.INT]": lambda: [np.zeros(0, np.int32), MPI.INT],
    "empty bytearray": lambda: [bytearray(), MPI.INT],
    "empty legacy DLPack": lambda: LegacyDLPack(np.zeros(0, np.int32)),
    "empty DLPack 1.0": lambda: DLPack1(np.zeros(0, np.int32)),
}


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_zero_count_specs(comm, in_place):
    failures = []
    for i, (send_label, make_send) in enumerate(ZERO_COUNT.items()):
        for j, (recv_label, make_recv) in enumerate(ZERO_COUNT.items()):
            if in_place and send_label != recv_label:
                continue
            sbuf = MPI.IN_PLACE if in_place else make_send()
            _, ref_err = outcome(comm.Allreduce, sbuf, make_recv(), MPI.SUM)
            if ref_err is not None:
                continue
            algorithm = ALGORITHMS[(i + j) % len(ALGORITHMS)]  # every pairing, one algorithm
            sbuf = MPI.IN_PLACE if in_place else make_send()
            req, err = outcome(bmlmpi.Iallreduce, sbuf, make_recv(), MPI.SUM, comm=comm,
                               algorithm=algorithm)
            if err is None:
                _, err = outcome(req.Wait)
            if err is not None:
                failures.append(f"{send_label} -> {recv_label} ({algorithm}): {err}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_none_with_a_nonzero_count_is_refused_as_by_mpi4py(comm):
    _, ref_err = outcome(lambda: comm.Allreduce([None, 3, MPI.INT], [None, 3, MPI.INT]))
    _, err = outcome(lambda: bmlmpi.Allreduce([None, 3, MPI.INT], [None, 3, MPI.INT],
                                              comm=comm))
    failures = [] if ref_err and err and "None" in err else [f"mpi4py {ref_err}, bmlmpi {err}"]
    all_ranks_agree(comm, failures)


# -- communicators: COMM_SELF, COMM_WORLD, duplicates -------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("which", ["self", "world", "dup", "split-dup"])
def test_communicators(comm, which):
    c = {"self": MPI.COMM_SELF, "world": MPI.COMM_WORLD}.get(which)
    if which == "dup":
        c = comm.Dup()
    elif which == "split-dup":
        c = comm.Split(comm.rank % 2, comm.rank).Dup()
    n = N_ELEMS
    failures = []
    members = [r for r in range(comm.size) if which != "split-dup" or r % 2 == comm.rank % 2]
    if which == "self":
        members = [comm.rank]
    for opname, op in OPS.items():
        # values() uses the rank in c: derive the expected result from c's ranks
        x = values(n, c.rank, np.int64, opname)
        ref, got = np.zeros(n, np.int64), np.zeros(n, np.int64)
        c.Allreduce(x, ref, op)
        inplace = x.copy()
        bmlmpi.Allreduce(x, got, op, comm=c)
        bmlmpi.Iallreduce(MPI.IN_PLACE, inplace, op, comm=c).Wait()
        want = expected(n, range(len(members)), np.int64, opname)
        for label, arr in (("mpi4py", ref), ("bmlmpi", got), ("bmlmpi in place", inplace)):
            if not np.array_equal(arr, want):
                failures.append(f"{which} {opname} {label}: {arr} vs {want}")
    if which in ("dup", "split-dup"):
        c.Free()
    all_ranks_agree(comm, failures)


# -- intercommunicators ------------------------------------------------------------------------

def _intercomms(comm):
    """(left group size, intercomm) for every split of the ranks into two non-empty groups."""
    for left in range(1, comm.size):
        color = 0 if comm.rank < left else 1
        local = comm.Split(color, comm.rank)
        remote_leader = left if color == 0 else 0
        inter = local.Create_intercomm(0, comm, remote_leader, tag=100 + left)
        local.Free()
        yield left, color, inter


@pytest.mark.mpi
def test_intercommunicator_is_refused_on_every_rank_without_waiting(comm):
    if comm.size == 1:
        pytest.skip("an intercommunicator needs two groups (two ranks or more)")
    n = N_ELEMS
    failures = []
    for left, color, inter in _intercomms(comm):
        # mpi4py's semantics: each group receives the reduction of the other group's data
        x = values(n, comm.rank, np.int64, "sum")
        ref = np.zeros(n, np.int64)
        comm_ref = inter.Allreduce(x, ref, MPI.SUM)
        other = range(left, comm.size) if color == 0 else range(left)
        if comm_ref is not None or not np.array_equal(ref, expected(n, other, np.int64, "sum")):
            failures.append(f"{left}+{comm.size - left}: mpi4py gave {ref}")
        calls = {
            "Allreduce": (bmlmpi.Allreduce, (x, np.zeros(n, np.int64)), {"comm": inter}),
            "Iallreduce": (bmlmpi.Iallreduce, (x, np.zeros(n, np.int64)), {"comm": inter}),
            "Communicator": (bmlmpi.Communicator, (inter,), {"timeout": 20}),
            "Communicator(fault_tolerant)": (bmlmpi.Communicator, (inter,),
                                             {"fault_tolerant": True, "timeout": 20}),
        }
        for label, (call, args, kwargs) in calls.items():
            start = time.monotonic()
            _, err = outcome(call, *args, **kwargs)
            took = time.monotonic() - start
            if err is None or not err.startswith("IntercommunicatorError"):
                failures.append(f"{left}+{comm.size - left} {label}: {err}")
            elif took > 5:  # decided locally: no collective, so no wait on other ranks
                failures.append(f"{left}+{comm.size - left} {label}: took {took:.1f} s")
        inter.Free()
    all_ranks_agree(comm, failures)


# -- device exporters (run where cupy sees a CUDA device; skipped elsewhere) --------------------

class CudaArrayInterfaceOnly:
    """A device array known only by ``__cuda_array_interface__`` (numba.cuda style)."""

    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


class CudaDLPackOnly:
    """A device array known only by DLPack on a CUDA device (no CUDA array interface)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.mpi
@pytest.mark.parametrize("exporter", [CudaArrayInterfaceOnly, CudaDLPackOnly],
                         ids=["cuda-array-interface", "cuda-dlpack"])
def test_device_exporters_match_mpi4py_on_the_same_values(comm, exporter):
    from bmlmpi.kernels import gpu
    if not gpu.gpu_available():
        pytest.skip("no CUDA device visible to cupy")
    import cupy

    n = N_ELEMS
    failures = []
    for opname, op in OPS.items():
        x = values(n, comm.rank, np.float32, opname)
        ref = np.zeros(n, np.float32)
        comm.Allreduce(x, ref, op)  # mpi4py on host copies of the same values
        for algorithm in ALGORITHMS:
            dev_x, dev_out = cupy.asarray(x), cupy.zeros(n, np.float32)
            _, err = outcome(bmlmpi.Allreduce, exporter(dev_x), exporter(dev_out), op,
                             comm=comm, algorithm=algorithm)
            dev_in_place = cupy.asarray(x)
            if err is None:
                _, err = outcome(bmlmpi.Allreduce, MPI.IN_PLACE, exporter(dev_in_place), op,
                                 comm=comm, algorithm=algorithm)
            if err is not None:
                failures.append(f"{opname} {algorithm}: {err}")
                continue
            for label, got in (("out", dev_out), ("in place", dev_in_place)):
                if not same(cupy.asnumpy(got), ref):
                    failures.append(f"{opname} {algorithm} {label}: {got} vs mpi4py's {ref}")
        if not np.array_equal(ref, expected(n, range(comm.size), np.float32, opname)):
            failures.append(f"{opname}: mpi4py gave {ref}")
    all_ranks_agree(comm, failures)


# -- the collective family (docs/collectives.md) ----------------------------------------------

def _family_forms(arr: np.ndarray, blocks: int = 1):
    """The buffer spec forms of mpi4py 4.1 for ``arr`` (float64), each a fresh spec; the
    count of a buffer of ``blocks`` blocks (one per rank) is one block's, as mpi4py reads it."""
    mpi_t = MPI.DOUBLE
    return {
        "array": lambda a: a,
        "[buf, datatype]": lambda a: [a, mpi_t],
        "[buf, count, datatype]": lambda a: [a, a.size // blocks, mpi_t],
        "[buf, (count, displ), datatype]": lambda a: [a, (a.size // blocks, 0), mpi_t],
        "[buf, typecode]": lambda a: [a, "d"],
        "array.array": None,  # built below: its own memory
        "Fortran 2-D": None,
    }


def _as_form(form: str, a: np.ndarray, blocks: int = 1):
    """(the spec of form ``form`` holding ``a``'s values, a function reading it back)."""
    if form == "array.array":
        buf = array.array("d", a.tolist())
        return buf, lambda: np.array(buf, dtype=np.float64)
    if form == "Fortran 2-D" and a.size % 2 == 0 and a.size:
        f = np.asfortranarray(a.reshape(2, -1, order="F"))
        return f, lambda: f.reshape(-1, order="F").copy()
    if form == "Fortran 2-D":
        b = a.copy()
        return b, lambda: b.copy()
    c = a.copy()
    return _family_forms(a, blocks)[form](c), lambda: c.copy()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "reduce", "bcast"])
def test_family_buffer_spec_forms_match_mpi4py(comm, collective):
    """Every spec form mpi4py 4.1 takes, for sendbuf and recvbuf alike, through mpi4py and
    through every algorithm of the collective: the same values, or both refuse."""
    size, rank = comm.size, comm.rank
    failures = []
    k = 4
    x = ((np.arange(k * size) * 7 + rank * 3) % 11).astype(np.float64)
    for form in _family_forms(x):
        outs = {}
        for who in ["mpi4py", *bmlmpi.algorithms(collective)]:
            if collective == "reduce_scatter":
                send, _ = _as_form(form, x, size)
                recv, read = _as_form(form, np.full(k, -1.0))
                args = (send, recv, MPI.SUM)
                method = "Reduce_scatter_block"
            elif collective == "allgather":
                send, _ = _as_form(form, x[:k])
                recv, read = _as_form(form, np.full(k * size, -1.0), size)
                args = (send, recv)
                method = "Allgather"
            elif collective == "reduce":
                send, _ = _as_form(form, x)
                recv, read = _as_form(form, np.full(k * size, -1.0))
                args = (send, recv, MPI.MAX, size - 1)
                method = "Reduce"
            else:
                recv, read = _as_form(form, x if rank == size // 2 else np.full(k * size, -1.0))
                args = (recv, size // 2)
                method = "Bcast"
            try:
                if who == "mpi4py":
                    getattr(comm, method)(*args)
                else:
                    getattr(bmlmpi, method)(*args, comm=comm, algorithm=who)
                outs[who] = read()
            except Exception as exc:  # noqa: BLE001 - compared across callers below
                outs[who] = type(exc).__name__
        ref = outs["mpi4py"]
        for who, got in outs.items():
            same = (isinstance(ref, str) and isinstance(got, str)) or (
                not isinstance(ref, str) and not isinstance(got, str)
                and np.array_equal(got, ref))
            if collective == "reduce" and rank != size - 1 and not isinstance(got, str):
                same = not isinstance(ref, str)
            if not same:
                failures.append(f"{form} {who}: {got!r} vs mpi4py {ref!r}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_family_refusals_match_mpi4py(comm):
    """Calls mpi4py refuses on every rank are refused by bmlmpi on every rank too."""
    size = comm.size
    cases = [
        # IN_PLACE reduce-scatter without recvcounts: mpi4py raises TypeError
        ("Reduce_scatter", lambda: (MPI.IN_PLACE, np.zeros(2 * size))),
        # an in-place block reduce-scatter whose count does not divide by size
        ("Reduce_scatter_block", lambda: (MPI.IN_PLACE, np.zeros(2 * size + 1)))
        if size > 1 else None,
        # an allgather receive buffer that is not size slots
        ("Allgather", lambda: (np.zeros(2), np.zeros(2 * size + 1))) if size > 1 else None,
    ]
    failures = []
    for case in cases:
        if case is None:
            continue
        method, make = case
        raised = []
        for target in (comm, bmlmpi):
            try:
                if target is comm:
                    getattr(comm, method)(*make())
                else:
                    getattr(bmlmpi, method)(*make(), comm=comm)
                raised.append(None)
            except Exception as exc:  # noqa: BLE001 - compared below
                raised.append(type(exc).__name__)
        if raised[0] is None or raised[1] is None:
            failures.append(f"{method}: mpi4py {raised[0]}, bmlmpi {raised[1]}")
    all_ranks_agree(comm, failures)
