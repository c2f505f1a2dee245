"""The one thread allowed inside a communicator's call, and the end of its calls at
``Free()``.

Every path of a call — checked, fast, family, persistent start, a request's Test or Wait —
claims the same :class:`CallGate`, so a second thread inside a call raises before anything
is sent. (The call's number and tags come from :mod:`bmlmpi.call_numbers`.)
"""

from __future__ import annotations

import threading
from threading import get_ident


class CommunicatorFreed(RuntimeError):
    """A call on a communicator after its ``Free()``: raised on the rank that calls, before
    anything is sent (every public call, every form)."""


class CallGate:
    """The thread inside a call of one communicator, and whether it was freed."""

    __slots__ = ("owner", "freed")

    def __init__(self) -> None:
        self.owner: int | None = None  # the thread inside a call (claim)
        self.freed = False   # the communicator was freed: every claim raises

    def claim(self, rank: int) -> bool:
        """Claim the communicator (rank ``rank``) for this thread's call; False when it
        already holds it (a call inside a call). A second thread inside a call raises: two
        threads' messages on one communicator swap results silently (bmlmpi's communicators,
        like MPI's collectives on one communicator, take one call at a time)."""
        if self.freed:
            self.refuse_freed(rank)
        me = threading.get_ident()
        owner = self.owner
        if owner == me:
            return False
        if owner is not None:
            raise RuntimeError(
                f"bmlmpi.Communicator (rank {rank}): two threads called it at once (a "
                f"call of thread {owner} is in progress); a communicator takes one call at a "
                f"time: use one communicator per thread, or a lock")
        self.owner = me
        return True

    def enter(self) -> bool | None:
        """A fast path's claim, which raises nothing: True when this thread now holds the
        communicator, False when it held it already (a call inside its own call), None when
        another thread's call is inside (the fast path then hands the call to the checked
        path, whose :meth:`claim` raises). End it with :meth:`release`."""
        owner = self.owner
        if owner is None:
            self.owner = get_ident()
            return True
        return False if owner == get_ident() else None

    def refuse_freed(self, rank: int) -> None:
        """Raise :class:`CommunicatorFreed` when the communicator was freed."""
        if self.freed:
            raise CommunicatorFreed(
                f"bmlmpi.Communicator (rank {rank}) was freed: Free() ends every call on it "
                f"(blocking, I..., _init, a persistent request's Start, explain); build "
                f"another communicator to go on")

    def release(self, mine: bool) -> None:
        """End the call that :meth:`claim` returned ``mine`` for (True: this thread claimed
        it there)."""
        if mine:
            self.owner = None
