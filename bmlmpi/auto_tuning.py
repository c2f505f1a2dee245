"""A communicator's ``auto``: the prices it is given (a calibration, taken only when an
``auto`` call first needs one, and refused when it cannot be true).

:class:`AutoTuning` belongs to one :class:`~bmlmpi.api.Communicator` (its ``owner``) and reads
only the owner's public side (``comm``, ``rank``, ``size``, ``timeout``, ``plans``).

**When the calibration is taken.** Never at construction, and never for a call that names its
algorithm: a communicator's calls decide ``auto`` without prices (the fixed rule) until its
first blocking ``auto`` call that the calibration would price has completed on every rank;
that call then takes it (:meth:`AutoTuning.after_call`: read from the cache, or measured), on
every rank at the same call — the call's signature says that it asked for ``auto``
(:meth:`bmlmpi.calls.CollectiveCall.signature`), so every rank agreed that it did, and a rank
that refused its arguments raised before it, on every rank. A calibration taken inside a call's
preparation would instead wait for a rank that had refused its arguments until the deadline.
From the next call on, ``auto`` prices with it. The non-blocking and persistent forms never
take it (they decide with what there is).

**The deadline.** A measurement gets the communicator's ``timeout`` (``timeout=``,
``BMLMPI_TIMEOUT``) for all of its phases together (:func:`bmlmpi.calibrate.measure`'s
``budget``): past it every rank stops at the same phase, one warning says so, nothing is
cached, and ``auto`` keeps the fixed rule for this communicator.

**Impossible numbers.** A calibration, cached or just measured, that
:func:`bmlmpi.model.plausibility.implausible` finds impossible is refused: one warning on
logger ``bmlmpi`` (on rank 0; every rank decides alike) names the causes, and ``auto`` keeps
the fixed rule. It is not measured again in the same job: the machine that measured it is
still as busy, and a second measurement would cost the user's call the same again;
``BMLMPI_RECALIBRATE=1`` on a quieter machine replaces it. One measured at a load above the
core count (:func:`~bmlmpi.model.plausibility.overloaded`) is used, with one warning that says
so: it may be true, and its prices only rank what the user's calls then time.
"""

from __future__ import annotations

import logging
from typing import Any

from . import selection
from .calibrate import MeasurementOverrun, calibrate
from .model.estimate import Calibration
from .model.plausibility import implausible, overloaded
from .schedules import algorithms as records

_log = logging.getLogger("bmlmpi")

__all__ = ["AutoTuning", "trusted"]


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


class AutoTuning:
    """``auto``'s prices on one communicator (module docstring)."""

    def __init__(self, owner: Any):
        self.owner = owner
        #: The calibration ``auto`` prices with: None until taken, and where refused.
        self.calibration: Calibration | None = None
        #: Whether the calibration was taken (or given, or refused): it is taken once.
        self.settled = False

    def give(self, calib: Calibration | None) -> None:
        """Price with ``calib`` from now on (as given: not checked), and take none."""
        self.calibration = calib
        self.settled = True
        self.owner.plans.choices.clear()

    def after_call(self, call: Any) -> bool:
        """After blocking ``call`` completed: take the calibration when this is the first
        ``auto`` call it would price (module docstring; collective, the same call on every
        rank). True when taken now: the call's choice was made without it, so the caller
        opens no fast-path entry for its signature (its next call decides again)."""
        if (self.settled or call.requested != records.AUTO
                or not selection.prices_wanted(call.collective, call.total, call.size)):
            return False
        self.give(self.take())
        return True

    def take(self) -> Calibration | None:
        """The calibration, read from the cache or measured within the deadline, where it may
        be true (collective)."""
        owner = self.owner
        try:
            calib = calibrate(owner.comm, timeout=owner.timeout, budget=owner.timeout)
        except MeasurementOverrun as exc:
            if owner.rank == 0:
                _log.warning("bmlmpi: %s (the communicator's timeout, timeout= or "
                             "BMLMPI_TIMEOUT); auto uses the fixed rule on this communicator",
                             exc)
            return None
        return trusted(calib, owner.size, owner.rank)
