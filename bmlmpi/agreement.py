"""The control channel of a :class:`bmlmpi.Communicator`: how ranks agree on a call and tell
each other that a call failed, on a communicator no data message ever travels on.

Why a channel of its own: an agreement sent on the communicator that carries data can be
matched by another rank's data message (an ``MPI_Iallreduce`` of 4 int64 is a perfectly good
partner for another rank's ``MPI_Iallreduce`` of 4 float64), and then both return garbage with
no error. Messages on different communicators never match, so every agreement and notice here
travels on ``control``, a duplicate of the data communicator made when the Communicator is
built.

Two mechanisms, one per checking mode (``check=``, ``BMLMPI_CHECK``):

- ``"first-call"`` (the default): the first call of each signature (count, dtype, op,
  algorithm, shape) is agreed by a point-to-point exchange (:meth:`Mailbox.gather`): every
  rank sends its signature hash, numbered with the call's sequence number, to every other
  rank and waits for theirs. Later calls of a checked signature skip it. A rank whose own
  arguments fail its local check at any call sends an error *notice* numbered with that call
  (:meth:`Mailbox.announce`) and raises its own error at once; every rank polls its mailbox
  while it waits (in the exchange or in the data wait) and raises
  :class:`~bmlmpi.api.RemoteArgumentError` naming the rank as soon as the notice arrives.
  Point-to-point messages that nobody waits for are harmless (they carry their call's number
  and a stale one is dropped), which is what makes this safe when ranks disagree about
  whether a call needs the exchange at all.
- ``"every-call"``: every call is agreed by one ``MPI_Iallreduce`` on ``control`` (four
  int64: hash, negated hash, error flag, rank) before any data moves, so a rank that
  switches to another signature is caught at once, on every rank.

A rank that gives up a call at its deadline also sends a notice (kind ``DEADLINE``), so a
late rank learns of it before or while it joins the abandoned call.

Cost: a mailbox poll is one ``MPI_Test`` on a posted receive, made only while a rank waits;
the fast paths do not poll.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .execute import wait_for

#: Message kinds.
SIGNATURE, ERROR, DEADLINE = 0, 1, 2
#: The tag of mailbox messages and of the watchdog's copy of a notice (see api).
TAG_MAIL, TAG_ALARM = 1, 2
_HEAD = 5                 # int64 fields: sequence, kind, hash, rank, communicator token
_TEXT = 448               # bytes of text a message carries (truncated beyond)
MESSAGE_BYTES = _HEAD * 8 + _TEXT


class RemoteArgumentError(ValueError):
    """Another rank rejected its arguments; this rank's call fails with it instead of hanging."""


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    kind: int
    value: int
    rank: int
    text: str
    token: int = 0


def encode(seq: int, kind: int, value: int, rank: int, text: str, token: int = 0) -> np.ndarray:
    buf = np.zeros(MESSAGE_BYTES, dtype=np.uint8)
    buf[:_HEAD * 8].view(np.int64)[:] = (seq, kind, value, rank, token)
    raw = text.encode("utf-8", "replace")[:_TEXT]
    buf[_HEAD * 8:_HEAD * 8 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return buf


def decode(buf: np.ndarray) -> Message:
    seq, kind, value, rank, token = (int(v) for v in buf[:_HEAD * 8].view(np.int64))
    text = bytes(buf[_HEAD * 8:]).rstrip(b"\0").decode("utf-8", "replace")
    return Message(seq, kind, value, rank, text, token)


class Mailbox:
    """One posted receive on ``control`` (any source, :data:`TAG_MAIL`), re-posted after each
    message; messages are kept by call number until the call they belong to is over.

    ``token``: the communicator's own number, agreed when it was built, carried by every
    message; a message with another token is dropped. An MPI library that reuses context ids
    (MPICH) can deliver a notice still in flight when an earlier communicator was freed to
    this one's receive, with a call number this communicator also uses."""

    def __init__(self, control: MPI.Comm, token: int = 0):
        self.control = control
        self.token = token
        self.rank = control.Get_rank()
        self.size = control.Get_size()
        self._box = np.empty(MESSAGE_BYTES, dtype=np.uint8)
        self._req: MPI.Request | None = None
        self._by_seq: dict[int, dict[int, Message]] = {}
        self._failures: list[Message] = []   # error and deadline notices, oldest first
        self._sends: list[tuple[MPI.Request, np.ndarray]] = []
        self._post()

    def _post(self) -> None:
        self._req = self.control.Irecv([self._box, MPI.BYTE], MPI.ANY_SOURCE, TAG_MAIL)

    def poll(self, arrived: bool = False) -> None:
        """Take every message that has arrived (``arrived``: the posted receive's ``Test``
        said so already)."""
        req = self._req
        while req is not None and (arrived or req.Test()):
            arrived = False
            msg = decode(self._box)
            if msg.token != self.token:
                pass  # an earlier communicator's message (see the class docstring)
            elif msg.kind == SIGNATURE:
                self._by_seq.setdefault(msg.seq, {})[msg.rank] = msg
            else:
                self._failures.append(msg)
            self._post()
            req = self._req
        if self._sends:
            self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def failure(self, since: int = 0) -> Message | None:
        """The first error or deadline notice about a call numbered ``since`` or later."""
        req = self._req
        arrived = req is not None and req.Test()
        if not (arrived or self._failures or self._sends):
            return None  # nothing arrived, nothing kept (the fast paths' every call)
        self.poll(arrived)
        for msg in self._failures:
            if msg.seq >= since:
                return msg
        return None

    def announce(self, seq: int, kind: int, text: str, also_tag: int | None = None) -> None:
        """Tell every other rank that this rank's call ``seq`` failed (``kind``), without
        waiting for anyone. ``also_tag``: send a second copy with this tag (the watchdog's)."""
        msg = encode(seq, kind, 0, self.rank, text, self.token)
        for r in range(self.size):
            if r == self.rank:
                continue
            for tag in (TAG_MAIL,) if also_tag is None else (TAG_MAIL, also_tag):
                self._sends.append((self.control.Isend([msg, MPI.BYTE], r, tag), msg))

    def gather(self, seq: int, value: int, text: str, timeout: float,
               describe: Callable[[float], str],
               deadline_error: Callable[[str], BaseException]) -> dict[int, Message]:
        """Send ``value`` (and ``text``) for call ``seq`` to every other rank and return every
        rank's message for that call (this rank's included). Returns early, with what it
        has, when an error or deadline notice about ``seq`` or later arrives (the caller
        looks at :meth:`failure`). After ``timeout`` s with no new message it raises
        ``deadline_error(describe(timeout))``."""
        mine = Message(seq, SIGNATURE, value, self.rank, text, self.token)
        self._by_seq.setdefault(seq, {})[self.rank] = mine
        msg = encode(seq, SIGNATURE, value, self.rank, text, self.token)
        for r in range(self.size):
            if r != self.rank:
                self._sends.append((self.control.Isend([msg, MPI.BYTE], r, TAG_MAIL), msg))
        got = self._by_seq[seq]
        wait_for(lambda: len(got) >= self.size or self.failure(seq) is not None, timeout,
                 describe, progress=lambda: len(got), error=deadline_error)
        return self._by_seq.pop(seq)

    def forget_before(self, seq: int) -> None:
        """Drop signature messages of calls before ``seq`` (a rank that failed them locally
        never read the others')."""
        for s in [s for s in self._by_seq if s < seq]:
            del self._by_seq[s]

    def close(self) -> None:
        """Cancel the posted receive and take in the notices already delivered (the
        communicator is about to be freed: an MPI library that reuses its context id, as
        MPICH does, would otherwise match them with a later communicator's messages)."""
        req, self._req = self._req, None
        if req is not None:
            try:
                req.Cancel()
                req.Wait()
            except MPI.Exception:
                pass
        drain(self.control)


def drain(comm: MPI.Comm) -> None:
    """Receive and drop every message already delivered on ``comm``, which is about to be
    freed: messages of calls abandoned after an error or a deadline would otherwise wait in
    the library's queue, and an MPI library that reuses context ids (MPICH does) matches
    them with a later communicator's receives."""
    status = MPI.Status()
    try:
        while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            box = bytearray(max(1, status.Get_count(MPI.BYTE)))
            comm.Recv([box, MPI.BYTE], status.Get_source(), status.Get_tag())
    except MPI.Exception:
        pass
