"""The compressed allreduce: a compressor (:mod:`.protocol`; :mod:`.filters`, :mod:`.topk`)
around any bmlmpi algorithm.

``Communicator.Allreduce(sendbuf, recvbuf, op, compression=...)`` and ``GradientBuckets(...,
compression=...)`` come here. One call on one registered array (error-feedback memory is kept
per array key: the result buffer's address and length for a direct call, the member arrays
for a bucket):

1. ``begin``: y = input + residual; the compressor's dropped mask (no communication).
2. Agreement: one ``Iallreduce(MAX)`` of seven numbers on a private duplicate communicator:
   max |kept y| (the wire scale), the largest kept count (dense or sparse), an error flag,
   ±count and ± a 52-bit hash of what the compressor declares the ranks must agree on
   (:meth:`.protocol.Compressor.agreement`: its class, settings, wire format and path) (bad
   input, or a count or compressor that differs, raises on every rank, never hangs; so every
   rank takes the same branch after it, the α-β measurement included).
3. ``finish``: the values to send (rounded to the wire format with the agreed scale) and the
   new residual y − sent.
4. The exchange, one of:
   * **sparse** (filters on, and :func:`.sparse.sparse_seconds` below the cost model's dense
     price, both priced with the communicator's α and β: its calibration's, else measured once
     on its first such call, :mod:`.network_price`): index/value pairs over the BCube levels
     (ring, or a communicator without level communicators such as the fault-tolerant one:
     around the ring), summed exactly. With a wire format the values travel as the 16-bit codes
     ``finish`` made (4 + 2 bytes a pair instead of 4 + itemsize), unsummed until every rank
     holds them all (:func:`.sparse.concatenate`; a partial sum rounded to 16 bits would no
     longer be exact), then decoded and summed in float64 (exact: at most N 16-bit values an
     index) and divided by the agreed power-of-two scale;
   * **wire** (a 16-bit wire format, with or without filters): ``finish`` has already scaled y by
     the agreed power of two, rounded it to the wire format (``v``) and encoded ``v`` once into
     uint16 codes (zeros where dropped); the algorithm's own schedule (bml, ring, tree, multitree;
     native and hierarchical run bml's) runs on the codes through bmlmpi's one executor,
     :class:`bmlmpi.execute.Run`, with the kernel op ``sum_fp16``/``sum_bf16``: every reduction step
     decodes the 16-bit operands to float32, adds them in float32 and rounds the sum once to 16 bits
     (nearest even), so every partial sum a rank stores or sends is a 16-bit value; the copy steps
     move codes unchanged, so every rank ends with the same codes. The result is the codes decoded
     and divided by the scale: the same bits on every rank. Why no partial sum can overflow:
     :mod:`.wire` (each is a sum of at most N scaled inputs, each ≤ M·s, grown by at most N
     roundings);
   * **dense** (filters, no wire format): the same plain scheduled allreduce (a Run with
     ``sum``) of the filtered values in their accumulation dtype (zeros where dropped).
   The transfers are MPI.BYTE, so MPI never sees the dtype. The plan of each (algorithm,
   count, item size) is compiled once (:meth:`bmlmpi.execute.Plan.flat` on the private
   duplicate communicator) and cached in the communicator's compression channel
   (:class:`.channel.CompressionChannel`); each call runs on its own block of tags.
   Steps 2-4 run on the channel's private duplicate communicator, and the compressed calls of
   one communicator run one after another (:class:`.engine.StagedRequest`), so a progress
   thread testing them in any order cannot reorder their messages across ranks.
   With every filter off and no wire format (``compressor.identity``), the call is the plain
   allreduce of the caller's buffers, bit for bit, and keeps no residual.

Steps 2-4 run through the communicator's policy, ``comm.policy.settle_compressed(stages,
channel, what, abandon)`` (:class:`bmlmpi.call_policy.CallPolicy`): the plain policy runs them
as they are; the fault-tolerant one (:mod:`bmlmpi.ft.compressed`) settles the call among the
survivors, and where it cannot, calls ``abandon`` (which puts the compressor's error-feedback
memory back as before the call and drops the channel's duplicate) before raising its own error;
recvbuf is then untouched.

Ops: SUM and bmlmpi.AVG (the average divides the sum by N); dtypes float32 and float64 (float16
input accumulates in float32). Anything else raises ValueError before any communication (on
every rank, through the agreement). Cost: one extra latency-bound allreduce per call (step 2)
and two passes over the array (filters, residual); the saving is the bytes of step 4.

Source: Timed Dataflow (TDF push, G-LNP); Horovod Compression.fp16 and PyTorch DDP comm hooks for
where a compressor sits (around the allreduce).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..calls import earns_dump
from ..executors import start_allreduce
from ..handles import Request
from ..ops import op_name
from ..recorder import FlightRecorder, Signature, Slot
from ..schedules.algorithms import with_wire_format
from .engine import RunRequest, StagedRequest
from .network_price import DEFAULT_ALPHA, DEFAULT_BETA, alpha_beta, known
from .protocol import Compressor, parse
from .sparse import (
    check_count,
    concatenate,
    levels_exchange,
    merge,
    ring_exchange,
    sparse_seconds,
)
from .wire import decode, sum_op


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
    """The schedule a compressed call follows: the communicator's where its record can carry
    a wire format, else bml (native, tiered)."""
    alg = comm.algorithm
    if alg == "auto":
        alg = comm.plans.auto(count, itemsize)
    return alg if alg in with_wire_format() else "bml"


def _dense_seconds(comm: Any, alg: str, count: int, itemsize: int, alpha: float,
                   beta: float) -> float:
    from ..model import estimate
    calib = comm.calibration
    if calib is None:
        t = estimate([alg], count, itemsize, comm.size, alpha=alpha, beta=beta,
                     shape=comm.shape)
    else:
        t = estimate([alg], count, itemsize, comm.size, calib=calib, shape=comm.shape)
    return t[alg]


def choose_sparse(channel: Any, alg: str, kept: int, count: int, itemsize: int,
                  wire_itemsize: int, alpha: float | None = None,
                  beta: float | None = None) -> bool:
    """Whether the sparse exchange of ``kept`` pairs (values of ``itemsize`` bytes) is
    cheaper than the dense allreduce (elements of ``wire_itemsize`` bytes) on the
    communicator of the compression ``channel``, priced with (``alpha``, ``beta``): default
    :func:`.network_price.known` (the calibration's, the measured ones or the defaults)."""
    comm = channel.owner
    if comm.size == 1 or count == 0:
        return False
    if alpha is None or beta is None:
        alpha, beta = known(channel) or (DEFAULT_ALPHA, DEFAULT_BETA)
    radices = None if alg == "ring" or not comm.level_comms else list(comm.shape)
    sparse = sparse_seconds(kept, count, itemsize, radices, comm.size, alpha, beta)
    return sparse < _dense_seconds(comm, alg, count, wire_itemsize, alpha, beta)


def _exchange(channel: Any, tag: int, alg: str, buf: np.ndarray, op: str,
              what: str) -> Generator[list, None, int]:
    """The plain scheduled allreduce of ``buf`` (in place) with kernel op ``op``, through
    :func:`bmlmpi.executors.start_allreduce` (a channel's plans are message plans: a
    :class:`bmlmpi.execute.Run`); returns the bytes this rank sent."""
    plan = channel.plan(alg, buf.size, buf.itemsize, op)
    run = start_allreduce(plan, buf, op, tag, f"compressed {alg} allreduce ({what}, rank "
                                              f"{channel.owner.rank}, tags from {tag})")
    yield [RunRequest(run)]
    return plan.sched.sent_elements() * buf.itemsize


def _plain_bytes(comm: Any, alg: str, count: int, itemsize: int) -> int:
    if comm.size == 1:
        return 0
    return comm.plans.schedule(alg, count, itemsize).sent_elements() * itemsize


def _reduce(channel: Any, compressor: Compressor, step: Any, problem: str | None,
            count: int, key: Any) -> Generator[list, None, tuple[np.ndarray, str, int]]:
    """Steps 2-4 of the module docstring: (the summed values, the path, bytes sent)."""
    comm = channel.owner
    size = comm.size
    dup = channel.comm
    agree = np.zeros(7)
    shape = compressor.agreement_code()
    if problem is None:
        kept = count - (int(step.dropped.sum()) if step.dropped is not None else 0)
        agree[:] = [compressor.local_maxabs(step), kept, 0, count, -count, shape, -shape]
    else:
        agree[2] = 1
    tag = channel.next_tag_base()
    got = np.empty(7)
    yield [dup.Iallreduce(agree, got, MPI.MAX)]
    if problem is not None:
        raise ValueError(problem)
    if got[2]:
        raise ValueError("another rank rejected its compressed allreduce arguments (see its "
                         "error)")
    if got[3] != -got[4]:
        raise ValueError(f"ranks passed different counts to a compressed allreduce (this rank "
                         f"{count}, the largest {int(got[3])}, the smallest {int(-got[4])})")
    if got[5] != -got[6]:
        raise ValueError(f"ranks passed different compressors to a compressed allreduce (this "
                         f"rank {compressor.name}, agreeing on {compressor.agreement()}: its "
                         f"class, settings, wire format or exchange path differ from another "
                         f"rank's)")
    acc = step.y.dtype
    wire_size = 2 if compressor.wire else acc.itemsize
    alg = _algorithm(comm, count, wire_size)
    sparse = compressor.path == "sparse"
    if compressor.path == "auto" and compressor.filters and size > 1:
        # every rank is here together: the agreement above matched the compressors
        alpha, beta = yield from alpha_beta(channel, tag)
        sparse = choose_sparse(channel, alg, int(got[1]), count, wire_size, wire_size, alpha,
                               beta)
    nz = None
    if sparse:
        nz = np.flatnonzero(~step.dropped) if step.dropped is not None else np.arange(count)
    v = compressor.finish(key, step, float(got[0]), size, kept_at=nz)
    if sparse:
        # with a wire format the pairs carry the 16-bit codes finish made of the kept values
        # (scaled, wire-rounded) and no rank sums before the end: every code arrives as
        # sent, and the final sum (in float64, of at most N 16-bit values per index) is exact
        values = step.codes if compressor.wire is not None else step.sent[nz]
        combine = concatenate if compressor.wire is not None else merge
        result: list = []
        box = [0]
        if alg == "ring" or not comm.level_comms:
            # a communicator without level communicators (the fault-tolerant one): the ring
            yield from ring_exchange(dup, tag, nz, values, result, box, combine)
        else:
            yield from levels_exchange(channel.level_members(), dup, tag, nz, values, result,
                                       box, combine)
        idx, val = result[0]
        total = np.zeros(count, acc)
        if compressor.wire is not None:
            idx, sums = merge([(idx, decode(compressor.wire, val, np.dtype(np.float64)))],
                              np.dtype(np.float64))
            total[idx] = sums / step.scale    # a power of two: exact
        else:
            total[idx] = val
        return total, "sparse", box[0]
    nbytes = 0
    if compressor.wire is not None:
        codes = step.codes                   # v encoded once, by finish
        if size > 1:
            nbytes = yield from _exchange(channel, tag, alg, codes, sum_op(compressor.wire),
                                          compressor.name)
        return decode(compressor.wire, codes, acc) / acc.type(step.scale), "wire", nbytes
    if size > 1:
        nbytes = yield from _exchange(channel, tag, alg, v, "sum", compressor.name)
    return v, "dense", nbytes


def _stages(channel: Any, compressor: Compressor, sendbuf: Any, recvbuf: Any, op: Any,
            key: Any):
    comm = channel.owner
    problem, src, out, name = _problem(sendbuf, recvbuf, op)
    step = None
    count = 0 if src is None else src.size
    before = (compressor.residuals.get(key), compressor.iterations.get(key))
    if problem is None:
        step = compressor.begin(key, src)

    def abandon() -> None:
        """The call is given up on every rank: no trace of it in the compressor's memory,
        and the channel's duplicate (which a failure made unusable) dropped."""
        residual, t = before
        for store, old in ((compressor.residuals, residual), (compressor.iterations, t)):
            if old is None:
                store.pop(key, None)
            else:
                store[key] = old
        channel.drop()

    total, path, nbytes = yield from comm.policy.settle_compressed(
        _reduce(channel, compressor, step, problem, count, key), channel,
        f"compressed allreduce ({compressor.name})", abandon)
    if name == "avg":
        total /= total.dtype.type(comm.size)
    out[:] = total
    compressor.count(path, nbytes)


def start(channel: Any, sendbuf: Any, recvbuf: Any, op: Any, compression: Any,
          key: Any = None) -> Any:
    """Start a compressed allreduce on the communicator of the compression ``channel`` (its
    :class:`.channel.CompressionChannel`); returns a request.

    ``compression``: a :class:`Compressor` (keeps its error-feedback memory across calls) or
    a spec string (:func:`.protocol.parse`; a string builds a new compressor each call, so only
    the stateless ``fp16``/``bf16`` are meaningful that way — pass an object for filters).
    ``key``: the registered array this call reduces (default: ``recvbuf``'s address and
    length, so reduce into the same array at every step for error feedback to carry over).
    With the identity compressor the call is the communicator's own allreduce.
    """
    comm = channel.owner
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
    # the communicator agrees on the call first (its signature names the compressor), so
    # that a rank compressing where the others do not fails at once on every rank instead of
    # meeting their data messages with its own collectives (a fault-tolerant communicator
    # agrees inside the call: it has no first-call agreement)
    settings = compressor.settings()
    comm.agree_compressed(recvbuf, op, f"wire {compressor.wire or 'none'}, filters "
                                       f"{'on' if compressor.filters else 'off'}, path "
                                       f"{compressor.path}" +
                          (f", {type(compressor).__name__} {settings}" if settings else ""))
    stages = _stages(channel, compressor, sendbuf, recvbuf, op, key)
    rec = comm.recorder
    if rec is not None:
        stages = _recorded(rec, rec.begin(_signature(comm, compressor, recvbuf, op)), stages)
    return Request(StagedRequest(stages, comm.timeout,
                                 f"compressed allreduce ({compressor.name})",
                                 queue=channel.queue))


def _signature(comm: Any, compressor: Compressor, recvbuf: Any, op: Any) -> Signature:
    """The flight recorder's signature of a compressed call (count and dtype where recvbuf
    is an array; the op as far as bmlmpi knows it: a bad one is refused in the stages)."""
    count = dtype = name = None
    if isinstance(recvbuf, np.ndarray):
        count, dtype = int(recvbuf.size), recvbuf.dtype.name
    with contextlib.suppress(Exception):
        name = op_name(op)
    return Signature("allreduce", count, dtype, name, None, comm.algorithm,
                     f"compressed {compressor.name}")


def _recorded(rec: FlightRecorder, slot: Slot, stages: Generator) -> Generator:
    """``stages``, their end written into the flight recorder: done, or failed (and the
    recorder dumped where the failure earns it: :func:`bmlmpi.calls.earns_dump`)."""
    try:
        result = yield from stages
    except GeneratorExit as exc:
        rec.fail(slot, exc)
        raise
    except BaseException as exc:
        rec.failed_call(slot, exc, dump=earns_dump(exc))
        raise
    rec.done(slot)
    return result


__all__ = ["choose_sparse", "start"]
