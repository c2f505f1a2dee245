"""Whether a :class:`~bmlmpi.model.estimate.Calibration` can be true. MPI-free.

A calibration measured while the machine was busy can hold numbers no machine has — a
latency of milliseconds with an infinite bandwidth, say — and ``auto`` would then price every
schedule on them. :func:`implausible` returns the causes that make a calibration impossible
(empty: it may be true):

* ``alpha`` (one step's latency) or ``beta`` (seconds per byte) at 0 on two ranks or more: an
  exchange that costs nothing, an infinite bandwidth (one rank has no partner to exchange
  with, and its calibration holds 0 for both);
* a latency above a whole call: ``alpha`` more than :data:`NOISE` times the MPI library's own
  call of the smallest measured size (that call holds at least one exchange);
* the MPI library's own call of any collective slower at a smaller size than at a larger one
  by more than :data:`NON_MONOTONE` (4x): the same call cannot lose that much by moving less.

:func:`overloaded` says whether it was measured at a load above the core count
(``meta["loadavg"]`` against ``meta["cores"]``, which :func:`bmlmpi.calibrate.measure`
stores): not impossible, but its times are partly other work's, and a choice should not trust
it.

On the 2-core development machine, calibrations cached at 5 and 8 ranks (oversubscribed)
hold a latency of 9.3 and 2.6 ms against a native 8 B allreduce of 0.21 and 0.65 ms: the
exchange that measured ``alpha`` waited for cores. What a caller does with the causes
(measure again, or price nothing and take the fixed rule) is the caller's choice.
"""

from __future__ import annotations

from collections.abc import Iterable

from .estimate import Calibration

__all__ = ["NOISE", "NON_MONOTONE", "implausible", "overloaded"]

#: how far two medians taken moments apart may disagree before one of them is impossible
NOISE = 2.0
#: how much slower a smaller call of the same collective may be before it is impossible
NON_MONOTONE = 4.0


def _non_monotone(collective: str, points: Iterable[tuple[int, float]]) -> list[str]:
    pts = sorted(points)
    causes = []
    for i, (small, t_small) in enumerate(pts):
        for large, t_large in pts[i + 1:]:
            if small < large and t_small > NON_MONOTONE * t_large:
                causes.append(f"the native {collective} of {small} B took "
                              f"{t_small * 1e6:.1f} us, more than {NON_MONOTONE:g}x its "
                              f"{large} B call's {t_large * 1e6:.1f} us")
                break
    return causes


def implausible(calib: Calibration, ranks: int) -> list[str]:
    """The causes that make ``calib``, measured on ``ranks`` ranks, impossible, in words
    (empty: none found)."""
    causes = []
    if ranks >= 2 and calib.alpha <= 0:
        causes.append(f"latency alpha = {calib.alpha:g} s: an exchange that costs nothing")
    if ranks >= 2 and calib.beta <= 0:
        causes.append(f"beta = {calib.beta:g} s/B: an infinite bandwidth")
    if calib.native and calib.alpha > NOISE * calib.native[0][1] > 0:
        b, t = calib.native[0]
        causes.append(f"latency alpha = {calib.alpha * 1e6:.1f} us is above the whole "
                      f"native allreduce of {b} B ({t * 1e6:.1f} us)")
    causes += _non_monotone("allreduce", calib.native)
    by_collective: dict[str, list[tuple[int, float]]] = {}
    for c, b, t in calib.natives:
        by_collective.setdefault(c, []).append((b, t))
    for c, pts in sorted(by_collective.items()):
        causes += _non_monotone(c, pts)
    return causes


def overloaded(calib: Calibration) -> str | None:
    """Why ``calib`` should not be trusted for choices though it may be true: measured at a
    load above the core count; None where its meta says otherwise or says nothing."""
    load, cores = calib.meta.get("loadavg"), calib.meta.get("cores")
    if (isinstance(load, int | float) and not isinstance(load, bool)
            and isinstance(cores, int) and cores > 0 and load > cores):
        return (f"measured at load {load:.1f}, above the {cores} cores: its times are partly "
                f"other work's")
    return None
