"""The order of one communicator's calls: each call's number (the same on every rank), the
count of launches that picks each call's tags, and the one thread allowed inside a call.

Every path of a call — checked, fast, family, persistent start — advances the same
:class:`CallSequence`, so that ranks taking different paths for the same call still agree on
its number and its tags.
"""

from __future__ import annotations

import threading

from .execute import TAG_STEPS

#: Blocks of the tag space: one per collective (:data:`bmlmpi.family.TAG_KIND`), so that
#: messages of different collectives never match.
TAG_KINDS = 8
#: Tag slots (of TAG_STEPS tags each) a signature's calls cycle through; the rest of the tag
#: space tells signatures apart (see :meth:`CallSequence.tag_base`).
CALL_SLOTS = 64


class CommunicatorFreed(RuntimeError):
    """A call on a communicator after its ``Free()``: raised on the rank that calls, before
    anything is sent (every public call, every form)."""


class CallSequence:
    """Call numbers, launch count and the thread inside a call, for a communicator whose
    tags go up to ``tag_ub``."""

    __slots__ = ("callno", "launches", "owner", "tag_mod", "call_slots", "sig_slots", "freed")

    def __init__(self, tag_ub: int):
        self.callno = 0      # calls started on the communicator (all paths)
        self.launches = 0    # launches so far: picks each call's tag slot
        self.owner: int | None = None  # the thread inside a call (claim)
        self.freed = False   # the communicator was freed: every claim raises
        # each collective's calls cycle through their own block of the tag space
        self.tag_mod = max(TAG_STEPS, (tag_ub + 1) // TAG_KINDS // TAG_STEPS * TAG_STEPS)
        slots = self.tag_mod // TAG_STEPS
        self.call_slots = min(CALL_SLOTS, slots)
        self.sig_slots = max(1, slots // self.call_slots)

    def tag_base(self, kind: int = 0, sig: int = 0) -> int:
        """The tag base of the next call (every call advances the count): the call's slot in
        its collective's block of the tag space (``kind``: :data:`bmlmpi.family.TAG_KIND`).
        Inside the block, the signature's number (``sig``: :meth:`bmlmpi.plans.PlanCache.
        sig_id`) picks a part and the count a slot in it, so messages of calls with different
        signatures never match (up to ``sig_slots`` signatures: 1024 with Open MPI's tag
        bound), even when ranks disagree on which signature they run."""
        n = self.launches
        self.launches = n + 1
        slot = (sig % self.sig_slots) * self.call_slots + n % self.call_slots
        return slot * TAG_STEPS + kind * self.tag_mod

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
