"""``auto`` by measurement: per call signature, time the model's few best candidates on the
user's own calls, then commit every rank to the fastest. MPI-free and deterministic.

A :class:`Tuner` keeps one state per :class:`TuningKey` (collective, size class, dtype, op,
rank count, node layout, root or None, call format). The pipeline drives it with the key's
call index (the number of this key's calls before this one, which every rank agrees on) and
the call's local time; every decision is a function of the index and of vectors agreed
across ranks, so every rank decides alike without a message of the Tuner's own:

1. :meth:`Tuner.begin` opens a key from ``auto``'s priced choice
   (:class:`bmlmpi.selection.Explanation`): a committed table entry for the key
   (:meth:`Tuner.seed`) commits it at once (``why="table"``); otherwise it explores these
   **candidates**, in this order: the model's best ``k`` (default 3) of the records that opt
   in to ``auto`` (cheapest first; the explanation's candidates are priced alike on every
   rank), then the ``default`` record (the MPI library's own call) where it serves the
   collective and is not among them already. Without prices (the fixed rule: no
   calibration cached) nothing ranks them, so the candidates are every record that opts in
   to ``auto`` and applies (the explanation's ``applicable``, registration order), the
   default record among them. The model's (or the rule's) pick stays the **prior**.
2. Exploring, :meth:`Tuner.choose` runs the ``c`` candidates in **blocks** of ``b``
   consecutive calls (:meth:`Tuner.block_calls_at`: ``block_calls`` (default 16) at small
   sizes, fewer from ``block_bytes`` / ``block_calls`` up, one call from ``block_bytes``
   (default 4 MiB)), in ``rounds`` (default 3) rounds, the candidates' blocks interleaved:
   block ``j`` runs candidate ``j mod c``, so a drift in the machine's load hits every
   candidate alike. The ranking is of each candidate's **steady state**, the calls a user's
   loop of the committed one makes: a block's first calls run right after another
   candidate's, with cold caches and buffers, slower than its later calls by a share that
   differs between candidates (:data:`SETTLE_CALLS`). So each block starts with ``lead``
   calls that are not counted (:meth:`Tuner.lead_calls_at`): 3 from 512 KiB (a block of 8
   calls or fewer), 1 from 16 MiB, none from 64 MiB, where a first call runs as the later
   ones; up to 256 KiB none (a block of 16 calls dilutes its first ones). Where a block has
   no leading calls each candidate first runs one warm-up call, not counted (plans
   compiled, kernels loaded); the first block's leading calls do that elsewhere. So a key
   explores for ``c · (w + rounds · (lead + b))`` calls (``w`` the warm-up, 1 or 0: 196 with
   4 candidates at 8 B, 132 at 512 KiB, 84 at 1 MiB, 48 at 4 MiB, 24 at 16 MiB, 16 from
   64 MiB), every one the user's real call, exact whichever candidate runs.
   :meth:`Tuner.record` stores a call's local seconds in its block; a block's time is the
   mean of its counted calls. One call's time can be a scheduler's time slice (a loaded
   machine preempts a rank mid-call, and a schedule that yields while it polls loses the
   core more often than the MPI library's call): a block's mean counts such calls as often
   as a user's loop meets them, where a median of single calls would drop them.
3. After the last exploration call (:meth:`Tuner.due` says so at that call's index), the
   pipeline MAX-reduces :meth:`Tuner.proposal` — the local block means, candidate by
   candidate, ``inf`` for a block without a time — across ranks (a block of calls ends
   when its slowest rank does), and hands the agreed vector to :meth:`Tuner.commit`. Each
   candidate's agreed time is the median of its blocks, its **spread** the range of its
   blocks. The winner is the fastest median (ties: the earlier candidate), but the prior is
   kept unless the winner is faster by more than :data:`MARGIN` (5 %) **and** by more than
   their spreads: the winner's slowest block must be faster than the prior's fastest one
   (median gap > the winner's spread above its median + the prior's spread below its
   median), or be more than :data:`DECISIVE` (1.25) times faster by its median and its median
   faster than the prior's fastest block (a gap the winner's preempted blocks cannot have
   made: load only adds time). A near-tie (within the margin) is noise, not a reason to
   leave the model's pick. A gap beyond the margin that one preempted block could have
   made is settled by a **runoff** (:data:`RUNOFF_ROUNDS`, default 4): the key explores on
   from the next call with the winner and the prior only: ``runoff_rounds`` more rounds of
   their blocks in turn (each with its warm-up call or settling calls, as above), and a
   second agreement of their block means. Block ``j`` of the two ran in the same round,
   one right after the other, so the pairs are compared, not the spreads
   (:meth:`Tuner._wins_runoff`): the winner replaces the prior when its block was the
   faster in every pair but at most one and the median of the pairs' ratios exceeds the
   margin; the prior stays otherwise. The others keep their first blocks. ``why`` is
   ``"measured"`` when the measurement chose, ``"model"`` or ``"rule"`` when the prior was
   kept (or nothing was measured).
4. Committed, every ``sample_every``-th call (default 16) of the key is timed (:meth:`Tuner.timed`)
   and every ``review_samples`` such calls (default 5, so every 80 calls) :meth:`Tuner.due`
   asks for a **review**: the proposal is the committed algorithm's median of those samples
   (0 where this rank has none: a missing sample never contradicts) beside the other
   candidates' agreed medians; the MAX-reduced vector goes to :meth:`Tuner.commit` again. When
   the committed algorithm's agreed median exceeds :data:`CONTRADICTED` (1.2) times another
   candidate's, the choice is contradicted and the key explores afresh from the next call.
   A table entry without medians of other candidates is never contradicted this way.

Each commit, and each review that sends a key back to exploring, is logged once at DEBUG on
the ``bmlmpi`` logger.

A runoff rather than more rounds for every key: most keys are decided by their three rounds
(a clear winner, or a near-tie); only a gap the spread leaves open pays for more blocks,
and only of the two it concerns. Decided against the design sketch: a warm-up call before
``rounds`` counted blocks (the
sketch counted the warm-up among its rounds, leaving medians of two), so that each median is
of three blocks; blocks of consecutive calls rather than single calls, so that a call that
lost the core to another process counts as often as it happens; "measured" also when the
measurement confirms the prior (it is what decided); a missing time counts as ``inf`` while
exploring and 0 in a review, so that it can neither win nor contradict. Without prices every
applicable record is a candidate (the sketch added the model's best under default α and β:
no such default calibration exists, and a job does not measure one: the user's calls rank
them instead).

A call that names its algorithm never reaches the Tuner; the pipeline asks it only for
``auto``. :meth:`Tuner.report` is what ``explain`` shows: each candidate's predicted time,
measured median, sample count and agreed blocks, and why the chosen one won.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .schedules import algorithms as records
from .schedules.collectives import called
from .schedules.collectives import collective as contract

_log = logging.getLogger("bmlmpi")

__all__ = ["BLOCK_BYTES", "BLOCK_CALLS", "CONTRADICTED", "DECISIVE", "MARGIN", "RUNOFF_ROUNDS",
           "SETTLE_CALLS",
           "TUNED_RULES", "WHYS", "CandidateTiming", "TuningKey", "TuningReport", "Tuner",
           "pick_candidates", "size_class"]

#: the prior is kept unless the measured winner is faster by more than this factor (and
#: than the spread of their blocks)
MARGIN = 1.05
#: the calls of one exploration block at small sizes
BLOCK_CALLS = 16
#: the size class from which one exploration block is one call
BLOCK_BYTES = 4 << 20
#: the calls at the start of each exploration block that are not counted, by size class:
#: (from this size class, so many calls), sizes ascending (none below the first). A
#: candidate's first calls after another candidate's run slower than its later ones, by a
#: share that differs between candidates, until their caches and buffers are warm again
#: (perf/auto/cold_calls.py; docs/tuning.md, "Settling calls"): at 512 KiB-4 MiB on two
#: ranks the first call ran up to 2.6 times a settled one (a tree's 24 times at 512 KiB)
#: and the fourth was settled, at 16 MiB the first call's excess was within the noise after
#: one call, at 64 MiB there was none. Up to 256 KiB a block of 16 calls dilutes them.
SETTLE_CALLS = ((512 << 10, 3), (16 << 20, 1), (64 << 20, 0))
#: a winner whose median block is more than this factor faster than the prior's replaces it
#: even where their blocks overlap, if its median also beats the prior's fastest block
#: (docs/tuning.md, "The rule": at 2, a quiet machine kept bml at 1.5-1.8 times shm's median,
#: one of shm's three blocks slower than bml's fastest)
DECISIVE = 1.25
#: a committed choice whose agreed median exceeds another candidate's by this factor is
#: explored afresh
CONTRADICTED = 1.2
#: the counted rounds of a runoff between the prior and a fastest candidate the rule could
#: not tell apart from it (0: no runoff)
RUNOFF_ROUNDS = 4
#: why a committed choice won
WHYS = ("measured", "table", "model", "rule")
#: the rules of :func:`bmlmpi.selection.explain` that leave a choice to measure; a key
#: opened under any other (an empty call, one rank, ``BMLMPI_ALGORITHM``) commits at once
TUNED_RULES = ("cost model", "fixed rule")


def size_class(nbytes: int) -> int:
    """The power-of-two bucket of ``nbytes``: the smallest power of two at least ``nbytes``
    (0 for an empty call). Calls within one bucket share a choice."""
    if nbytes < 0:
        raise ValueError(f"a call's size is at least 0 bytes, got {nbytes}")
    return 0 if nbytes == 0 else 1 << (nbytes - 1).bit_length()


@dataclass(frozen=True, order=True)
class TuningKey:
    """One signature ``auto`` tunes: ``collective``, ``size`` (:func:`size_class` of the work
    buffer's bytes), ``dtype`` and ``op`` (names; ``""`` where the collective reduces
    nothing), ``ranks``, ``layout`` (which ranks share a node, e.g. ``"1x4"``), ``root``
    (None for a collective without one), ``wire`` (the call format its values are carried
    in, e.g. ``"reproducible"``: such a call moves and sums other words than a plain call of
    the same arrays, so it is a signature of its own; ``""``: none)."""

    collective: str
    size: int
    dtype: str
    op: str
    ranks: int
    layout: str
    root: int | None = None
    wire: str = ""

    def __post_init__(self) -> None:
        known = called()
        if self.collective not in known:
            raise ValueError(f"unknown collective {self.collective!r}; known: "
                             f"{', '.join(known)}")
        if self.size != size_class(self.size):
            raise ValueError(f"size class {self.size} is not 0 or a power of two")
        if self.ranks < 1:
            raise ValueError(f"a key's rank count is at least 1, got {self.ranks}")
        rooted = contract(self.collective).rooted
        if rooted and (self.root is None or not 0 <= self.root < self.ranks):
            raise ValueError(f"{self.collective} needs a root in 0..{self.ranks - 1}, "
                             f"got {self.root}")
        if not rooted and self.root is not None:
            raise ValueError(f"{self.collective} has no root, got {self.root}")


def pick_candidates(collective: str, priced: Sequence[tuple[str, float]], prior: str,
                    k: int = 3) -> tuple[str, ...]:
    """What a key explores: the ``k`` cheapest of ``priced`` ((name, predicted seconds),
    any order; equal prices keep their order) that opt in to ``auto`` and serve
    ``collective``, else ``prior`` alone; then the ``default`` record where it serves the
    collective and is not among them. ``prior`` (the model's or the rule's pick) is always
    among them."""
    if k < 1:
        raise ValueError(f"k is at least 1, got {k}")
    usable = [(n, t) for n, t in priced
              if records.get(n).auto and records.get(n).serves(collective)]
    best = [n for n, _ in sorted(usable, key=lambda nt: nt[1])][:k] or [prior]
    default = records.default()
    if prior not in best and prior != default.name:
        best[-1] = prior
    if default.serves(collective) and default.name not in best:
        best.append(default.name)
    return tuple(dict.fromkeys(best))


@dataclass(frozen=True)
class CandidateTiming:
    """One candidate as ``explain`` shows it: ``predicted`` seconds (the model's; None
    without a price), ``measured`` (the agreed median of its blocks' mean call times; None
    before a commit by measurement), ``samples`` (this rank's counted calls: so far while
    exploring, those behind the commit once committed) and ``blocks`` (the agreed block
    means behind ``measured``; empty where there are none)."""

    name: str
    predicted: float | None
    measured: float | None
    samples: int
    blocks: tuple[float, ...] = ()


@dataclass(frozen=True)
class TuningReport:
    """Where one key stands: ``state`` (``"exploring"`` or ``"committed"``), ``chosen``
    (the committed algorithm; None while exploring), ``why`` (``measured``, ``table``,
    ``model``, ``rule``; None while exploring), ``prior`` (the model's or rule's pick),
    the ``candidates`` in exploration order and, in a runoff, the two that run off
    (``runoff``; empty otherwise)."""

    key: TuningKey
    state: str
    chosen: str | None
    why: str | None
    prior: str
    candidates: tuple[CandidateTiming, ...]
    runoff: tuple[str, ...] = ()

    def __str__(self) -> str:
        exploring = (f"exploring (a runoff: {' against '.join(self.runoff)})" if self.runoff
                     else "exploring")
        head = (f"{self.key.collective} {self.key.size} B class on {self.key.ranks} ranks: "
                + (f"{self.chosen} ({self.why})" if self.chosen else exploring))
        lines = [head]
        for c in self.candidates:
            pred = "-" if c.predicted is None else f"{c.predicted * 1e6:.1f} us"
            meas = "-" if c.measured is None else f"{c.measured * 1e6:.1f} us"
            mark = "  <- chosen" if c.name == self.chosen else ""
            spread = (f", blocks {min(c.blocks) * 1e6:.1f}-{max(c.blocks) * 1e6:.1f} us"
                      if c.blocks and all(map(math.isfinite, c.blocks)) else "")
            lines.append(f"  {c.name:<13} predicted {pred:>12}  measured {meas:>12} "
                         f"({c.samples} samples{spread}){mark}")
        return "\n".join(lines)


@dataclass
class _State:
    candidates: tuple[str, ...]
    prior: str
    prior_why: str  # "model" or "rule"
    predicted: dict[str, float]
    start: int = 0  # the key's call index where the current exploration began
    # exploring: each candidate's counted calls by round; committed: the committed
    # algorithm's sampled calls under round 0
    samples: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    chosen: str | None = None
    why: str | None = None
    committed_at: int = 0
    medians: tuple[float, ...] | None = None  # agreed, in candidate order
    blocks: tuple[tuple[float, ...], ...] | None = None  # agreed block means, per candidate
    counted: tuple[int, ...] | None = None  # this rank's samples behind the commit
    last_index: int = -1
    # a runoff: the two candidates it runs (candidate order), the first exploration's agreed
    # blocks and this rank's counted calls in it, per candidate
    runoff: tuple[str, ...] | None = None
    earlier: tuple[tuple[float, ...], ...] | None = None
    earlier_counted: tuple[int, ...] | None = None


class Tuner:
    """Per-key exploration and commit (see the module's docstring). ``k``: the model's
    candidates explored; ``rounds``: counted rounds of blocks after the warm-up;
    ``block_calls`` and ``block_bytes``: a block's calls at small sizes and the size from
    which a block is one call (:meth:`block_calls_at`); ``settle``: the uncounted leading
    calls of a block by size class (:data:`SETTLE_CALLS`); ``margin``: the prior's margin;
    ``decisive``: the factor that wins over the blocks' spread (:meth:`_beats`);
    ``runoff_rounds``: the counted rounds of a runoff (:data:`RUNOFF_ROUNDS`, 0: none);
    ``sample_every`` and ``review_samples``: how often a committed key is timed and
    reviewed."""

    def __init__(self, *, k: int = 3, rounds: int = 3, block_calls: int = BLOCK_CALLS,
                 block_bytes: int = BLOCK_BYTES,
                 settle: Sequence[tuple[int, int]] = SETTLE_CALLS, margin: float = MARGIN,
                 decisive: float = DECISIVE,
                 sample_every: int = 16, review_samples: int = 5,
                 contradicted: float = CONTRADICTED, runoff_rounds: int = RUNOFF_ROUNDS) -> None:
        if (k < 1 or rounds < 1 or block_calls < 1 or block_bytes < 1 or sample_every < 1
                or review_samples < 1):
            raise ValueError("k, rounds, block_calls, block_bytes, sample_every and "
                             "review_samples are at least 1")
        if runoff_rounds < 0:
            raise ValueError(f"runoff_rounds is at least 0, got {runoff_rounds}")
        self.runoff_rounds = runoff_rounds
        if not (margin >= 1 and contradicted >= 1 and decisive >= margin):
            raise ValueError("margin and contradicted are factors of at least 1, decisive "
                             "one of at least margin")
        settle = tuple((int(size), int(calls)) for size, calls in settle)
        if (any(size < 0 or calls < 0 for size, calls in settle)
                or [size for size, _ in settle] != sorted({size for size, _ in settle})):
            raise ValueError(f"settle is (size class, calls) pairs, sizes ascending, none "
                             f"negative; got {settle}")
        self.settle = settle
        self.k, self.rounds, self.margin, self.decisive = k, rounds, margin, decisive
        self.block_calls, self.block_bytes = block_calls, block_bytes
        self.sample_every, self.review_samples = sample_every, review_samples
        self.contradicted = contradicted
        self._states: dict[TuningKey, _State] = {}
        self._seeds: dict[TuningKey, tuple[str, tuple[str, ...], tuple[float, ...] | None]] = {}

    # -- opening a key -----------------------------------------------------------------------

    def seed(self, key: TuningKey, algorithm: str, candidates: Sequence[str] = (),
             medians: Sequence[float] | None = None) -> None:
        """A committed table entry for ``key``: :meth:`begin` commits it with
        ``why="table"``. ``candidates`` and their agreed ``medians`` (optional) let the
        key's reviews compare the entry against the others."""
        rec = records.get(algorithm)
        if not (rec.offered and rec.serves(key.collective)):
            raise ValueError(f"{algorithm} does not run {key.collective}")
        cands = tuple(candidates) or (algorithm,)
        if algorithm not in cands:
            raise ValueError(f"{algorithm} is not among its candidates {cands}")
        if medians is not None and len(medians) != len(cands):
            raise ValueError(f"{len(medians)} medians for {len(cands)} candidates")
        self._seeds[key] = (algorithm, cands, None if medians is None else tuple(medians))

    def forget_seeds(self) -> None:
        """Drop the table entries :meth:`seed` gave that no key has begun from yet: a tuning
        run measures every signature it tunes again (``bmlmpi-calibrate --tune``)."""
        self._seeds.clear()

    def begin(self, key: TuningKey, explanation) -> TuningReport:
        """Open ``key`` from ``auto``'s priced choice ``explanation``
        (:class:`bmlmpi.selection.Explanation`: its ``chosen``, ``rule`` and priced
        ``candidates``); a key already open is left as it is."""
        if key not in self._states:
            self._states[key] = self._opened(key, explanation)
        return self.report(key)

    def preview(self, key: TuningKey, explanation) -> TuningReport:
        """What :meth:`begin` would make of ``key`` from ``explanation``, without opening it
        (a key already open: its report)."""
        if key in self._states:
            return self.report(key)
        return self._report(key, self._opened(key, explanation))

    def _opened(self, key: TuningKey, explanation) -> _State:
        prior = explanation.chosen
        priced = [(c.name, c.predicted) for c in explanation.candidates]
        prior_why = "model" if priced else "rule"
        seeded = self._seeds.get(key)
        if explanation.rule not in TUNED_RULES:
            # nothing to choose between (an empty call, one rank, BMLMPI_ALGORITHM)
            return _State((prior,), prior, "rule", dict(priced), chosen=prior, why="rule")
        if seeded is not None:
            algorithm, cands, medians = seeded
            return _State(cands, prior, prior_why, dict(priced), chosen=algorithm,
                          why="table", medians=medians)
        if priced:
            cands = pick_candidates(key.collective, priced, prior, self.k)
        else:
            # nothing ranks them: every applicable record is timed (equal prices keep the
            # registration order)
            applicable = getattr(explanation, "applicable", ())
            cands = pick_candidates(key.collective, [(n, 0.0) for n in applicable], prior,
                                    max(1, len(applicable)))
        return _State(cands, prior, prior_why, dict(priced))

    # -- each call ---------------------------------------------------------------------------

    def block_calls_at(self, size: int) -> int:
        """The calls in one exploration block of a key of ``size`` (its size class, bytes):
        ``block_calls`` up to ``block_bytes / block_calls``, then fewer as the size grows,
        one from ``block_bytes`` (a call that long outlasts a scheduler's time slice)."""
        return max(1, min(self.block_calls, self.block_bytes // max(1, size)))

    def lead_calls_at(self, size: int) -> int:
        """The calls not counted at the start of each exploration block of a key of ``size``
        (``settle``'s entry for the largest size class not above ``size``; none below the
        first)."""
        lead = 0
        for start, calls in self.settle:
            if size >= start:
                lead = calls
        return lead

    def warmup_calls_at(self, size: int) -> int:
        """The warm-up calls of each candidate before the first round (plans compiled,
        kernels loaded): one where a block has no leading calls, else none (the first
        block's leading calls are its warm-up)."""
        return int(self.lead_calls_at(size) == 0)

    def calls_per_candidate(self, size: int, rounds: int | None = None) -> int:
        """One candidate's calls in an exploration of a key of ``size``: its warm-up, then
        ``rounds`` (default: the exploration's) blocks, each its leading calls and its
        counted ones."""
        rounds = self.rounds if rounds is None else rounds
        return self.warmup_calls_at(size) + rounds * (self.lead_calls_at(size)
                                                     + self.block_calls_at(size))

    def most_calls(self, size: int, candidates: int) -> int:
        """The most calls a key of ``size`` with ``candidates`` candidates explores before it
        commits: its exploration and a runoff of two of them."""
        runoff = (2 * self.calls_per_candidate(size, self.runoff_rounds)
                  if self.runoff_rounds and candidates > 1 else 0)
        return candidates * self.calls_per_candidate(size) + runoff

    def _explored(self, st: _State) -> tuple[tuple[str, ...], int]:
        """The candidates an exploring key runs now and its counted rounds: the runoff's two
        in a runoff, else every candidate."""
        if st.runoff is not None:
            return st.runoff, self.runoff_rounds
        return st.candidates, self.rounds

    def exploration_calls(self, key: TuningKey) -> int:
        """How many calls the exploration ``key`` runs now takes (:meth:`calls_per_candidate`
        for each candidate it runs: every one, or a runoff's two)."""
        names, rounds = self._explored(self._state(key))
        return len(names) * self.calls_per_candidate(key.size, rounds)

    def _place(self, key: TuningKey, st: _State, index: int) -> tuple[str, int] | None:
        """Exploring: the candidate call ``index`` runs and its round (0: the warm-up or a
        block's leading call, not counted); None past the exploration."""
        names, _ = self._explored(st)
        at, c = index - st.start, len(names)
        if not 0 <= at < self.exploration_calls(key):
            return None
        warm = c * self.warmup_calls_at(key.size)
        if at < warm:
            return names[at], 0
        lead = self.lead_calls_at(key.size)
        block, within = divmod(at - warm, lead + self.block_calls_at(key.size))
        return names[block % c], (0 if within < lead else 1 + block // c)

    def choose(self, key: TuningKey, index: int) -> str:
        """The algorithm call ``index`` of ``key`` runs (``index``: this key's calls before
        this one, the same on every rank)."""
        st = self._state(key)
        if index < 0:
            raise ValueError(f"a call index is at least 0, got {index}")
        st.last_index = index
        if st.chosen is not None:
            return st.chosen
        place = self._place(key, st, index)
        # past the exploration without a commit: the prior, on every rank
        return st.prior if place is None else place[0]

    def timed(self, key: TuningKey, index: int) -> bool:
        """Whether call ``index`` of ``key`` should be timed and :meth:`record` ed: every
        exploration call, and every ``sample_every``-th call once committed."""
        st = self._state(key)
        if st.chosen is None:
            return True
        at = index - st.committed_at
        return at > 0 and at % self.sample_every == 0

    def record(self, key: TuningKey, candidate: str, seconds: float) -> None:
        """Store the local ``seconds`` of the call :meth:`choose` last placed, which ran
        ``candidate``. Exploring, the time goes to that call's block (the warm-up round's
        are dropped; a call past the exploration or of another candidate than its block's
        counts nowhere); committed, only the committed algorithm's times count (they feed
        the next review)."""
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"a call's time is finite and >= 0 seconds, got {seconds!r}")
        st = self._state(key)
        if candidate not in st.candidates:
            raise ValueError(f"{candidate} is not a candidate of {key}: {st.candidates}")
        if st.chosen is not None:
            if candidate == st.chosen:
                st.samples.setdefault(candidate, {}).setdefault(0, []).append(float(seconds))
            return
        place = self._place(key, st, st.last_index)
        if place is None or place[0] != candidate or place[1] == 0:
            return
        st.samples.setdefault(candidate, {}).setdefault(place[1], []).append(float(seconds))

    def due(self, key: TuningKey, index: int) -> bool:
        """Whether call ``index`` of ``key`` ends with an agreement: the last exploration
        call (then a commit), or a committed key's review call."""
        st = self._state(key)
        if st.chosen is None:
            return index - st.start == self.exploration_calls(key) - 1
        at = index - st.committed_at
        return (st.medians is not None and at > 0
                and at % (self.sample_every * self.review_samples) == 0)

    def proposal(self, key: TuningKey) -> tuple[float, ...]:
        """This rank's vector for the agreement: exploring, each candidate's ``rounds``
        block means in turn, candidate by candidate (``inf`` for a block without a time: the
        candidate cannot win); reviewing, in candidate order, the committed algorithm's
        median since the last review (0 without one: it cannot contradict) and the others'
        agreed medians."""
        st = self._state(key)
        if st.chosen is None:
            names, rounds = self._explored(st)
            return tuple(statistics.fmean(st.samples[c][r])
                         if st.samples.get(c, {}).get(r) else math.inf
                         for c in names for r in range(1, rounds + 1))
        mine = st.samples.get(st.chosen, {}).get(0)
        fresh = statistics.median(mine) if mine else 0.0
        base = st.medians if st.medians is not None else (0.0,) * len(st.candidates)
        return tuple(fresh if c == st.chosen else base[i] for i, c in enumerate(st.candidates))

    def commit(self, key: TuningKey, agreed: Sequence[float]) -> TuningReport:
        """Apply the agreed (MAX-reduced) proposal: commit an exploring key, or review a
        committed one (contradicted: explore afresh from the next call). Every rank holding
        the same ``agreed`` vector reaches the same state."""
        st = self._state(key)
        agreed = tuple(float(x) for x in agreed)
        if st.chosen is None:
            names, rounds = self._explored(st)
            width = len(names) * rounds
        else:
            width = len(st.candidates)
        if len(agreed) != width or any(math.isnan(x) or x < 0 for x in agreed):
            raise ValueError(f"agreed times {agreed} do not fit the candidates "
                             f"{st.candidates} of {key}")
        if st.chosen is None:
            self._settle(st, agreed)
            if st.chosen is None:
                _log.debug("auto runs off %s from call %d: %s, agreed medians %s, blocks %s",
                           key, st.start, " against ".join(st.runoff),
                           dict(zip(st.candidates, st.medians, strict=True)),
                           dict(zip(st.candidates, st.blocks, strict=True)))
            else:
                _log.debug("auto committed %s: %s (%s), agreed medians %s, blocks %s", key,
                           st.chosen, st.why, dict(zip(st.candidates, st.medians, strict=True)),
                           dict(zip(st.candidates, st.blocks, strict=True)))
        else:
            self._review(st, agreed)
            if st.chosen is None:
                _log.debug("auto explores %s again from call %d: agreed medians %s", key,
                           st.start, dict(zip(st.candidates, agreed, strict=True)))
        return self.report(key)

    def _settle(self, st: _State, agreed: tuple[float, ...]) -> None:
        names, r = self._explored(st)
        new = dict(zip(names, (agreed[i * r:(i + 1) * r] for i in range(len(names))),
                       strict=True))
        counted = tuple(sum(map(len, st.samples.get(c, {}).values())) for c in st.candidates)
        if st.runoff is not None:
            # the runoff's blocks follow the first exploration's, round for round
            blocks = tuple(old + new.get(c, ()) for c, old in zip(st.candidates, st.earlier,
                                                                  strict=True))
            counted = tuple(a + b for a, b in zip(st.earlier_counted, counted, strict=True))
        else:
            blocks = tuple(new[c] for c in st.candidates)
        # a candidate with a block some rank did not time cannot win
        medians = tuple(statistics.median(b) if all(map(math.isfinite, b)) else math.inf
                        for b in blocks)
        finite = [i for i, x in enumerate(medians) if math.isfinite(x)]
        prior_at = st.candidates.index(st.prior) if st.prior in st.candidates else None
        st.medians, st.blocks = medians, blocks
        st.samples = {}
        if st.runoff is not None:
            # only the two that ran off are compared (the others' blocks are fewer)
            challenger = next(st.candidates.index(c) for c in st.runoff if c != st.prior)
            won = self._wins_runoff(blocks[challenger], blocks[prior_at])
            st.chosen, st.why = ((st.candidates[challenger], "measured") if won
                                 else (st.prior, st.prior_why))
        elif not finite:
            st.chosen, st.why = st.prior, st.prior_why
        else:
            best = min(finite, key=lambda i: medians[i])  # ties: the earlier candidate
            contested = (prior_at is not None and prior_at != best
                         and math.isfinite(medians[prior_at]))
            if not contested:
                st.chosen, st.why = st.candidates[best], "measured"
            elif self._beats(medians[best], blocks[best], medians[prior_at],
                             blocks[prior_at]):
                st.chosen, st.why = st.candidates[best], "measured"
            elif self.runoff_rounds and medians[prior_at] > self.margin * medians[best]:
                # faster by more than the margin, but a gap the blocks' spread could make:
                # the two run off
                st.runoff = tuple(c for i, c in enumerate(st.candidates)
                                  if i in (best, prior_at))
                st.earlier, st.earlier_counted = blocks, counted
                st.start = st.last_index + 1
                return
            else:
                st.chosen, st.why = st.prior, st.prior_why
        st.runoff = st.earlier = st.earlier_counted = None
        st.counted = counted
        st.committed_at = st.last_index

    def _wins_runoff(self, blocks: tuple[float, ...], prior_blocks: tuple[float, ...]) -> bool:
        """Whether the runoff's challenger (its blocks, the first exploration's then the
        runoff's) replaces the prior (its blocks of the same rounds): block ``j`` of each ran
        in the same round, one right after the other, so a drift of the load falls on both
        alike and the pair is compared, not the blocks' spreads. The challenger wins when
        the median of the pairs' ratios (the prior's block over its own) exceeds the margin
        and its block was the faster in every pair but at most one (a block disturbed by
        preemption loses its pair, whichever candidate it hit)."""
        if not all(map(math.isfinite, blocks + prior_blocks)):
            return False  # a block some rank did not time: the challenger cannot win
        ratios = [p / c for c, p in zip(blocks, prior_blocks, strict=True) if c > 0]
        if len(ratios) != len(blocks):
            return False
        faster = sum(1 for x in ratios if x > 1)
        return statistics.median(ratios) > self.margin and faster >= len(ratios) - 1

    def _beats(self, median: float, blocks: tuple[float, ...], prior_median: float,
               prior_blocks: tuple[float, ...]) -> bool:
        """Whether the fastest candidate (its median block and blocks) replaces the prior:
        faster by more than the margin and either clear of the spreads (its slowest block
        faster than the prior's fastest) or decisively faster (its median more than
        :data:`DECISIVE` times faster than the prior's, and faster than the prior's fastest
        block: load only adds time, so a slow block of the winner is what preemption made,
        while a block of the prior faster than the winner's median would say the prior can
        run faster than it)."""
        if not prior_median > self.margin * median:
            return False
        if max(blocks) < min(prior_blocks):
            return True
        return prior_median > self.decisive * median and median < min(prior_blocks)

    def _review(self, st: _State, agreed: tuple[float, ...]) -> None:
        at = st.candidates.index(st.chosen)
        others = [x for i, x in enumerate(agreed) if i != at and 0 < x < math.inf]
        st.samples = {}
        if others and agreed[at] > self.contradicted * min(others):
            st.chosen = st.why = None
            st.medians = st.counted = st.blocks = None
            st.runoff = st.earlier = st.earlier_counted = None
            st.start = st.last_index + 1

    # -- reading -----------------------------------------------------------------------------

    def exploring(self, key: TuningKey) -> bool:
        """Whether ``key`` was begun and explores (its calls run the candidates in turn)."""
        st = self._states.get(key)
        return st is not None and st.chosen is None

    def committed(self, key: TuningKey) -> str | None:
        """The algorithm ``key`` is committed to, None while exploring or not begun."""
        st = self._states.get(key)
        return None if st is None else st.chosen

    def keys(self) -> list[TuningKey]:
        return sorted(self._states)

    def report(self, key: TuningKey) -> TuningReport:
        """What ``explain`` shows for ``key``."""
        return self._report(key, self._state(key))

    @staticmethod
    def _report(key: TuningKey, st: _State) -> TuningReport:
        rows = []
        for i, c in enumerate(st.candidates):
            measured = (st.medians[i] if st.medians is not None
                        and 0 < st.medians[i] < math.inf else None)
            samples = (st.counted[i] if st.counted is not None
                       else sum(map(len, st.samples.get(c, {}).values())))
            blocks = st.blocks[i] if st.blocks is not None else ()
            rows.append(CandidateTiming(c, st.predicted.get(c), measured, samples, blocks))
        return TuningReport(key, "exploring" if st.chosen is None else "committed",
                            st.chosen, st.why, st.prior, tuple(rows), st.runoff or ())

    def table_entries(self) -> Mapping[TuningKey, tuple[str, tuple[str, ...],
                                                       tuple[float, ...] | None, str]]:
        """The committed keys this job decided (not those seeded from a table):
        key -> (algorithm, candidates, agreed medians, why), for the tuning table."""
        return {k: (s.chosen, s.candidates, s.medians, s.why)
                for k, s in sorted(self._states.items())
                if s.chosen is not None and s.why != "table"}

    def _state(self, key: TuningKey) -> _State:
        try:
            return self._states[key]
        except KeyError:
            raise KeyError(f"{key} was not begun (Tuner.begin)") from None
