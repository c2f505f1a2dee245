"""Call numbers and tag slots: the one module that changes them (a rule test,
``tests/unit/test_call_numbers.py``, holds every other module to asking it).

A communicator's calls are numbered 1, 2, … in the order every rank makes them; agreements,
error notices, labels and the progress engine name a call by its number. A scheduled call
also takes a *tag slot*: a block of :data:`~bmlmpi.execute.TAG_STEPS` tags its messages use
(the executor adds each step's tag to the slot's base). Every path of a call — checked, fast,
family, persistent start, a fault-tolerant attempt — asks :class:`CallNumbers` for both, so
ranks that take different paths for the same call still agree on its number and its tags.
Mistakes here pair one call's messages with a sibling's and return wrong data silently,
which is why no other module writes a counter or computes a slot.

The rules:

* every call takes a number (:meth:`CallNumbers.take`), a call refused before it launched
  included: the refusal is agreed on every rank, so every rank has taken that number; a
  blocking call takes it before it enters MPI, and gives it back
  (:meth:`CallNumbers.give_back`) only when MPI refused its buffers before anything was sent
  and the checked path takes over;
* a scheduled call (a run of a schedule, on messages or shared memory) takes one tag slot per
  launch (:meth:`CallNumbers.take_tags`); a native call (MPI's own collective) takes none, on
  every path, blocking, non-blocking or persistent;
* the slot counts only move forward, but for one agreed correction (:meth:`CallNumbers.
  agree_tags`): after a repair or a recovery, ranks that launched different numbers of
  attempts continue from the largest count.

A compressed call sends on its channel's own duplicate communicator and takes its tags from
that channel's :class:`TagBlocks`.
"""

from __future__ import annotations

from .execute import TAG_STEPS

#: Blocks of the tag space: one per collective (its record's ``tag_kind``), so that
#: messages of different collectives never match.
TAG_KINDS = 8
#: Tag slots (of TAG_STEPS tags each) a signature's calls cycle through; the rest of the tag
#: space tells signatures apart (see :meth:`CallNumbers.take_tags`).
CALL_SLOTS = 64


class CallNumbers:
    """The call numbers and the tag slots of one communicator whose tags go up to
    ``tag_ub`` (read ``callno``, ``launches`` and ``call_slots``; change them only through
    the methods)."""

    __slots__ = ("callno", "launches", "tag_mod", "call_slots", "sig_slots")

    def __init__(self, tag_ub: int):
        self.callno = 0      # the number of the newest call (all paths; calls count from 1)
        self.launches = 0    # scheduled launches so far: picks each one's tag slot
        # each collective's calls cycle through their own block of the tag space
        self.tag_mod = max(TAG_STEPS, (tag_ub + 1) // TAG_KINDS // TAG_STEPS * TAG_STEPS)
        slots = self.tag_mod // TAG_STEPS
        self.call_slots = min(CALL_SLOTS, slots)
        self.sig_slots = max(1, slots // self.call_slots)

    def take(self) -> int:
        """The next call's number, taken (the same on every rank: every rank makes its calls
        in one order)."""
        n = self.callno + 1
        self.callno = n
        return n

    def give_back(self) -> None:
        """Return the number of a blocking fast-path call that MPI refused before anything was
        sent (mpi4py's buffer checks): the checked path that follows numbers that call. A
        blocking call takes its number before it enters MPI, so that while it waits there
        ``callno`` is its own (the watchdog compares another rank's notice against it)."""
        self.callno -= 1

    def take_tags(self, kind: int = 0, sig: int = 0) -> int:
        """The tag base of the next scheduled launch, taken: its slot in its collective's
        block of the tag space (``kind``: its record's ``tag_kind``). Inside the block,
        the signature's number (``sig``: :meth:`bmlmpi.plans.PlanCache.sig_id`) picks a part
        and the launch count a slot in it, so messages of calls with different signatures
        never match (up to ``sig_slots`` signatures: 1024 with Open MPI's tag bound), even
        when ranks disagree on which signature they run."""
        n = self.launches
        self.launches = n + 1
        slot = (sig % self.sig_slots) * self.call_slots + n % self.call_slots
        return slot * TAG_STEPS + kind * self.tag_mod

    def take_scheduled(self, kind: int, sig: int) -> tuple[int, int]:
        """A scheduled call's number and tag base, both taken (:meth:`take`,
        :meth:`take_tags`): the fast paths' one request per call."""
        n = self.launches
        self.launches = n + 1
        self.callno = number = self.callno + 1
        slot = (sig % self.sig_slots) * self.call_slots + n % self.call_slots
        return number, slot * TAG_STEPS + kind * self.tag_mod

    def agree_tags(self, launches: int) -> None:
        """Continue the slot count from ``launches``, the largest count among the ranks (an
        agreement: a communicator's repair after an argument error, a fault-tolerant
        recovery). Ranks may have launched different numbers of attempts before they learnt
        of the failure; from here on each launch must take the same slot on every rank, and
        no slot a rank may still hold messages on is reused early."""
        self.launches = launches


class TagBlocks:
    """Tag blocks of ``span`` tags that one channel's calls take in turn: as many as a tag
    bound of ``tag_ub`` holds, ``most`` at the most (a compressed call's channel:
    :class:`bmlmpi.compression.channel.CompressionChannel`)."""

    __slots__ = ("blocks", "span", "taken")

    def __init__(self, tag_ub: int, span: int, most: int):
        self.blocks = max(1, min(most, (tag_ub + 1) // span))
        self.span = span
        self.taken = 0       # calls that took a block so far

    def take(self) -> int:
        """The next call's block: its first tag."""
        n = self.taken
        self.taken = n + 1
        return (n % self.blocks) * self.span
