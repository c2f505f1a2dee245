"""A communicator's ``auto``: the prices it is given (a calibration, taken only when an
``auto`` call first needs one, and refused when it cannot be true), and the choice it makes by
timing the user's own calls (:class:`bmlmpi.tuner.Tuner`), kept in the tuning table
(:mod:`bmlmpi.tuning_table`).

:class:`AutoTuning` belongs to one :class:`~bmlmpi.api.Communicator` (its ``owner``) and reads
only the owner's public side (``comm``, ``control``, ``rank``, ``size``, ``timeout``,
``plans``, ``policy``, ``nodes()``).

**When the prices are taken.** Never at construction, and never for a call that names its
algorithm. A communicator's ``auto`` runs without prices (the fixed rule) until its first
blocking ``auto`` call that has anything to choose (not empty, more than one rank, no
``BMLMPI_ALGORITHM``) has completed on every rank; that call then takes them
(:meth:`AutoTuning.after_call`), on every rank at the same call — the call's signature says
that it asked for ``auto`` (:meth:`bmlmpi.calls.CollectiveCall.signature`), so every rank
agreed that it did, and a rank that refused its arguments raised before it, on every rank. A
collective taken inside a call's preparation would instead wait for a rank that had refused
its arguments until the deadline. The prices are the calibration (where
``BMLMPI_CALIBRATE`` is on: read from the cache that ``bmlmpi-calibrate`` fills; none where
it holds none, and then the user's calls time every applicable record) and the tuning table
(rank 0 reads it, every rank gets its entries). Reading both is two broadcasts: no job
measures a calibration unless ``BMLMPI_RECALIBRATE=1`` asks it to, since a measurement
costs the user's first call seconds (minutes on a slow network). From the next call on,
``auto`` prices with them, and what was explored before starts afresh. The non-blocking and
persistent forms never take them (they decide with what there is).

**The deadline.** A measurement that ``BMLMPI_RECALIBRATE=1`` asks for gets the
communicator's ``timeout`` (``timeout=``, ``BMLMPI_TIMEOUT``) for all of its phases together
(:func:`bmlmpi.calibrate.measure`'s ``budget``): past it every rank stops at the same phase,
one warning says so, nothing is cached, and ``auto`` keeps the fixed rule for this
communicator.

**Impossible numbers.** A calibration, cached or just measured, that
:func:`bmlmpi.model.plausibility.implausible` finds impossible is refused: one warning on
logger ``bmlmpi`` (on rank 0; every rank decides alike) names the causes, and ``auto`` keeps
the fixed rule. It is not measured again in the same job: the machine that measured it is
still as busy, and a second measurement would cost the user's call the same again;
``BMLMPI_RECALIBRATE=1`` on a quieter machine replaces it. One measured at a load above the
core count (:func:`~bmlmpi.model.plausibility.overloaded`) is used, with one warning that says
so: it may be true, and its prices only rank what the user's calls then time.

**Measuring the user's calls.** Each ``auto`` call belongs to a :class:`~bmlmpi.tuner.
TuningKey` (:meth:`AutoTuning.key`). Its preparation (every form) asks :meth:`choice`: the
key's committed algorithm, else the prior (the model's or the rule's pick), opening the key
from ``auto``'s priced explanation. A blocking call on the plain policy then asks
:meth:`explore`: while its key explores, the call runs the candidate the key's call index
names (:meth:`bmlmpi.tuner.Tuner.choose`: the candidates' blocks of consecutive calls in
turn; the index counts the key's completed blocking calls, the same on every rank) and is
timed; :meth:`after_call` records its time, and at the key's last exploration call every
rank MAX-reduces its proposal on the control channel and commits. Its time is its run's
alone: it starts where the checked path has agreed on the call (:meth:`launching`), so that
the first call of each candidate's signature, which gathers every rank's signature on the
control channel, is timed as the committed signature's fast path will run it. Each
candidate's first exploring call opens the candidate's own fast-path entry
(:meth:`candidate_key`: never a named call's), and the key's later calls of that candidate
run it (:meth:`explore_fast`), timed around the entry's run and counted as the checked path
counts its calls, on whichever path each rank takes (the same MPI calls, numbers and tags):
the candidates are compared by the calls the committed signature will make. Once committed,
the signature's next call opens its entry for the committed algorithm, and the fast path
runs it without asking anything here. Committed keys are not reviewed (the Tuner's review
needs every call of the key counted, and the fast path counts nothing). A persistent request
takes the choice at its ``…_init`` (committed, else the prior) and keeps it: its plan is
compiled there. Floating MIN and MAX are not tuned (the MPI library's own call does not
propagate NaN as bmlmpi's kernels do, so ``auto`` never hands it those): their ``auto`` is
the priced choice. So is the fault-tolerant policy's: it neither explores (a call's
algorithm is entered in its ledger as prepared) nor reads the table (its recovery knows the
schedules the fixed rule and the model pick, not every one a table may name).

**Carried calls.** A reproducible call (:mod:`bmlmpi.call_formats`) costs what the plain
call does not: its key is its own (:attr:`bmlmpi.tuner.TuningKey.wire`), apart from the
plain call of the same arrays, and its candidates are priced on the words' path (where it
sums where its addends meet, an overprice the measurement corrects)
(:meth:`bmlmpi.plans.PlanCache.carried_prices`: a float32 value one word, a float64 value
two). Its blocking calls explore and commit as a plain call's do; the call after which the
prices are taken runs the priced choice (a plain one runs the MPI library's own call).

The fault-tolerant policy takes its calibration at construction instead, where its
algorithm is ``auto`` (:meth:`AutoTuning.at_construction`: every rank is alive there).

**The table.** Keys seeded from the table commit at their first call (``why="table"``); the
keys this communicator committed are merged into the table at ``Free()`` (or at exit, for one
never freed) by rank 0 (:func:`bmlmpi.tuning_table.save`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, selection, tuning_table
from .calibrate import MeasurementOverrun, calibrate, mpi_library
from .execute import wait_request
from .model.estimate import Calibration
from .model.plausibility import implausible, overloaded
from .schedules import algorithms as records
from .schedules.collectives import collective as collective_record
from .tuner import DECISIVE, Tuner, TuningKey, TuningReport, size_class

_log = logging.getLogger("bmlmpi")

__all__ = ["AutoTuning", "Timing", "trusted"]


def _describe(calib: Calibration, ranks: int) -> str:
    source = calib.meta.get("source", "given")
    where = calib.meta.get("cache")
    return (f"the {source} calibration of {ranks} rank{'s' if ranks != 1 else ''}"
            + (f" ({where})" if where else ""))


def trusted(calib: Calibration, ranks: int, rank: int) -> Calibration | None:
    """``calib`` (measured on ``ranks`` ranks) where it may be true, else None; one warning on
    logger ``bmlmpi`` (from ``rank`` 0) names why it is refused, or that it was measured at a
    load above the core count (used all the same)."""
    causes = implausible(calib, ranks)
    busy = overloaded(calib)
    if causes:
        if rank == 0:
            _log.warning("bmlmpi: %s is refused, it cannot be true: %s%s. auto uses the fixed "
                         "rule instead; BMLMPI_RECALIBRATE=1 on a quiet machine measures it "
                         "again.", _describe(calib, ranks), "; ".join(causes),
                         f" (it was {busy})" if busy else "")
        return None
    if busy and rank == 0:
        _log.warning("bmlmpi: %s was %s; auto prices with it all the same. "
                     "BMLMPI_RECALIBRATE=1 on a quiet machine measures it again.",
                     _describe(calib, ranks), busy)
    return calib


@dataclass
class Timing:
    """One blocking call as :meth:`AutoTuning.explore` let it run: its ``key`` and call
    ``index`` (None: not explored), the candidate ``name`` it runs, when its run
    ``started`` (:attr:`AutoTuning.clock`: at :meth:`AutoTuning.explore`, and again at
    :meth:`AutoTuning.launching` where the checked path agrees on the call first), and
    whether its signature may open a fast-path entry (``opens``: not while its key
    explores, nor for the call after which the prices are taken)."""

    key: TuningKey | None
    index: int
    name: str
    started: float
    opens: bool


_PLAIN = Timing(None, 0, "", 0.0, True)


class _Table:
    """Where a communicator's table lies and what rank 0 merges into it at the end."""

    def __init__(self, path: Any, host: str, mpi: str, ranks: int, layout: str):
        self.path, self.host, self.mpi, self.ranks, self.layout = path, host, mpi, ranks, layout
        self.tuner: Tuner | None = None

    def save(self) -> None:
        tuner = self.tuner
        if tuner is None:
            return
        entries = {k: e for k, e in tuning_table.entries_from(tuner).items()
                   if k.ranks == self.ranks and k.layout == self.layout}
        if entries:
            tuning_table.save(self.path, entries, host=self.host, mpi=self.mpi,
                              ranks=self.ranks, layout=self.layout)


def _bcast_lines(comm: MPI.Comm, lines: list[str] | None, timeout: float) -> list[str]:
    """Rank 0's ``lines`` on every rank of ``comm``, each wait under the deadline."""
    data = b"" if lines is None else "\n".join(lines).encode()
    size = np.array([len(data)], dtype=np.int64)
    wait_request(comm.Ibcast(size, root=0), timeout, "bmlmpi auto: sharing the tuning table")
    buf = np.frombuffer(data, dtype=np.uint8).copy() if comm.Get_rank() == 0 else \
        np.empty(int(size[0]), dtype=np.uint8)
    if size[0]:
        wait_request(comm.Ibcast(buf, root=0), timeout, "bmlmpi auto: sharing the tuning table")
    text = buf.tobytes().decode()
    return text.split("\n") if text else []


def _entry(line: str, ranks: int, layout: str) -> tuning_table.TableEntry:
    """A line rank 0 loaded (and so checked) back into its entry."""
    row = json.loads(line)
    key = TuningKey(row["collective"], row["bytes"], row["dtype"], row["op"], ranks, layout,
                    row["root"], row.get("wire", ""))
    medians = row.get("medians")
    return tuning_table.TableEntry(
        key, row["algorithm"], row.get("why", "measured"), tuple(row.get("candidates", ())),
        None if medians is None else tuple(float("inf") if m is None else m for m in medians))


class AutoTuning:
    """``auto`` on one communicator (module docstring)."""

    def __init__(self, owner: Any):
        self.owner = owner
        #: The calibration ``auto`` prices with: None until taken, and where refused.
        self.calibration: Calibration | None = None
        #: Whether the prices were taken (or given, or refused): they are taken once.
        self.settled = False
        #: Per-key exploration and commit (:class:`bmlmpi.tuner.Tuner`).
        self.tuner = _new_tuner()
        #: Each exploring key's completed blocking calls: its next call's index.
        self.calls: dict[TuningKey, int] = {}
        #: What times a call (a test may put a clock of its own here).
        self.clock = time.perf_counter
        #: The exploring call between :meth:`explore` and :meth:`after_call` (None: none).
        self._timed: Timing | None = None
        #: Each exploring blocking signature's key, by its fast-path signature
        #: (:func:`bmlmpi.fast_path.fast_key` of the call as asked: ``auto``), so that its
        #: later calls run their candidates' fast-path entries (:meth:`explore_fast`).
        self._exploring: dict[tuple, TuningKey] = {}
        self._layout: str | None = None
        self._table: _Table | None = None
        self._saver: weakref.finalize | None = None

    # -- the prices ---------------------------------------------------------------------------
    def give(self, calib: Calibration | None) -> None:
        """Price with ``calib`` from now on (as given: not checked), and take none."""
        self.calibration = calib
        self.settled = True
        self.owner.plans.choices.clear()

    def _settles(self, call: Any) -> bool:
        """Whether the prices are taken after ``call`` (the same answer on every rank)."""
        return (not self.settled and call.requested == records.AUTO
                and not self.owner.policy.keeps_calls
                and selection.auto_decides(call.collective, call.total, call.size))

    def at_construction(self) -> None:
        """A policy that keeps its calls (the fault-tolerant one) takes its calibration at
        the communicator's construction, where its algorithm is ``auto``: every rank is alive
        there, while after a call that lost ranks a collective of its own would fail (the
        call's own recovery is the policy's). Others take their prices after their first
        ``auto`` call (module docstring)."""
        owner = self.owner
        if owner.policy.keeps_calls and owner.algorithm == records.AUTO:
            self.give(self.take())

    def take(self) -> Calibration | None:
        """The cached calibration where it may be true (collective); None without one
        (none cached, ``BMLMPI_CALIBRATE=0``). Measured only where ``BMLMPI_RECALIBRATE``
        asks, within the deadline."""
        owner = self.owner
        if not selection.calibration_wanted(records.AUTO):
            return None
        try:
            # only the cache: a measurement costs the user's call seconds (minutes on a slow
            # network); BMLMPI_RECALIBRATE=1 asks for one, within the deadline
            calib = calibrate(owner.comm, timeout=owner.timeout, budget=owner.timeout,
                              measure_missing=False)
        except MeasurementOverrun as exc:
            if owner.rank == 0:
                _log.warning("bmlmpi: %s (the communicator's timeout, timeout= or "
                             "BMLMPI_TIMEOUT); auto uses the fixed rule on this communicator",
                             exc)
            return None
        return None if calib is None else trusted(calib, owner.size, owner.rank)

    def _take_prices(self) -> None:
        """The calibration and the tuning table (collective); what was explored so far is
        dropped (priced without them) and the table's entries seed a fresh Tuner."""
        self.give(self.take())
        self.tuner, self.calls = _new_tuner(), {}
        self._exploring.clear()
        owner = self.owner
        layout = self.layout()
        lines = None
        if owner.rank == 0:
            host = MPI.Get_processor_name()[:64]
            mpi = mpi_library()
            path = tuning_table.table_path(host, mpi, owner.size, layout)
            self._table = _Table(path, host, mpi, owner.size, layout)
            lines = [e.to_line() for e in
                     tuning_table.load(path, ranks=owner.size, layout=layout).values()]
        entries = [_entry(line, owner.size, layout)
                   for line in _bcast_lines(owner.control, lines, owner.timeout)]
        tuning_table.seed(self.tuner, {e.key: e for e in entries})
        if self._table is not None:
            self._table.tuner = self.tuner
            self._saver = weakref.finalize(self, _Table.save, self._table)

    def save(self) -> None:
        """Merge this communicator's committed choices into its tuning table (rank 0; once:
        at ``Free()``, else at exit)."""
        if self._saver is not None:
            self._saver()

    # -- the user's calls ---------------------------------------------------------------------
    def layout(self) -> str:
        """Which ranks share a node (:func:`bmlmpi.tuning_table.layout_name`)."""
        if self._layout is None:
            nodes = self.owner.plans.placement.nodes_for_auto()
            sizes = nodes.sizes if nodes is not None else (1,) * self.owner.size
            self._layout = tuning_table.layout_name(sizes)
        return self._layout

    def key(self, collective: str, total: int, dtype: np.dtype, op: str,
            root: int, wire: Any = None) -> TuningKey | None:
        """The key of an ``auto`` call of ``collective`` (``total`` elements of ``dtype``; a
        collective that reduces nothing is keyed by its bytes alone; ``wire``: the carrier of
        a call carried in a call format, :mod:`bmlmpi.call_formats`, whose name the key
        holds); None for a call that is not tuned (floating MIN and MAX, module
        docstring)."""
        record = collective_record(collective)
        if record.reduces and op in ("min", "max") and dtype.kind == "f":
            return None
        # a collective that reduces nothing moves bytes: its dtype is no part of its key
        # (the family's calls move them as bytes)
        return TuningKey(collective, size_class(total * dtype.itemsize),
                         dtype.name if record.reduces else "", op if record.reduces else "",
                         self.owner.size, self.layout(), root if record.rooted else None,
                         "" if wire is None else wire.name)

    def call_key(self, call: Any) -> TuningKey | None:
        """:meth:`key` of a prepared ``call`` (its carrier included)."""
        return self.key(call.collective, call.total, call.dtype, call.op, call.root, call.wire)

    def choice(self, key: TuningKey | None, explanation: selection.Explanation) -> str:
        """What an ``auto`` call of ``key`` runs when it is not explored (every form's
        preparation): the committed algorithm, else the prior; opens the key."""
        if key is None or self.owner.policy.keeps_calls:
            return explanation.chosen
        report = self.tuner.begin(key, explanation)
        return report.chosen or report.prior

    def explore(self, call: Any, sig: tuple | None = None) -> Timing:
        """Before a prepared blocking ``call`` runs: while its key explores (plain policy),
        the candidate its call index names runs instead (``call.algorithm``), timed from
        now; ``sig``: the call's fast-path signature as asked (None: it has none), whose
        later calls then run their candidates' fast-path entries (:meth:`explore_fast`).
        The call after which the prices are taken is not timed (what it would measure
        starts afresh with the prices) and runs the MPI library's own call where ``auto``
        may hand it this one: a job's first call then compiles no plan and loads no kernels
        (seconds for a schedule's first run in a fresh process)."""
        opens = not self._settles(call)
        self._timed = None  # (a call that raised before its after_call left one behind)
        if not opens:
            default = records.default(call.collective)
            if (call.wire is None and default.serves(call.collective)
                    and self.call_key(call) is not None):
                call.algorithm = default.name
            return Timing(None, 0, "", 0.0, False)
        if call.requested != records.AUTO or self.owner.policy.keeps_calls:
            return _PLAIN
        key = self.call_key(call)
        if key is None or self.tuner.committed(key) is not None:
            return _PLAIN
        index = self.calls.get(key, 0)
        name = call.algorithm = self.tuner.choose(key, index)
        if sig is not None and call.wire is None:
            self._exploring[sig] = key
        timing = self._timed = Timing(key, index, name, self.clock(), False)
        return timing

    def explore_fast(self, sig: tuple, args: tuple, fast: Any) -> bool:
        """A blocking call of an exploring signature (``sig``: its fast-path signature as
        asked, :meth:`explore`) whose candidate for this call has a fast-path entry: that
        entry run (``fast``: the communicator's :class:`~bmlmpi.fast_path.FastPath`, its
        ``run_key``, on the public method's ``args``) and timed as the committed
        signature's calls will run, then recorded as :meth:`after_call` records the
        checked path's; False where the checked path must run the call (no such signature
        or entry, a fast path not allowed now).

        The candidates' entries open at their checked calls (the first of each), so an
        exploration compares the candidates by the calls the user's loop will make once
        committed, not by the checked path's, which costs microseconds more a call (tens
        where ranks share cores): at 8-16 B on 4 ranks of 2 cores the checked path's native
        broadcast and reduce were timed three times the schedules' while their fast path
        ran ten times faster than the schedule then committed."""
        key = self._exploring.get(sig)
        if key is None or self.owner.check != "first-call":
            return False
        if not self.tuner.exploring(key):
            del self._exploring[sig]
            return False
        index = self.calls.get(key, 0)
        name = self.tuner.choose(key, index)
        clock = self.clock
        started = clock()
        if not fast.run_key(self.candidate_key(sig, name), args):
            return False
        self.tuner.record(key, name, clock() - started)
        self.calls[key] = index + 1
        if self.tuner.due(key, index):
            self._agreement(key)
        return True

    def _agreement(self, key: Any) -> None:
        """The key's proposal agreed across ranks and handed to the Tuner; a key that
        committed forgets its call count, one that runs off counts on (the runoff's calls
        follow the exploration's, :meth:`bmlmpi.tuner.Tuner.choose`)."""
        self.tuner.commit(key, self._agree(self.tuner.proposal(key)))
        if self.tuner.committed(key) is not None:
            self.calls.pop(key, None)

    @staticmethod
    def candidate_key(sig: tuple, name: str) -> tuple:
        """The fast-path signature of candidate ``name`` of the exploring signature ``sig``:
        ``sig`` with (the algorithm asked, ``name``) in the algorithm's place, never the key
        of a call that names ``name`` itself. Such a call's first call is agreed by every
        rank before any rank takes its entry; a candidate's entry opens after the first
        exploring call of the candidate, which every rank agreed on, and may be open on
        some ranks only (a rank whose buffers it cannot carve)."""
        return (sig[0], (sig[1], name), *sig[2:])

    def candidate_sig(self, sig: tuple | None, timing: Timing) -> tuple | None:
        """The fast-path signature an exploring checked call (``timing``) opens
        (:meth:`candidate_key`); None for a call that does not explore, and where every call
        is agreed (``check="every-call"``: no call may skip its agreement)."""
        if sig is None or timing.key is None or self.owner.check != "first-call":
            return None
        return self.candidate_key(sig, timing.name)

    def launching(self) -> None:
        """The checked path agreed on the call it is about to launch: an exploring call's
        time starts here, so that it is the run's alone, as the committed signature's fast
        path will run it without any agreement (the first call of each candidate's
        signature gathers every rank's signature on the control channel first)."""
        timing = self._timed
        if timing is not None:
            timing.started = self.clock()

    def after_call(self, call: Any, timing: Timing = _PLAIN) -> bool:
        """After blocking ``call`` completed on this rank: its time recorded and, at its
        key's last exploration call, the proposal agreed across ranks and committed; then the
        prices taken where this was the first call to take them. True when the call's
        signature may open its fast-path entry."""
        key = timing.key
        self._timed = None
        if key is not None:
            self.tuner.record(key, timing.name, self.clock() - timing.started)
            self.calls[key] = timing.index + 1
            if self.tuner.due(key, timing.index):
                self._agreement(key)
        if self._settles(call):
            self._take_prices()
            return False
        return timing.opens

    def _agree(self, proposal: tuple[float, ...]) -> np.ndarray:
        """``proposal`` MAX-reduced over every rank on the control channel: the slowest
        rank's median of each candidate counts."""
        mine = np.array(proposal, dtype=np.float64)
        agreed = np.empty_like(mine)
        owner = self.owner
        wait_request(owner.control.Iallreduce(mine, agreed, MPI.MAX), owner.timeout,
                     "bmlmpi auto: not every rank joined the agreement on its measured times")
        return agreed

    # -- what explain shows -------------------------------------------------------------------
    def explained(self, key: TuningKey | None,
                  explanation: selection.Explanation) -> selection.Explanation:
        """``explanation`` told as the tuner decides: the algorithm the next blocking call
        runs (committed; while exploring, the candidate its call index names) and, per
        candidate, the predicted time, the agreed median and why
        (:class:`bmlmpi.tuner.TuningReport`). Local: opens nothing."""
        if key is None or self.owner.policy.keeps_calls:
            return explanation
        if not self.settled and selection.auto_decides(key.collective, explanation.count,
                                                       self.owner.size):
            default = records.default(key.collective)
            if key.wire:   # explore() leaves a carried call the priced choice for its words
                return dataclasses.replace(
                    explanation, rule="first call",
                    why=(f"{explanation.chosen}, untimed: this communicator's first blocking "
                         f"auto call runs the priced choice for the {key.wire} words it "
                         f"carries, and auto takes its prices (calibration, tuning table) "
                         f"after it"))
            if default.serves(key.collective):  # as explore() hands a plain call over
                return dataclasses.replace(
                    explanation, chosen=default.name, rule="first call",
                    why=(f"{default.name}, untimed: this communicator's first blocking auto "
                         f"call runs the MPI library's own call, and auto takes its prices "
                         f"(calibration, tuning table) after it"))
        report: TuningReport = self.tuner.preview(key, explanation)
        if report.state == "committed":
            if report.why == "rule":
                return dataclasses.replace(explanation, tuning=report)
            return dataclasses.replace(
                explanation, chosen=report.chosen, rule=report.why, tuning=report,
                why=_committed_why(report))
        names = [c.name for c in report.candidates]
        index = self.calls.get(key, 0)
        begun = key in self.tuner.keys()
        nxt = self.tuner.choose(key, index) if begun else names[0]
        block = self.tuner.block_calls_at(key.size)
        lead = self.tuner.lead_calls_at(key.size)
        settling = f" after {lead} settling calls not counted" if lead else ""
        margin = f"{100 * (self.tuner.margin - 1):.0f} %"
        if report.runoff:
            calls = len(report.runoff) * self.tuner.calls_per_candidate(
                key.size, self.tuner.runoff_rounds)
            why = (f"blocking call {index + 1} on this signature runs {nxt}: "
                   f"{' and '.join(report.runoff)} run off ({calls} calls, "
                   f"{self.tuner.runoff_rounds} rounds of blocks of {block} counted "
                   f"calls{settling}), the fastest median more than {margin} ahead of "
                   f"{report.prior}'s but within the blocks' spread; then every rank commits "
                   f"to the challenger if its block beat {report.prior}'s in every round but "
                   f"one and the median of their ratios exceeds the margin, else to "
                   f"{report.prior}")
        else:
            calls = len(names) * self.tuner.calls_per_candidate(key.size)  # exploration_calls
            why = (f"blocking call {index + 1} of the {calls} that time the candidates "
                   f"{', '.join(names)} in blocks of {block} counted calls{settling} on this "
                   f"signature runs {nxt}; then "
                   f"every rank commits to the fastest median block (the slowest rank's "
                   f"blocks count), {report.prior} unless another's is more than {margin} "
                   f"faster and its slowest block faster than {report.prior}'s fastest, or "
                   f"its median more than {self.tuner.decisive:g} times faster and faster "
                   f"than {report.prior}'s fastest block"
                   + (f" (more than {margin} faster, but neither: the two run off)"
                      if self.tuner.runoff_rounds else ""))
        return dataclasses.replace(explanation, chosen=nxt, rule="exploring", tuning=report,
                                   why=why)


def _new_tuner() -> Tuner:
    """A Tuner whose exploration blocks hold ``BMLMPI_TUNING_BLOCK`` calls at small sizes and
    whose runoffs run ``BMLMPI_TUNING_RUNOFF`` rounds."""
    return Tuner(block_calls=config.get("BMLMPI_TUNING_BLOCK"),
                 runoff_rounds=config.get("BMLMPI_TUNING_RUNOFF"))


def _committed_why(report: TuningReport) -> str:
    if report.why == "table":
        return f"{report.chosen}: the tuning table's entry for this signature"
    if report.why == "measured":
        return (f"{report.chosen}: the fastest of the candidates timed on this signature's "
                f"calls (the slowest rank's median)")
    return (f"{report.chosen} kept ({report.why}'s pick): no candidate's median block was "
            f"more than the margin faster with its slowest block faster than "
            f"{report.chosen}'s fastest, nor more than {DECISIVE:g} times faster with its "
            f"median faster than {report.chosen}'s fastest block")
