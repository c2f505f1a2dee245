"""How a communicator's ranks agree on its calls (docs/contracts.md): the construction's
agreement on the settings, each call's number with the control channel's notices looked at
first, the argument check (a signature's first call, or every call), and what a failure
leaves: calls abandoned on every rank after another rank's argument error (then a repair: a
fresh duplicate and agreed call numbers) or a communicator revoked after a deadline.

:class:`CallAgreement` belongs to one :class:`~bmlmpi.api.Communicator` (its ``owner``,
whose public ``rank``, ``size``, ``shape``, ``check``, ``validate``, ``timeout`` and
``control`` it reads); what it changes elsewhere it changes through the owner's public
methods (``abandon_calls``, ``move_to``).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from .agreement import DEADLINE, ERROR, MESSAGE_BYTES, TAG_ALARM, Mailbox, Message, decode
from .call_numbers import CallNumbers
from .calls import ArgumentMismatch, CollectiveCall, CommunicatorRevoked, RemoteArgumentError
from .execute import DeadlineExceeded, wait_request
from .finalize import bound_finalize
from .topology.bcube import format_shape


# A program repeats a handful of signatures; every checked call (the I… and persistent
# starts among them) hashes its own, which costs more than the rest of its check.
@functools.lru_cache(maxsize=1024)
def signature_hash(parts: tuple) -> int:
    """The 63-bit hash of a call's signature that ranks compare."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def agree_construction(comm: MPI.Comm, error: Exception | None, settings: tuple,
                       timeout: float) -> int:
    """One agreement on a new communicator's duplicate ``comm``: whether any rank's
    arguments failed (``error``), and whether every rank names the same ``settings`` (shape,
    algorithm, checking mode, validation: ranks that differ in these would exchange
    different messages: ``auto`` calibrates on the data communicator, a rank that does not
    validate never joins an agreement). Frees ``comm`` and raises on every rank when not.
    Returns the communicator's token (the largest of the ranks' random numbers), which its
    control messages carry (:class:`~bmlmpi.agreement.Mailbox`)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        if error is not None:
            comm.Free()
            raise error
        return 0
    h = 0 if error is not None else signature_hash(settings)
    vec = np.array([1 if error else 0, rank if error else -1, h, -h, secrets.randbits(62)],
                   dtype=np.int64)
    res = np.empty_like(vec)
    try:
        wait_request(comm.Iallreduce(vec, res, MPI.MAX), timeout,
                     "bmlmpi.Communicator: not every rank joined the argument check")
    except BaseException:
        comm.Free()
        raise
    if error is not None or res[0] or res[2] != -res[3]:
        mine = None
        if error is None:
            shape, algorithm, check, validate = settings
            mine = f"{format_shape(shape)}/{algorithm}/{check}/{'on' if validate else 'off'}"
        everyone = comm.allgather(mine)
        comm.Free()
        if error is not None:
            raise error
        if res[0]:
            raise RemoteArgumentError(
                f"rank {int(res[1])} rejected its bmlmpi.Communicator arguments (see its "
                f"error); the communicator was not built on any rank")
        lines = ", ".join(f"rank {r}: {w}" for r, w in enumerate(everyone))
        raise ArgumentMismatch(f"bmlmpi.Communicator: the ranks name different "
                               f"topologies, algorithms, checking modes or validation "
                               f"(topology/algorithm/check/validate: {lines}); the "
                               f"communicator was not built on any rank")
    return int(res[4])


#: What reading a rank's own arguments raises when they are wrong: besides value and type
#: errors, the lookup and attribute errors of malformed specs an exporter's own code trips
#: on, and the ImportError of a device buffer with no cupy to stage it. This rank's argument
#: error, announced to the others, never a hang.
ARGUMENT_ERRORS = (ValueError, TypeError, BufferError, LookupError, AttributeError,
                   ImportError)


class CallAgreement:
    """The agreement on one communicator's calls (``mailbox``: its control channel's
    posted receive, None where every call is agreed collectively)."""

    def __init__(self, owner: Any, numbers: CallNumbers, mailbox: Mailbox | None,
                 active: list):
        self.owner = owner
        self.numbers = numbers      # the communicator's call numbers and tag slots
        self.mailbox = mailbox
        self.active = active        # the outstanding calls (a fast path waits for none)
        self.revoked: str | None = None  # why every later call raises CommunicatorRevoked
        self.repair_after: int | None = None  # an argument error at this call: re-dup first
        self.held: list[Any] = []   # runs given up while MPI may still use their buffers
        self.handled = [0]  # the last call number whose failure this rank has raised
        self.abandoned_upto = 0  # calls up to this number are abandoned on every rank
        self.validated: set[int] = set()  # the signatures agreed on

    # -- call numbers and notices -------------------------------------------------------------
    def begin_call(self) -> int:
        """Number the call about to start (the same number on every rank). First deal with
        what the control channel has said: a communicator a deadline ended raises
        CommunicatorRevoked; one that an argument error left with abandoned calls is
        repaired (a fresh duplicate, every rank at its first call after learning of the
        error); a notice that this very call failed on another rank raises here, before
        any data moves."""
        numbers = self.numbers
        while True:
            if self.revoked is not None:
                numbers.take()  # a refused call takes its number, as every call does
                raise CommunicatorRevoked(self.revoked)
            if self.repair_after is not None:
                self.repair()
            # a notice about this very call is looked at after the local check (validate):
            # a rank whose own arguments are wrong too raises its own error
            if self.notice(numbers.callno) is None:
                break
        n = numbers.take()
        if n <= self.abandoned_upto:
            raise RemoteArgumentError(
                f"call {n} was started on another rank before it learnt that call "
                f"{self.handled[0]} failed, so it is abandoned on every rank (docs/contracts.md)")
        return n

    def notice(self, upto: int) -> Message | None:
        """The first failure notice not yet handled about a call numbered ``upto`` or lower,
        handled now (outstanding calls it dooms are marked failed; the communicator is
        flagged for repair or revoked); None when there is none."""
        mailbox = self.mailbox
        if mailbox is None:
            return None
        msg = mailbox.failure(self.handled[0] + 1)
        if msg is None or msg.seq > upto:
            return None
        exc = self.remote_error(msg)
        if msg.kind == DEADLINE:
            self.revoke(msg.seq, str(exc))
        else:
            self.abandon_from(msg.seq, exc)
            self.repair_after = msg.seq
        return msg

    def notice_waiting(self, upto: int) -> bool:
        """Whether a failure notice not yet handled about a call numbered ``upto`` or lower
        has arrived: looked at, not handled (a fast path then hands the call to the checked
        path, whose numbering and argument check handle it: a notice about the very call it
        starts raises there, before any data moves)."""
        mailbox = self.mailbox
        if mailbox is None:
            return False
        msg = mailbox.failure(self.handled[0] + 1)
        return msg is not None and msg.seq <= upto

    @staticmethod
    def remote_error(msg: Message) -> Exception:
        if msg.kind == DEADLINE:
            return CommunicatorRevoked(
                f"rank {msg.rank} gave up call {msg.seq} at its deadline ({msg.text}); the "
                f"call is abandoned on every rank and the communicator is revoked: Free() it "
                f"and build another (docs/contracts.md)")
        return RemoteArgumentError(
            f"rank {msg.rank} rejected its arguments at call {msg.seq} ({msg.text}); this "
            f"call is abandoned on all ranks")

    def interrupt(self, seq: int) -> Callable[[], None]:
        """The wait loops' check of the control channel for call ``seq``: raises once a
        notice says this call (or an earlier one) failed on another rank."""
        def check() -> None:
            msg = self.notice(seq)
            if msg is not None:
                raise self.remote_error(msg)
        return check

    def fast_open(self) -> bool:
        """Whether a blocking call may take a fast path now: nothing outstanding, the
        communicator neither revoked nor due for a repair, no call abandoned ahead."""
        return (not self.active and self.revoked is None and self.repair_after is None
                and self.numbers.callno >= self.abandoned_upto)

    # -- failures -----------------------------------------------------------------------------
    def abandon_from(self, seq: int, exc: BaseException) -> None:
        """Calls numbered ``seq`` or later that this rank started are given up: each raises
        ``exc`` when waited on; MPI keeps what it may still use (:attr:`held`)."""
        self.handled[0] = max(self.handled[0], seq)
        self.owner.abandon_calls(seq, exc)

    def hold(self, run: Any) -> None:
        """A run given up: cancelled, and kept while MPI may still use its buffers."""
        if run is not None and run.cancel():
            self.held.append(run)

    def revoke(self, seq: int, why: str) -> None:
        self.abandon_from(seq, CommunicatorRevoked(why))
        self.revoked = why

    def gave_up(self, seq: int, exc: DeadlineExceeded) -> None:
        """This rank gave up call ``seq`` at its deadline: tell the others (a late rank then
        does not join it), revoke the communicator here, and bound this process's
        ``MPI_Finalize`` (a stopped peer would otherwise keep it waiting for ever)."""
        bound_finalize(self.owner.timeout)
        if self.mailbox is not None and self.revoked is None:
            self.mailbox.announce(seq, DEADLINE, describe_error(exc)[:300], also_tag=TAG_ALARM)
        if self.revoked is None:
            self.revoke(seq, f"this rank gave up call {seq} at its deadline ({exc}); the "
                             f"communicator is revoked: Free() it and build another "
                             f"(docs/contracts.md)")

    def repair(self) -> None:
        """After an argument error abandoned calls: move to a fresh duplicate (the old one
        may still hold those calls' messages), and agree on the call numbers, so that a
        call another rank had already started before it learnt of the error is abandoned on
        every rank instead of pairing with a different call."""
        failed, timeout = self.repair_after, self.owner.timeout
        control = self.owner.control
        new, req = control.Idup()
        wait_request(req, timeout, f"bmlmpi: not every rank came back after call {failed}'s "
                                   f"argument error (the communicator's repair)")
        numbers = self.numbers
        counts = np.array([numbers.callno, numbers.launches], dtype=np.int64)
        agreed = np.empty_like(counts)
        wait_request(control.Iallreduce(counts, agreed, MPI.MAX), timeout,
                     "bmlmpi: not every rank joined the communicator's repair")
        new.Set_errhandler(MPI.ERRORS_RETURN)
        self.owner.move_to(new)
        self.abandoned_upto = int(agreed[0])
        numbers.agree_tags(int(agreed[1]))
        self.repair_after = None

    # -- the argument check -------------------------------------------------------------------
    def prepared(self, prepare: Callable[..., CollectiveCall], *args: Any) -> CollectiveCall:
        """Number the call about to start (:meth:`begin_call`), then read its arguments:
        ``prepare(*args)``, its record. Arguments it refuses (:data:`ARGUMENT_ERRORS`) are
        this rank's error, announced to the others (who raise
        :class:`~bmlmpi.calls.RemoteArgumentError` in their check) and raised here."""
        self.begin_call()
        try:
            return prepare(*args)
        except ARGUMENT_ERRORS as exc:
            self.announce_refusal(exc)
            raise

    def refuse(self, exc: Exception) -> NoReturn:
        """A call refused before it had arguments to read (an unknown algorithm name):
        numbered as every call, and ``exc`` announced to the others like any other
        argument error, then raised."""
        self.begin_call()
        self.announce_refusal(exc)
        raise exc

    def announce_refusal(self, exc: Exception) -> None:
        """This rank's argument error ``exc`` for the call just numbered, told to the others
        (under the policy's ``failure_noted``: a failure the notice meets is noted, not
        raised); raises ``exc`` where nobody needs telling or the check is collective."""
        with self.owner.policy.failure_noted():
            self.validate(None, exc)

    def validate(self, call: Any, error: Exception | None, always: bool = False) -> None:
        """Agree across ranks that the call is well-formed; raise on every rank if not
        (:mod:`bmlmpi.agreement`: the first call of a signature, or every call; ``always``:
        this call whatever the signature)."""
        owner = self.owner
        if owner.size == 1:
            if error is not None:
                raise error
            return
        if owner.check == "every-call":
            self.agree_collectively(call, error)
            return
        seq = self.numbers.callno
        if error is not None:
            # no wait: the others learn of it from the notice, wherever they wait
            self.mailbox.announce(seq, ERROR, describe_error(error), also_tag=TAG_ALARM)
            self.abandon_from(seq, error)
            self.repair_after = seq
            raise error
        self.interrupt(seq)()   # another rank already rejected this call
        if not owner.validate:
            return
        sig = call.signature(owner.shape)
        h = signature_hash(sig)
        if h in self.validated and not always:
            return
        text = call.describe_signature(sig)
        try:
            got = self.mailbox.gather(
                seq, h, text, owner.timeout,
                lambda t: f"bmlmpi argument check of call {seq}: not every rank joined within "
                          f"{t:g} s (a rank is missing, or runs a call whose signature was "
                          f"already checked)", DeadlineExceeded)
        except DeadlineExceeded as exc:
            self.gave_up(seq, exc)
            raise
        self.interrupt(seq)()
        if any(m.value != h for m in got.values()):
            lines = "; ".join(f"rank {r}: {got[r].text}" for r in sorted(got))
            raise ArgumentMismatch(f"{call.collective} arguments differ across ranks: {lines}")
        self.validated.add(h)

    def agree_collectively(self, call: Any, error: Exception | None) -> None:
        """Every call's agreement: one Iallreduce on the control communicator, which every
        rank makes for every call (the rank with an error included) before any data moves."""
        owner = self.owner
        sig, h = None, 0
        if call is not None:
            sig = call.signature(owner.shape)
            h = signature_hash(sig)
        vec = np.array([h, -h, 1 if error else 0, owner.rank if error else -1], dtype=np.int64)
        res = np.empty_like(vec)
        control = self.owner.control
        callno = self.numbers.callno
        try:
            wait_request(control.Iallreduce(vec, res, MPI.MAX), owner.timeout,
                         f"bmlmpi argument check of call {callno}: other ranks did not join")
        except DeadlineExceeded as exc:
            self.gave_up(callno, exc)
            raise
        if error is not None:
            raise error
        if res[2]:
            raise RemoteArgumentError(f"rank {res[3]} rejected its {call.collective} "
                                      f"arguments (see its error); this call is abandoned "
                                      f"on all ranks")
        if res[0] != -res[1]:
            everyone = control.allgather(sig)
            lines = "; ".join(f"rank {r}: {CollectiveCall.describe_signature(s)}"
                              for r, s in enumerate(everyone))
            raise ArgumentMismatch(f"{call.collective} arguments differ across ranks: {lines}")

    def agreed(self, call: Any) -> bool:
        """Whether ``call``'s signature was agreed on by every rank before (else it goes
        through the checked path, whose agreement raises on every rank if it differs)."""
        owner = self.owner
        return (not owner.validate or owner.size == 1
                or signature_hash(call.signature(owner.shape)) in self.validated)

    def alarm_channel(self) -> Callable[[], str | None] | None:
        """What the watchdog polls while a blocking MPI collective is in progress: a posted
        receive of the notices' second copy (:data:`~bmlmpi.agreement.TAG_ALARM`), only ever
        tested by the watchdog thread (needs MPI_THREAD_MULTIPLE). It answers only for a
        notice about the call in progress or an earlier one: a rank whose part of a reduce
        or broadcast needed nothing from the others may have gone on and rejected a *later*
        call, while this rank's call (which that rank did its part of) is still completing;
        that notice waits, and the calling thread raises it at its next call."""
        if self.mailbox is None or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            return None
        control, handled, token = self.mailbox.control, self.handled, self.mailbox.token
        numbers = self.numbers
        box = np.empty(MESSAGE_BYTES, dtype=np.uint8)
        state: dict[str, Any] = {"waiting": None}

        def alarm() -> str | None:
            req = state.get("req")
            if req is None:
                req = state["req"] = control.Irecv([box, MPI.BYTE], MPI.ANY_SOURCE, TAG_ALARM)
            while req.Test():
                msg = decode(box)
                req = state["req"] = control.Irecv([box, MPI.BYTE], MPI.ANY_SOURCE, TAG_ALARM)
                # not an earlier communicator's notice; the earliest one is the one to report
                waiting = state["waiting"]
                if msg.token == token and (waiting is None or msg.seq < waiting.seq):
                    state["waiting"] = msg
            msg = state["waiting"]
            if msg is None:
                return None
            if msg.seq <= handled[0]:  # the calling thread raised it already
                state["waiting"] = None
                return None
            # a blocking call takes its number before it enters MPI (bmlmpi.call_numbers)
            if msg.seq > numbers.callno:
                return None
            what = "gave up call" if msg.kind == DEADLINE else "rejected its arguments at call"
            return f"rank {msg.rank} {what} {msg.seq} ({msg.text})"
        return alarm
