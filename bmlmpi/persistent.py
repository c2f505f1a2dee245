"""Persistent collectives (MPI 4's ``MPI_Allreduce_init`` and kin, mpi4py's ``Prequest``).

``req = c.Allreduce_init(sendbuf, recvbuf, op)`` (and ``Reduce_scatter_block_init``,
``Reduce_scatter_init``, ``Allgather_init``, ``Allgatherv_init``, ``Reduce_init``,
``Bcast_init``) checks the arguments on every rank and across ranks once, picks the algorithm
(``auto`` decided once) and compiles the plan once: a schedule's
:class:`~bmlmpi.execute.Plan`, or for ``native`` the MPI library's own persistent request
(``comm.Allreduce_init`` …). Then, as often as wanted::

    req.Start(); ...; req.Wait()      # or Test() until True

``Start`` checks only that the request is not already active (or freed) and that its
communicator was not freed (:class:`bmlmpi.CommunicatorFreed`); the buffers given at
``_init`` are read and written at every start, as MPI's persistent requests do: they must stay
alive, and keep their shape and dtype. ``Free`` releases it (not while active).
Every rank must start its persistent requests in the same order (MPI's rule for persistent
collectives). A start progresses like a non-blocking call: inside ``Test``/``Wait`` of any of
the communicator's requests, with the communicator's deadline. On a fault-tolerant
communicator every start is one call of its ledger, with that call's failure contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from .call_gate import CallGate
from .call_numbers import CallNumbers
from .calls import then
from .handles import NativePersistent, NativeRun


class PersistentRequest:
    """A persistent collective: ``Start``, ``Test``, ``Wait``, ``Free`` as ``MPI.Prequest``."""

    __slots__ = ("_start", "_call", "_compiled", "_entry", "_freed")

    def __init__(self, start: Callable[[Any, Any], Any], call: Any, compiled: Any):
        self._start = start        # the communicator's: (call, compiled) -> the outstanding start
        self._call = call          # the checked CollectiveCall
        self._compiled = compiled  # a Plan, an MPI Prequest (native), or None
        self._entry: Any = None    # the outstanding start, None while inactive
        self._freed = False

    @property
    def compiled(self) -> Any:
        """What each start runs, for instrumentation: a schedule's compiled plan, for
        ``native`` the MPI library's persistent request on buffers of bmlmpi's own
        (:class:`bmlmpi.api.NativePersistent`, its ``req``), or None (each start then posts
        the non-blocking call; a fault-tolerant communicator compiles per attempt)."""
        return self._compiled

    @property
    def active(self) -> bool:
        """Started and not yet completed by ``Test``/``Wait``."""
        return self._entry is not None

    def Start(self) -> None:
        """Start the collective once more with the buffers given at ``_init``."""
        if self._freed:
            raise ValueError("Start of a freed persistent request")
        if self._entry is not None:
            raise ValueError("Start of an active persistent request: Wait for (or Test until "
                             "True) the previous start first")
        self._entry = self._start(self._call, self._compiled)

    def Test(self) -> bool:
        """Advance the communicator's calls; True once this start is complete (and for an
        inactive request, as MPI's ``Test``). A ``Test`` that raises (the start's outcome on a
        fault-tolerant communicator, a deadline) leaves the request inactive, as ``Wait``."""
        entry = self._entry
        if entry is None:
            return True
        try:
            done = entry.test()
        except BaseException:
            self._entry = None
            raise
        if done:
            self._entry = None
        return done

    def Wait(self) -> None:
        """Return once this start is complete (at once for an inactive request);
        :class:`bmlmpi.DeadlineExceeded` after the communicator's ``timeout`` without
        progress, after which the request is inactive again."""
        entry = self._entry
        if entry is None:
            return
        try:
            entry.wait()
        finally:
            self._entry = None

    def Free(self) -> None:
        """Release the request (and the MPI library's own for native); not while active."""
        if self._entry is not None:
            raise ValueError("Free of an active persistent request: Wait for it first")
        if not self._freed:
            self._freed = True
            free = getattr(self._compiled, "Free", None)
            if free is not None:
                free()
            self._compiled = None

    start = Start
    test = Test
    wait = Wait
    free = Free


def native_init(call: Any, comm: MPI.Comm) -> NativePersistent | None:
    """The MPI library's persistent request on ``comm`` for a native call (a checked
    allreduce or family call), on buffers of its own (:class:`~bmlmpi.handles.
    NativePersistent`); None where the library has none (each start then posts the
    non-blocking call)."""
    try:
        return NativePersistent(*call.native_private(comm, "_init"))
    except (NotImplementedError, AttributeError):
        return None
    except MPI.Exception as exc:
        if exc.Get_error_class() == MPI.ERR_UNSUPPORTED_OPERATION:
            return None
        raise


class PersistentCalls:
    """Checked calls of one communicator made persistent and started. ``owner``: the
    :class:`~bmlmpi.api.Communicator` (its ``comm``, ``rank``, ``size``, its ``policy``, which
    starts each call and notes MPI failures, its flight recorder through ``record`` and its
    outstanding calls, ``calls_in_flight``); ``agreement``: its
    :class:`~bmlmpi.call_agreement.CallAgreement`, which numbers and checks each call;
    ``plain``: the plain communicator, which compiles once (a policy that keeps every call
    itself compiles per attempt)."""

    def __init__(self, owner: Any, plans: Any, gate: CallGate, numbers: CallNumbers,
                 agreement: Any, *, plain: bool):
        self.owner = owner
        self.plans = plans          # the owner's PlanCache
        self.gate = gate
        self.numbers = numbers      # the owner's call numbers and tag slots
        self.agreement = agreement
        self.plain = plain

    def make(self, call: Any) -> PersistentRequest:
        """Agree on ``call`` across ranks now and compile it once. The agreement is made at
        every ``_init``, even of a signature already agreed on: a rank whose arguments fail
        its local check makes every rank's ``_init`` raise."""
        with self.owner.policy.failure_noted():
            self.agreement.validate(call, None, always=True)
        compiled = None
        if self.plain and call.wire is None:  # a carried call's carrier starts it each time
            if call.algorithm == "native":
                compiled = native_init(call, self.owner.comm)
            else:
                compiled = call.compiled(self.plans)
        return PersistentRequest(self.claimed_start, call, compiled)

    def claimed_start(self, call: Any, compiled: Any) -> Any:
        """One start, as the communicator's policy makes it
        (:meth:`~bmlmpi.call_policy.CallPolicy.start_persistent`), as one call: the
        communicator claimed, so a second thread inside a call, or a freed communicator,
        raises before anything starts."""
        owner, gate = self.owner, self.gate
        mine = gate.claim(owner.rank)
        try:
            return owner.policy.start_persistent(call, compiled)
        finally:
            gate.release(mine)

    def start(self, call: Any, compiled: Any) -> Any:
        """One start of a persistent call: no argument check, the compiled plan or the MPI
        library's persistent request; the returned record is polled like an Iallreduce."""
        owner = self.owner
        size = owner.size

        def finish() -> None:
            call.finish(size)

        # a start is a call: numbered alike on every rank; refused on a revoked
        # communicator, and after another rank's argument error as any call is
        seq = self.agreement.begin_call()
        label = (f"bmlmpi persistent {call.algorithm} {call.collective} (rank {owner.rank}, "
                 f"call {seq})")
        if isinstance(compiled, NativePersistent):
            compiled.req.Start()
            run: Any = NativeRun(compiled.req, then(compiled.deliver, finish), owner.rank, label)
        else:  # the plan cached at init (bound again after a repair) or nothing compiled
            run = call.launch(owner, label, finish)
        return owner.calls_in_flight.start(run, seq, owner.call_log.record(call))
