"""Call formats: what a reducing call's record carries around its schedule, so that the
schedule reduces another representation of the values than the caller's (the registry:
:func:`register`, :func:`get`), and the reproducible one (:class:`ReproducibleFormat`, the
registered ``"reproducible"``).

A call format is asked, while a call's arguments are read, whether it carries a call of that
dtype and op (:meth:`ReproducibleFormat.carrier`): it answers with the carrier the call's
record keeps (:attr:`bmlmpi.calls.CollectiveCall.wire`), None where the call's values pass
through as they are, or it refuses the call (an argument error, announced to every rank as
any other). The record's launch hands a carried call to its carrier
(:meth:`ReproducibleCarrier.start`), which starts the plain call of the carried words
through the same launch (any algorithm's schedule, ``native`` as MPI's own call) and
returns a run the pipeline polls like any other: the executors know nothing of it, the
fast path only declines a carried call, and the facade only names the format a call asks
for.

The reproducible carrier (the method, its bound and cost: :mod:`bmlmpi.reproducible.format`):

1. at the start of each call (blocking, ``I…``, each persistent start, each fault-tolerant
   attempt): this rank's block exponents and flags, MAX-reduced over the call's
   communicator (``MPI_Iallreduce`` of int16, polled under the communicator's deadline, the
   communicator's other outstanding calls advanced meanwhile), so a start waits for every
   rank's start;

then the addends are encoded where they meet, not before they leave (the result asks only
that every addend be truncated once at the agreed cut and the integers be summed exactly,
not where), for an allreduce in any form on the plain communicator whose algorithm serves
no all-to-all (``bml``, ``ring``, ``tree``, ``multitree``, ...:
:meth:`ReproducibleCarrier.pipelines`):

2. the pipelined meet (:mod:`bmlmpi.schedules.meet`), one schedule run by the message
   executor: in pieces of whole format blocks, each rank sends piece p of block j of its
   input to rank j as it is (a float32 value 4 bytes on the wire), sums piece p of its own
   block from its own addends and the N - 1 received ones at once as they land
   (:class:`_MeetSum`, :func:`bmlmpi.reproducible.format.sum_addends`: each addend encoded,
   the integers added in cache, decoded once in place, the special bytes ORed from the
   addends themselves), and sends the summed piece to every rank with the next piece;

for a blocking allreduce on the plain communicator whose algorithm serves the all-to-all,
the reduce-scatter and the allgather (``shm``, ``hierarchical``, ``native``:
:meth:`ReproducibleCarrier.meets`), and for a reduce-scatter in any form on the plain
communicator (:meth:`ReproducibleCarrier.scatters`: steps 2 and 3 only):

2. the all-to-all of the values themselves (:meth:`bmlmpi.calls.CollectiveCall.halves`):
   rank j receives block j of every rank's input, each block sent once, straight to its
   owner, as it is (a float32 value 4 bytes on the wire, a plain reduce-scatter's bytes),
   by the call's algorithm where it serves the all-to-all (``shm``, ``hierarchical``,
   ``native``), else by ``pairwise`` (one hop a block; at N = 2 the same single exchange
   as every algorithm's reduce-scatter);
3. this rank's block summed from the column it received in one pass
   (:func:`bmlmpi.reproducible.format.sum_contributions`: each addend encoded, the
   integers added in cache, decoded once into the caller's result, a reduce-scatter's block
   of this rank; the special bytes ORed from the addends themselves): no words in memory,
   no special bytes' exchange, the bits of the words' sum;
4. an allreduce's: the summed values' allgather in place on the result, by the call's
   algorithm;

and for every other call (a ``shm``, ``hierarchical`` or ``native`` allreduce's ``I…`` and
persistent forms, a fault-tolerant communicator, a reduce, one rank):

2. the input encoded at the agreed cuts into int64 words (a buffer of the carrier's own;
   the caller's buffers are read, not written, until the end);
3. where a block is flagged (a NaN, an infinity or a -0 in it on some rank): the special
   bytes of those blocks' elements OR-reduced (``MPI_Iallreduce`` of uint8, started here);
4. the words' integer SUM: the same collective's plain call of the words
   (:meth:`bmlmpi.calls.CollectiveCall.carried`), the call's algorithm run by the same
   launch;
5. once both exchanges completed: the words decoded into the caller's result (a reduce's
   on the root), rounded once.

Why a blocking allreduce only by its algorithm's halves: its allgather's start waits for
the all-to-all, and a call
started while others of the communicator may start theirs would make that start's place
among them differ between ranks; a reduce-scatter has one exchange, started where the
words' call would start. A reduce sums words (an all-to-all would bring every addend to the
root: N times a reduce's bytes there). Every rank issues the small exchanges and
starts the next call in the same order as its calls, so MPI's collectives on the
communicator pair up across ranks. A blocking allreduce's later calls of a signature are
started by its fast-path entry (:meth:`bmlmpi.fast_path.FastPath.carried`) with the same
calls, in the same order, the column (or the words) kept from call to call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .calls import CollectiveCall, offsets
from .execute import DeadlineExceeded, wait_for
from .executors import defer_behind, start_allreduce
from .reproducible import format as rf


class ReproducibleRefused(ValueError):
    """A reproducible call with an op that has no exact integer form (PROD), or with
    compression: refused on every rank before anything is sent (docs/reproducible.md)."""


class ReproducibleRun:
    """A reproducible call's run: the words' run or the values' all-to-all (any executor's,
    or MPI's own call), the special bytes' exchange, then the decode (or the sum where the
    addends meet) into the caller's result, then (an allreduce summed where its addends
    meet) the allgather of the summed values, and ``finish``. Polled as any run
    (``test``, ``progress``, ``reqs``, ``cancel``, ``describe_timeout``) or driven
    (:meth:`drive`). ``held``: the arrays MPI may read or write until the exchanges complete
    (the words or the column, the special bytes sent), kept as long as the run is (a call
    given up at its deadline keeps its run, so MPI never touches freed memory). ``gather``: None, or
    what starts the allgather's run once the decode is done."""

    __slots__ = ("words_run", "specials", "decode", "finish", "step", "held", "gather",
                 "fresh")

    #: steps: the words' run, the special bytes and the decode, the allgather, done
    WORDS, DECODE, GATHER, DONE = range(4)

    def __init__(self, words_run: Any, specials: MPI.Request | None,
                 decode: Callable[[], None], finish: Callable[[], None] | None,
                 held: tuple = (), gather: Callable[[], Any] | None = None):
        self.words_run = words_run
        self.specials = specials
        self.decode = decode
        self.finish = finish
        self.step = self.WORDS
        self.held = held
        self.gather = gather
        #: ``words_run`` was neither polled nor driven yet: :meth:`drive` may drive it (a
        #: schedule's drive posts its first step itself)
        self.fresh = True

    def test(self) -> bool:
        if self.step == self.WORDS:
            self.fresh = False
            if self.words_run.test():
                self.step = self.DECODE
        if self.step == self.DECODE and (self.specials is None or self.specials.Test()):
            self.decode()
            if self.gather is not None:
                self.held = (*self.held, self.words_run)
                self.words_run = self.gather()
                self.fresh = True
                self.step = self.GATHER
                return False   # the allgather's run is polled, or driven, from here on
            self._done()
        elif self.step == self.GATHER:
            self.fresh = False
            if self.words_run.test():
                self._done()
        return self.step == self.DONE

    def _done(self) -> None:
        if self.finish is not None:
            self.finish()
        self.step = self.DONE

    def drive(self, timeout: float, interrupt: Callable[[], None] | None = None) -> None:
        """Run to completion in the calling thread (a blocking call's fast path,
        :meth:`bmlmpi.fast_path.FastPath.carried`): a schedule's run (the words', the
        allgather's) driven by its own loop while nothing polled it yet (its drive posts
        its steps itself), the rest polled; DeadlineExceeded after ``timeout`` s without
        progress."""
        while True:
            if self.fresh and self.step in (self.WORDS, self.GATHER):
                drive = getattr(self.words_run, "drive", None)
                if drive is not None:
                    self.fresh = False
                    drive(timeout, interrupt)
            step = self.step
            if self.test():
                return
            if self.step == step:   # poll until the next step (or the end)
                wait_for(lambda step=step: self.test() or self.step != step, timeout,
                         self.describe_timeout, progress=lambda: self.progress,
                         interrupt=interrupt)
                if self.step == self.DONE:
                    return

    @property
    def progress(self) -> int:
        """Grows with every step of the words' (then the allgather's) run and of this run (a
        count, as a Run's)."""
        return self.words_run.progress + 1000 * self.step

    @property
    def reqs(self) -> list[MPI.Request]:
        extra = [] if self.specials is None else [self.specials]
        return [*self.words_run.reqs, *extra]

    def cancel(self, bound: float = 0.0) -> list[MPI.Request]:
        extra = [] if self.specials is None else [self.specials]
        return [*self.words_run.cancel(bound), *extra]

    def describe_timeout(self, timeout: float) -> str:
        if self.step == self.WORDS:
            return f"reproducible words: {self.words_run.describe_timeout(timeout)}"
        if self.step == self.GATHER:
            return (f"reproducible allgather of the decoded values: "
                    f"{self.words_run.describe_timeout(timeout)}")
        return f"the reproducible special values' exchange made no progress in {timeout:g} s"


class ReproducibleCarrier:
    """One reproducible call's carrier: the format of its dtype (:class:`bmlmpi.
    reproducible.format.Format`; complex values as two real positions). ``kept``: the words,
    or the column (:meth:`meets`), a blocking signature's fast-path entry reuses from call to
    call (None: each call allocates its own; :meth:`keep`, :meth:`release`)."""

    __slots__ = ("fmt", "dtype", "kept", "keeps", "blocking")
    name = "reproducible"

    def __init__(self, fmt: rf.Format, dtype: np.dtype):
        self.fmt = fmt
        #: the dtype of the calls it carries (complex: two real positions a value)
        self.dtype = dtype
        self.kept: np.ndarray | None = None
        self.keeps = False
        #: whether the calls it starts are blocking ones, started and completed in turn with
        #: no other call of the communicator started meanwhile (:meth:`meets`)
        self.blocking = False

    def keep(self) -> ReproducibleCarrier:
        """This carrier, made to reuse one buffer (the words, or the column) for the calls it
        starts (a fast-path entry's, whose calls run one at a time to completion): its
        allocation and the first touch of its pages are paid once, not every call."""
        self.keeps = True
        return self

    def release(self) -> None:
        """Forget the kept buffer (a call that did not complete may leave it with MPI:
        the next call allocates another)."""
        self.kept = None

    def _words_buffer(self, n: int) -> np.ndarray:
        kept = self.kept
        if kept is not None and kept.shape == (n,) and kept.dtype == np.int64:
            return kept
        words = np.empty(n, np.int64)
        if self.keeps:
            self.kept = words
        return words

    def words(self, count: int, dtype: np.dtype) -> int:
        """How many int64 words carry ``count`` values of ``dtype``."""
        reals = count * (2 if np.dtype(dtype).kind == "c" else 1)
        return reals * self.fmt.words

    def start(self, call: CollectiveCall, pipeline: Any, label: str,
              finish: Callable[[], None] | None) -> ReproducibleRun:
        """Start ``call`` (an allreduce, reduce-scatter or reduce this carrier carries) on
        ``pipeline`` (its communicator: ``comm``, ``rank``, ``size``, ``timeout``,
        ``policy``, ``calls_in_flight``): the steps of the module docstring, summed where the
        addends meet (:meth:`meets`) or as words by the same collective's call
        (:meth:`bmlmpi.calls.CollectiveCall.carried`); ``finish`` runs after the decode."""
        given, _ = call.schedule_buffers()
        values = call.out if given is None else given
        mine = rf.block_exponents(values)
        agreed = np.empty_like(mine)
        _exchange(pipeline, pipeline.comm.Iallreduce(mine, agreed, MPI.MAX), label,
                  (mine, agreed))
        if self.pipelines(call, pipeline):
            return self._start_pipelined(call, pipeline, label, finish, agreed, values)
        if self.scatters(call, pipeline):
            exchange, column = call.meeting(call.counts, pipeline.rank, pipeline.size)
            first = offsets(call.counts)[pipeline.rank]
            return self._start_meeting(exchange, column, call.result, first, pipeline,
                                       label, finish, agreed, None)
        if self.meets(call, pipeline):
            exchange, column, first, gather_call = call.halves(pipeline.rank, pipeline.size,
                                                               self._column)

            def gather() -> Any:
                return gather_call.launch(pipeline, label, None)
            out = call.out[first:first + column.shape[1]]
            return self._start_meeting(exchange, column, out, first, pipeline, label,
                                       finish, agreed, gather)
        return self._start_words(call, pipeline, label, finish, values, agreed)

    def _start_pipelined(self, call: CollectiveCall, pipeline: Any, label: str,
                         finish: Callable[[], None] | None, agreed: np.ndarray,
                         values: np.ndarray) -> ReproducibleRun:
        """Steps 2-4 as one schedule, the pipelined meet (:mod:`bmlmpi.schedules.meet`):
        each piece of this rank's block summed from the addends as they arrive
        (:class:`_MeetSum`), then sent on, in blocks of whole format blocks."""
        out = call.out
        reals = 2 if out.dtype.kind == "c" else 1
        _warm_sum(self.fmt, self.dtype)
        plans = pipeline.plans
        plan, key = plans.meet_plan(out.size, out.dtype, self.fmt.block // reals)
        tag_base = pipeline.call_numbers.take_tags(call.tag_kind, plans.sig_id(key))
        given, _ = call.schedule_buffers()
        run = start_allreduce(plan, out, _MeetSum(agreed, reals), tag_base, label, None,
                              given)
        defer_behind(run, (e.run for e in pipeline.calls_in_flight.active))
        return ReproducibleRun(run, None, _nothing, finish, (agreed, values))

    def pipelines(self, call: CollectiveCall, pipeline: Any) -> bool:
        """Whether ``call`` is an allreduce this carrier sums by the pipelined meet: in any
        form, on a communicator that does not keep its calls (the plain policy) with more
        than one rank, into a contiguous result, where its algorithm does not serve the
        all-to-all (``bml``, ``ring``, ``tree``, ``multitree``, ...: the values would
        otherwise travel by ``pairwise``, their sum wait for the whole exchange, and the
        allgather for the whole sum). One schedule run, started as the words' call would
        be: any form may take it."""
        return (pipeline.size > 1 and not pipeline.policy.keeps_calls
                and call.meet_serves())

    @staticmethod
    def _start_meeting(exchange: CollectiveCall, column: np.ndarray, out: np.ndarray,
                       first: int, pipeline: Any, label: str,
                       finish: Callable[[], None] | None, agreed: np.ndarray,
                       gather: Callable[[], Any] | None) -> ReproducibleRun:
        """Steps 2-4 where the addends meet: the values' all-to-all (``exchange``, into
        ``column``), this rank's block summed from its column into ``out`` (its first value
        the input's ``first``; :func:`bmlmpi.reproducible.format.sum_contributions`, the
        special bytes from the addends themselves, nothing more exchanged), then ``gather``
        (an allreduce's allgather) where given."""
        run = exchange.launch(pipeline, label, None)
        defer_behind(run, (e.run for e in pipeline.calls_in_flight.active))
        start = first * (2 if out.dtype.kind == "c" else 1)

        def decode() -> None:
            rf.sum_contributions(column, agreed, out=out, start=start)
        return ReproducibleRun(run, None, decode, finish, (column, agreed), gather)

    def _start_words(self, call: CollectiveCall, pipeline: Any, label: str,
                     finish: Callable[[], None] | None, values: np.ndarray,
                     agreed: np.ndarray) -> ReproducibleRun:
        """Steps 2-5 on words: the input encoded, the special bytes' exchange, the words'
        call of the same collective, the decode of this rank's result."""
        fmt = self.fmt
        comm = pipeline.comm
        words = self._words_buffer(self.words(values.size, values.dtype))
        rf.encode(values, agreed, out=words.reshape(-1, fmt.words) if fmt.words > 1
                  else words)
        reals = words.size // fmt.words
        flagged = rf.flagged(agreed, reals, fmt) if agreed[:, 1].any() else None
        specials = req = local = None
        if flagged is not None:
            local = rf.specials(values, agreed)[flagged]
            specials = np.empty_like(local)
            req = comm.Iallreduce(local, specials, MPI.BOR)
        reals_per_value = 2 if values.dtype.kind == "c" else 1
        per_value = reals_per_value * fmt.words
        words_call, summed, out, first = call.carried(words, per_value, pipeline.rank,
                                                      pipeline.size)
        words_run = words_call.launch(pipeline, label, None)
        if not pipeline.policy.keeps_calls:
            defer_behind(words_run, (e.run for e in pipeline.calls_in_flight.active))
        start = first * reals_per_value   # the output's first real position

        def decode() -> None:
            if summed is None:
                return
            n = summed.size // fmt.words
            special = None
            if flagged is not None:
                everywhere = np.zeros(reals, np.uint8)
                everywhere[flagged] = specials
                special = everywhere[start:start + n]
            rf.decode(summed.reshape(-1, fmt.words) if fmt.words > 1 else summed, agreed,
                      out.dtype, special, out=out, start=start)
        return ReproducibleRun(words_run, req, decode, finish, (words, local, specials))

    def _column(self, shape: tuple[int, int]) -> np.ndarray:
        """The column an allreduce summed where its addends meet receives (the kept one, as
        :meth:`_words_buffer`)."""
        kept = self.kept
        if kept is not None and kept.shape == shape and kept.dtype == self.dtype:
            return kept
        column = np.empty(shape, self.dtype)
        if self.keeps:
            self.kept = column
        return column

    def scatters(self, call: CollectiveCall, pipeline: Any) -> bool:
        """Whether ``call`` is a reduce-scatter this carrier sums where its addends meet: the
        values' all-to-all (:meth:`bmlmpi.calls.CollectiveCall.meeting`), then this rank's
        block summed from its column into its result, on a communicator that does not keep
        its calls (the plain policy) with more than one rank, in any form (blocking, ``I…``,
        persistent: one exchange, started where the words' call would start)."""
        return (call.collective == "reduce_scatter" and pipeline.size > 1
                and not pipeline.policy.keeps_calls and call.result is not None
                and call.result.flags.c_contiguous and call.result.ndim == 1)

    def meets(self, call: CollectiveCall, pipeline: Any) -> bool:
        """Whether ``call`` is an allreduce this carrier sums where its addends meet by its
        algorithm's own all-to-all and allgather (:meth:`bmlmpi.calls.CollectiveCall.
        halves`; the others take :meth:`pipelines`): every rank sends block j of its own
        values straight to rank j (an all-to-all: 4 bytes a float32 value on the wire, as a
        plain reduce-scatter's, where the words took 8), each rank sums its block from the
        column it received in one pass (encode, exact sum and decode fused; no words in
        memory, no special bytes' exchange), then the summed values' allgather. The result
        only asks that every addend be truncated once at the agreed cut and the integers
        summed exactly, not where: the bits are those of the words' sum. Only a blocking
        call (:attr:`blocking`) on a communicator that does not keep its calls (the plain
        policy) whose algorithm serves the all-to-all, the reduce-scatter and the allgather
        (``shm``, ``hierarchical``, ``native``: MPI's ``Alltoall`` and ``Allgather``), with
        more than one rank: the
        allgather's start waits for the all-to-all, and a call started while others of this
        communicator may start theirs would make that start's place among them differ
        between ranks (MPI pairs a communicator's collectives in the order they start)."""
        return (self.blocking and pipeline.size > 1 and not pipeline.policy.keeps_calls
                and call.halves_serve() and call.alltoall_serves())


#: the dtypes whose fused sum of addends apart this process compiled (or loaded)
_WARM: set[np.dtype] = set()


def _warm_sum(fmt: rf.Format, dtype: np.dtype) -> None:
    """Compile the pipelined meet's fused sum for ``dtype`` (its one-thread form; from
    numba's disk cache, milliseconds, where it holds it) before the run posts anything, on
    every rank alike: compiled at a reduction instead, a rank that owns addends would
    compile (tens of seconds with a cold cache) while the others wait for it under their
    deadline. Not the parallel form: running it starts numba's thread pool, after which a
    torch training process computed other gradients (the reproducible run of
    jobs/train_torch.py at N = 3 ended with other parameters; why torch's numbers change
    was not established); it compiles where a piece is large enough to take it."""
    if dtype in _WARM:
        return
    one = np.zeros(fmt.block, dtype)
    rf.sum_addends(one, one.copy(), [0], rf.block_exponents(one), parallel=False)
    _WARM.add(dtype)


def _nothing() -> None:
    """The pipelined meet's decode: its run summed and gathered everything."""


class _MeetSum:
    """The pipelined meet's reduction (:class:`bmlmpi.execute.RangeSum`): a range's addends
    (this rank's, and every other rank's as received) summed at once at the agreed cuts,
    one fused pass (:func:`bmlmpi.reproducible.format.sum_addends`)."""

    __slots__ = ("agreed", "reals")

    def __init__(self, agreed: np.ndarray, reals: int):
        self.agreed = agreed
        #: real positions a value (2: complex)
        self.reals = reals

    def sum_range(self, first: np.ndarray, scratch: np.ndarray, offsets: tuple[int, ...],
                  out: np.ndarray, start: int) -> None:
        rf.sum_addends(first, scratch, offsets, self.agreed, start=start * self.reals,
                       out=out)


class _GivenUp:
    """The block exponents' MAX given up at its deadline, as the communicator holds a run MPI
    may still use: its request and the arrays MPI may still read and write."""

    __slots__ = ("reqs", "arrays")

    def __init__(self, req: MPI.Request, arrays: tuple):
        self.reqs = [req]
        self.arrays = arrays

    def cancel(self, bound: float = 0.0) -> list[MPI.Request]:
        return self.reqs


def _exchange(pipeline: Any, req: MPI.Request, label: str, arrays: tuple) -> None:
    """Wait for the block exponents' MAX under the communicator's deadline, advancing its
    outstanding calls meanwhile (a rank waiting on one of them needs this rank's progress
    before it starts this call); an MPI failure is raised as it is (a fault-tolerant policy
    notes it). Past the deadline the plain communicator gives the call up as it gives up a
    run (its arrays held, the others told, the communicator revoked) and the
    DeadlineExceeded is raised."""
    plain = not pipeline.policy.keeps_calls
    in_flight = pipeline.calls_in_flight

    def done() -> bool:
        if plain:
            in_flight.progress()
        return req.Test()
    try:
        wait_for(done, pipeline.timeout,
                 lambda t: f"{label}: the reproducible block exponents' MAX did not complete "
                           f"within {t:g} s (every rank starts the call)",
                 progress=pipeline.policy.progress_mark)
    except DeadlineExceeded as exc:
        if plain:
            agreement = in_flight.agreement
            agreement.held.append(_GivenUp(req, arrays))
            agreement.gave_up(pipeline.call_numbers.callno, exc)
        raise


class ReproducibleFormat:
    """The registered ``"reproducible"`` call format: float SUM and AVG carried as exact
    integer words; integers, MIN and MAX pass through (already reproducible); PROD refused."""

    name = "reproducible"

    def carrier(self, dtype: np.dtype, op: str) -> ReproducibleCarrier | None:
        """The carrier of a call of ``dtype`` and ``op`` (a bmlmpi op name), None where it
        passes through; :class:`ReproducibleRefused` for PROD on floating-point values."""
        dt = np.dtype(dtype)
        if dt.kind not in "fc" or op in ("min", "max"):
            return None
        if op not in ("sum", "avg"):
            raise ReproducibleRefused(f"reproducible mode sums exactly: {op.upper()} has no "
                                      f"exact integer form (SUM, AVG, MIN and MAX are "
                                      f"taken; or reproducible=False)")
        try:
            return ReproducibleCarrier(rf.format_for(dt), dt)
        except TypeError as exc:
            raise ReproducibleRefused(str(exc)) from None


_FORMATS: dict[str, Any] = {}


def register(fmt: Any) -> Any:
    """Add a call format (its ``name`` new; ``carrier(dtype, op)`` as
    :meth:`ReproducibleFormat.carrier`); returns it."""
    if fmt.name in _FORMATS:
        raise ValueError(f"call format {fmt.name!r} is already registered")
    _FORMATS[fmt.name] = fmt
    return fmt


def get(name: str) -> Any:
    """The call format called ``name``; ValueError naming the registered ones otherwise."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown call format {name!r}; formats: {', '.join(_FORMATS)}"
                         ) from None


REPRODUCIBLE = register(ReproducibleFormat())

__all__ = ["REPRODUCIBLE", "ReproducibleCarrier", "ReproducibleFormat", "ReproducibleRefused",
           "ReproducibleRun", "get", "register"]
