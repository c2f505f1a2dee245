"""The compressed allreduce: a compressor (:mod:`.filters`) around any bmlmpi algorithm.

``Communicator.Allreduce(sendbuf, recvbuf, op, compression=...)`` and ``GradientBuckets(...,
compression=...)`` come here. One call on one registered array (error-feedback memory is kept
per array key: the result buffer's address and length for a direct call, the member arrays
for a bucket):

1. ``begin``: y = input + residual; the filters' dropped mask (no communication).
2. Agreement: one ``Iallreduce(MAX)`` of five numbers on a private duplicate communicator:
   max |kept y| (the wire scale), the largest kept count (dense or sparse), an error flag and
   ±count (bad input or a count that differs raises on every rank, never hangs).
3. ``finish``: the values to send (rounded to the wire format with the agreed scale) and the
   new residual y − sent.
4. The exchange, one of:
   * **sparse** (filters on, and :func:`.sparse.sparse_seconds` below the cost model's dense
     price): index/value pairs over the BCube levels (ring: around the ring), summed exactly;
   * **wire** (a 16-bit wire format): the algorithm's own schedule (bml, ring, tree,
     multitree; native and hierarchical run bml's), interpreted here: each send is encoded to
     16 bits, each receive decoded and added in the accumulation dtype (float32, float64 for
     float64 input); at the end every rank rounds its result through the wire once more, so
     ranks that owned a piece hold what the others received (identical results);
   * **dense**: the same schedule interpreted in the array's own dtype on the filtered values
     (zeros where dropped).
   Steps 2-4 run on a private duplicate communicator, and the compressed calls of one
   communicator run one after another (:class:`.engine.StagedRequest`), so a progress thread
   testing them in any order cannot reorder their messages across ranks.
   With every filter off and no wire format (``compressor.identity``), the call is the plain
   allreduce of the caller's buffers, bit for bit, and keeps no residual.

Ops: SUM and bmlmpi.AVG (the average divides the sum by N); dtypes float32 and float64 (float16
input accumulates in float32). Anything else raises ValueError before any communication (on
every rank, through the agreement). Cost: one extra latency-bound allreduce per call (step 2)
and two passes over the array (filters, residual); the saving is the bytes of step 4.

Source: seed 004 (TDF push, G-LNP); Horovod Compression.fp16 and PyTorch DDP comm hooks for
where a compressor sits (around the allreduce).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..ops import op_name
from .engine import TAG_SPAN, StagedRequest, next_tag_base, private_comm
from .filters import Compressor, parse
from .sparse import check_count, level_members, levels_exchange, ring_exchange, sparse_seconds
from .wire import decode, encode, round_trip

#: α-β defaults when the communicator has no calibration (shared memory, order of magnitude)
DEFAULT_ALPHA = 2e-5
DEFAULT_BETA = 1e-9


def _array(buf: Any, what: str) -> np.ndarray:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"compressed allreduce takes numpy arrays; {what} is "
                        f"{type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"compressed allreduce needs a C-contiguous {what}")
    return buf.reshape(-1)


def _problem(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[str | None, Any, Any, str]:
    """This rank's objection to its arguments (raised after the agreement), or None."""
    try:
        name = op_name(op)
        if name not in ("sum", "avg"):
            raise ValueError(f"compression supports MPI.SUM and bmlmpi.AVG, not {name.upper()}")
        out = _array(recvbuf, "recvbuf")
        if not out.flags.writeable:
            raise ValueError("recvbuf is read-only")
        src = out if sendbuf is MPI.IN_PLACE or sendbuf is None else _array(sendbuf, "sendbuf")
        if src.dtype.kind != "f" or out.dtype != src.dtype:
            raise ValueError(f"compression reduces floating-point arrays of one dtype; got "
                             f"{src.dtype} -> {out.dtype}")
        if out.size < src.size:
            raise ValueError(f"recvbuf holds {out.size} elements, fewer than the {src.size} "
                             f"sent")
        check_count(src.size)
        return None, src, out[:src.size], name
    except (TypeError, ValueError) as exc:
        return str(exc), None, None, ""


def _algorithm(comm: Any, count: int, itemsize: int) -> str:
    """The schedule a compressed call follows: the communicator's, bml for native/tiered."""
    alg = comm.algorithm
    if alg == "auto":
        alg = comm._auto(count, itemsize)
    return alg if alg in ("bml", "ring", "tree", "multitree") else "bml"


def _dense_seconds(comm: Any, alg: str, count: int, itemsize: int) -> float:
    from ..model import estimate
    calib = getattr(comm, "calibration", None)
    if calib is None:
        t = estimate([alg], count, itemsize, comm.size, alpha=DEFAULT_ALPHA, beta=DEFAULT_BETA,
                     shape=comm.shape)
    else:
        t = estimate([alg], count, itemsize, comm.size, calib=calib, shape=comm.shape)
    return t[alg]


def _alpha_beta(comm: Any) -> tuple[float, float]:
    calib = getattr(comm, "calibration", None)
    return (DEFAULT_ALPHA, DEFAULT_BETA) if calib is None else (calib.alpha, calib.beta)


def choose_sparse(comm: Any, alg: str, kept: int, count: int, itemsize: int,
                  wire_itemsize: int) -> bool:
    """Whether the sparse exchange of ``kept`` pairs is cheaper than the dense allreduce."""
    if comm.size == 1 or count == 0:
        return False
    alpha, beta = _alpha_beta(comm)
    radices = None if alg == "ring" else list(comm.shape)
    sparse = sparse_seconds(kept, count, itemsize, radices, comm.size, alpha, beta)
    return sparse < _dense_seconds(comm, alg, count, wire_itemsize)


def _schedule_stages(comm: Any, dup: MPI.Comm, tag: int, wire: str | None, alg: str,
                     acc: np.ndarray, stats: list):
    """Run ``alg``'s schedule on ``acc`` over ``dup``: with a ``wire`` format each send is
    encoded to 16 bits and each receive decoded and added in ``acc``'s dtype; without one,
    ``acc``'s own elements travel."""
    itemsize = 2 if wire else acc.itemsize
    sched = comm._schedule(alg, acc.size, itemsize)
    if sched.nsteps > TAG_SPAN:
        raise ValueError(f"{alg} has {sched.nsteps} steps, more than the {TAG_SPAN} tags a "
                         f"compressed call may use")
    for k, step in enumerate(sched.steps):
        reqs, incoming, keep = [], [], []
        for r in step.recvs:
            buf = np.empty(r.n, np.uint16 if wire else acc.dtype)
            incoming.append((r, buf))
            reqs.append(dup.Irecv(buf, r.peer, tag + k))
        for s in step.sends:
            out = encode(wire, acc[s.lo:s.hi]) if wire else acc[s.lo:s.hi].copy()
            keep.append(out)    # alive until the step completes
            reqs.append(dup.Isend(out, s.peer, tag + k))
            stats[0] += out.nbytes
        yield reqs
        for r, buf in incoming:
            vals = decode(wire, buf, acc.dtype) if wire else buf
            if r.reduce:
                acc[r.lo:r.hi] += vals
            else:
                acc[r.lo:r.hi] = vals
        del keep


def _plain_bytes(comm: Any, alg: str, count: int, itemsize: int) -> int:
    if comm.size == 1:
        return 0
    return comm._schedule(alg, count, itemsize).sent_elements() * itemsize


def _stages(comm: Any, compressor: Compressor, sendbuf: Any, recvbuf: Any, op: Any, key: Any):
    problem, src, out, name = _problem(sendbuf, recvbuf, op)
    size = comm.size
    step = None
    agree = np.zeros(5)
    if problem is None:
        step = compressor.begin(key, src)
        kept = src.size - (int(step.dropped.sum()) if step.dropped is not None else 0)
        agree[:] = [compressor.local_maxabs(step), kept, 0, src.size, -src.size]
    else:
        agree[2] = 1
    dup = private_comm(comm)
    tag = next_tag_base(comm)
    got = np.empty(5)
    yield [dup.Iallreduce(agree, got, MPI.MAX)]
    if problem is not None:
        raise ValueError(problem)
    if got[2]:
        raise ValueError("another rank rejected its compressed allreduce arguments (see its "
                         "error)")
    if got[3] != -got[4]:
        raise ValueError(f"ranks passed different counts to a compressed allreduce (this rank "
                         f"{src.size}, the largest {int(got[3])}, the smallest {int(-got[4])})")
    count = src.size
    v = compressor.finish(key, step, float(got[0]), size)
    acc = v.dtype
    wire_size = 2 if compressor.wire else acc.itemsize
    alg = _algorithm(comm, count, wire_size)
    if compressor.path == "sparse" or (
            compressor.path == "auto" and compressor.filters
            and choose_sparse(comm, alg, int(got[1]), count, acc.itemsize, wire_size)):
        sent = step.sent
        nz = np.flatnonzero(~step.dropped) if step.dropped is not None else np.arange(count)
        result: list = []
        box = [0]
        if alg == "ring":
            yield from ring_exchange(dup, tag, nz, sent[nz], result, box)
        else:
            members = getattr(comm, "_compression_levels", None)
            if members is None:
                members = comm._compression_levels = level_members(comm.level_comms, dup)
            yield from levels_exchange(members, dup, tag, nz, sent[nz], result, box)
        idx, val = result[0]
        total = np.zeros(count, acc)
        total[idx] = val
        path, nbytes = "sparse", box[0]
    else:
        box = [0]
        if size > 1:
            yield from _schedule_stages(comm, dup, tag, compressor.wire, alg, v, box)
        if compressor.wire is not None:
            total = round_trip(compressor.wire, v) / acc.type(step.scale)
            path = "wire"
        else:
            total, path = v, "dense"
        nbytes = box[0]
    if name == "avg":
        total /= acc.type(size)
    out[:] = total
    compressor.count(path, nbytes)


def start(comm: Any, sendbuf: Any, recvbuf: Any, op: Any, compression: Any,
          key: Any = None) -> Any:
    """Start a compressed allreduce on the bmlmpi Communicator ``comm``; returns a request.

    ``compression``: a :class:`Compressor` (keeps its error-feedback memory across calls) or
    a spec string (:func:`.filters.parse`; a string builds a new compressor each call, so only
    the stateless ``fp16``/``bf16`` are meaningful that way — pass an object for filters).
    ``key``: the registered array this call reduces (default: ``recvbuf``'s address and
    length, so reduce into the same array at every step for error feedback to carry over).
    """
    compressor = parse(compression)
    if compressor is None or compressor.identity:
        req = comm.Iallreduce(sendbuf, recvbuf, op)
        if compressor is not None and isinstance(recvbuf, np.ndarray):
            itemsize = recvbuf.dtype.itemsize
            alg = _algorithm(comm, recvbuf.size, itemsize)
            compressor.count("plain", _plain_bytes(comm, alg, recvbuf.size, itemsize))
        return req
    if key is None:
        # the registered array is the result buffer: a gradient reduced in place, or the
        # array a training loop reduces into at every step (its input is often a temporary)
        if isinstance(recvbuf, np.ndarray):
            key = ("buffer", recvbuf.__array_interface__["data"][0], recvbuf.size,
                   recvbuf.dtype.str)
    return StagedRequest(_stages(comm, compressor, sendbuf, recvbuf, op, key), comm.timeout,
                         f"compressed allreduce ({compressor.name})", owner=comm)


__all__ = ["choose_sparse", "start"]
