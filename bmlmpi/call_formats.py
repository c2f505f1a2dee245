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
2. the input encoded at the agreed cuts into int64 words (a buffer of the carrier's own;
   the caller's buffers are read, not written, until the end);
3. where a block is flagged (a NaN, an infinity or a -0 in it on some rank): the special
   bytes of those blocks' elements OR-reduced (``MPI_Iallreduce`` of uint8, started here);
4. the words' integer SUM: the same collective's plain call of the words
   (:meth:`bmlmpi.calls.CollectiveCall.carried`), the call's algorithm run by the same
   launch;
5. once both exchanges completed: the words decoded into the caller's result (a
   reduce-scatter's block of this rank, a reduce's on the root), rounded once.

Every rank issues the two small exchanges and starts the words' call in the same order as
its calls, so MPI's collectives on the communicator pair up across ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .calls import CollectiveCall
from .execute import DeadlineExceeded, wait_for
from .executors import defer_behind
from .reproducible import format as rf


class ReproducibleRefused(ValueError):
    """A reproducible call with an op that has no exact integer form (PROD), or with
    compression: refused on every rank before anything is sent (docs/reproducible.md)."""


class ReproducibleRun:
    """A reproducible call's run: the words' run (any executor's, or MPI's own call), the
    special bytes' exchange, then the decode into the caller's result and ``finish``. Polled
    as any run (``test``, ``progress``, ``reqs``, ``cancel``, ``describe_timeout``).
    ``held``: the arrays MPI may read or write until the exchanges complete (the words sent,
    the special bytes sent), kept as long as the run is (a call given up at its deadline
    keeps its run, so MPI never touches freed memory)."""

    __slots__ = ("words_run", "specials", "decode", "finish", "step", "held")

    def __init__(self, words_run: Any, specials: MPI.Request | None,
                 decode: Callable[[], None], finish: Callable[[], None] | None,
                 held: tuple = ()):
        self.words_run = words_run
        self.specials = specials
        self.decode = decode
        self.finish = finish
        self.step = 0
        self.held = held

    def test(self) -> bool:
        if self.step == 0 and self.words_run.test():
            self.step = 1
        if self.step == 1 and (self.specials is None or self.specials.Test()):
            self.decode()
            if self.finish is not None:
                self.finish()
            self.step = 2
        return self.step == 2

    @property
    def progress(self) -> int:
        """Grows with every step of the words' run and of this run (a count, as a Run's)."""
        return self.words_run.progress + self.step

    @property
    def reqs(self) -> list[MPI.Request]:
        extra = [] if self.specials is None else [self.specials]
        return [*self.words_run.reqs, *extra]

    def cancel(self, bound: float = 0.0) -> list[MPI.Request]:
        extra = [] if self.specials is None else [self.specials]
        return [*self.words_run.cancel(bound), *extra]

    def describe_timeout(self, timeout: float) -> str:
        if self.step == 0:
            return f"reproducible words: {self.words_run.describe_timeout(timeout)}"
        return f"the reproducible special values' exchange made no progress in {timeout:g} s"


class ReproducibleCarrier:
    """One reproducible call's carrier: the format of its dtype (:class:`bmlmpi.
    reproducible.format.Format`; complex values as two real positions)."""

    __slots__ = ("fmt",)
    name = "reproducible"

    def __init__(self, fmt: rf.Format):
        self.fmt = fmt

    def words(self, count: int, dtype: np.dtype) -> int:
        """How many int64 words carry ``count`` values of ``dtype``."""
        reals = count * (2 if np.dtype(dtype).kind == "c" else 1)
        return reals * self.fmt.words

    def start(self, call: CollectiveCall, pipeline: Any, label: str,
              finish: Callable[[], None] | None) -> ReproducibleRun:
        """Start ``call`` (an allreduce, reduce-scatter or reduce this carrier carries) on
        ``pipeline`` (its communicator: ``comm``, ``rank``, ``size``, ``timeout``,
        ``policy``, ``calls_in_flight``): the steps of the module docstring, the words' call
        being the same collective's (:meth:`bmlmpi.calls.CollectiveCall.carried`); ``finish``
        runs after the decode."""
        fmt = self.fmt
        given, _ = call.schedule_buffers()
        values = call.out if given is None else given
        comm = pipeline.comm
        mine = rf.block_exponents(values)
        agreed = np.empty_like(mine)
        _exchange(pipeline, comm.Iallreduce(mine, agreed, MPI.MAX), label, (mine, agreed))
        words = np.empty(self.words(values.size, values.dtype), np.int64)
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
        words_call, summed, out, first = call.carried(words, reals_per_value * fmt.words,
                                                      pipeline.rank, pipeline.size)
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
            return ReproducibleCarrier(rf.format_for(dt))
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
