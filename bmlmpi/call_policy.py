"""What differs under failures, as one object the call pipeline calls: :class:`CallPolicy`.

A :class:`~bmlmpi.api.Communicator` holds one policy (its public ``policy``) and calls it at
the few points of a call's life where the plain and the fault-tolerant communicator differ:
the communicators it builds (the control channel, the BCube levels), whether a call may start
on this rank, how a family call's arguments are read, how a started call is tracked, how a
schedule is bound, what an MPI error means, and what shows progress to a waiter. The class
here is the plain communicator's policy: every call is tracked once until it completes, and
an MPI error is raised. :class:`bmlmpi.ft.policy.FaultTolerantPolicy` is the other: it keeps
every call in a ledger until every survivor commits it and replaces the communicator by the
survivors' after a failure. The communicators differ only in the policy they hold.

A policy reaches the pipeline through the communicator it serves (:meth:`CallPolicy.attach`)
and that communicator's public methods; the pipeline reaches the policy only through the
methods below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from mpi4py import MPI

from .handles import Request
from .pair_tables import PairTables
from .placement import split_levels
from .schedules import algorithms


class CallPolicy:
    """The plain communicator's policy (module docstring); a policy for another regime
    subclasses it and overrides the methods whose contract it changes."""

    #: Whether every call is agreed across ranks before it starts, whatever ``check`` says
    #: (the fault-tolerant policy's calls are: an agreement must never meet a data message).
    agrees_every_call: bool = False
    #: Whether the policy keeps every call itself to run it again (then the pipeline opens no
    #: fast path and compiles a persistent call at each start, over the members of then).
    keeps_calls: bool = False

    def attach(self, pipeline: Any) -> None:
        """Serve ``pipeline`` (the :class:`~bmlmpi.api.Communicator` being built), once its
        parts exist; the policy reads and calls only its public side."""
        self.pipeline = pipeline
        #: the ``Alltoallv`` counts it gathered (:meth:`pair_counts`)
        self.pair_tables = PairTables()

    # -- the communicators a communicator builds ----------------------------------------------
    def control_channel(self, data: MPI.Comm) -> MPI.Comm:
        """The communicator agreements and notices travel on, given the data communicator:
        here a duplicate of it, so that no agreement can ever match a data message."""
        control = data.Dup()
        control.Set_errhandler(MPI.ERRORS_RETURN)
        return control

    def levels(self, data: MPI.Comm, shape: Sequence[int], rank: int) -> list[MPI.Comm]:
        """The BCube level communicators of ``data`` (one per level: the ranks sharing all
        digits but that level's); a policy may make none."""
        return split_levels(data, shape, rank)

    # -- a call's life ----------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise, before anything is numbered or sent, where this rank may not start a call
        (the fault-tolerant policy's rank masked out); here every rank may."""

    def prepare_family(self, collective: str, algorithm: str | None,
                       build: Callable[[str], Any], engine: Any,
                       frame: tuple[int, ...] | None = None) -> Any:
        """A family call's checked record, its arguments read by ``build`` and checked by
        ``engine`` (:meth:`bmlmpi.family.FamilyEngine.prepare`: raising on every rank when
        one rank's are wrong); here the arguments are for the current members (``frame``,
        what :meth:`pair_counts` returned, is None here)."""
        return engine.prepare(collective, algorithm, build)

    def pair_counts(self, row_and_column: Callable[[int], Any]) -> tuple[Any, Any]:
        """An ``Alltoallv``'s counts from every rank: ``row_and_column(size)`` is this rank's
        ``2·size`` int64 (what it sends each rank, then what it receives from each) for a
        call over ``size`` ranks; returns the ``size × 2·size`` table of every rank's and the
        members the call's arguments are for, to be handed to :meth:`prepare_family` (here
        None: the current ones). Here the communicator's own ``Allgather``, once per set of
        counts: a repeated exchange agrees on a digest instead (:mod:`bmlmpi.pair_tables`)."""
        pipeline = self.pipeline
        return self.pair_tables.agreed(row_and_column(pipeline.size), pipeline), None

    def submit(self, call: Any) -> Any:
        """``call`` (prepared and numbered) entered in the flight recorder, then started and
        tracked (:meth:`track`): its :class:`~bmlmpi.handles.Request`. What every checked
        call, blocking or ``I…``, is started with."""
        log = self.pipeline.call_log
        log.record(call)
        try:
            return Request(self.track(call))
        except BaseException as exc:
            log.failed(call.slot, exc)
            raise

    def track(self, call: Any) -> Any:
        """Start ``call`` (prepared, numbered and entered in the flight recorder) and return
        the record its :class:`~bmlmpi.handles.Request` polls (a
        :class:`~bmlmpi.handles.CallRecord`); an argument mismatch raises here on every rank.
        Here: agreed and started once, then tracked until it completes."""
        pipeline = self.pipeline
        seq = pipeline.call_numbers.callno
        label = (f"bmlmpi {call.algorithm} {call.collective} (rank {pipeline.rank}, "
                 f"call {seq})")
        run = pipeline.check_and_launch(call, label, lambda: call.finish(pipeline.size))
        return pipeline.calls_in_flight.start(run, seq, call.slot)

    def start_persistent(self, call: Any, compiled: Any) -> Any:
        """One start of a persistent call made and agreed at its ``…_init`` (``compiled``:
        its plan, None where the policy compiles per start): the record polled, as
        :meth:`track`'s. Here: the plan compiled once is started as it is
        (:meth:`bmlmpi.persistent.PersistentCalls.start`)."""
        return self.pipeline.persistent_calls.start(call, compiled)

    def compile(self, algorithm: str, count: int, itemsize: int) -> Any:
        """``algorithm``'s allreduce schedule for ``count`` elements of ``itemsize`` bytes,
        bound to the communicator (a :class:`~bmlmpi.execute.Plan` or
        :class:`~bmlmpi.shm.ShmPlan`): here BCube levels on their own communicators,
        shared-memory steps on the node's window."""
        plans = self.pipeline.plans
        return plans.bind(plans.schedule(algorithm, count, itemsize), itemsize,
                          algorithms.get(algorithm).tiered)

    def settle_compressed(self, stages: Generator[list, None, Any], channel: Any, what: str,
                          abandon: Callable[[], None]) -> Generator[list, None, Any]:
        """Run the exchange ``stages`` of one compressed call (``what``) on ``channel``
        (:mod:`bmlmpi.compression.layer`), its result returned; where the policy cannot
        settle the call it calls ``abandon()`` (the call taken out of the compressor's memory,
        the channel's duplicate dropped) and raises. Here the stages run as they are."""
        return (yield from stages)

    # -- MPI errors and progress ------------------------------------------------------------
    @contextlib.contextmanager
    def failure_noted(self) -> Iterator[None]:
        """Where an MPI error inside the block is handled by the policy instead of raised
        (the fault-tolerant policy notes a failed process for the call's agreement); here
        every error propagates."""
        yield

    def is_failure(self, exc: MPI.Exception) -> bool:
        """Whether ``exc`` reports a failed process the policy recovers from (never here)."""
        return False

    def progress_mark(self) -> tuple:
        """A value that changes whenever outstanding work advances (a waiter's deadline
        counts from the last change): here any outstanding call completing a step."""
        return self.pipeline.calls_in_flight.mark()
