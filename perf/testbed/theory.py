"""Bandwidth-only predictions the measurements are compared with (links have no added delay).

BML on BCube(n_0, …, n_{k-1}) splits P bytes into k pipeline slices; pipeline e visits the
levels e, e+1, …, e+k-1 (mod k). A reduce-scatter step at level l keeps 1/n_l of what it holds
and sends the other (n_l-1)/n_l of it to its level-l peers; the allgather replays the same bytes.
So the bytes a server sends on its level-l NIC, as a fraction of P, are

    share_l = 2 · Σ_e (1/k) · (n_l-1)/n_l · 1 / prod(n of the levels pipeline e visits before l)

and the time is max_l share_l · P / R. With equal radices every share is 2(N-1)/(kN), the
paper's 2(N-1)/(kN) · P/R. A ring or parameter server over one NIC per server (the Fat-Tree
twin) sends 2(N-1)/N · P from every server: 2(N-1)/N · P/R.
"""

from __future__ import annotations

import math


def bml_nic_shares(radices: tuple[int, ...]) -> list[float]:
    """Fraction of P that BML sends out of each level's NIC of every server (level 0 first)."""
    k = len(radices)
    shares = [0.0] * k
    for e in range(k):
        held = 1.0
        for step in range(k):
            lv = (e + step) % k
            shares[lv] += 2.0 / k * held * (radices[lv] - 1) / radices[lv]
            held /= radices[lv]
    return shares


def bml_bcube_seconds(nbytes: float, rate_bps: float, radices: tuple[int, ...]) -> float:
    return max(bml_nic_shares(radices)) * nbytes * 8 / rate_bps


def one_nic_seconds(nbytes: float, rate_bps: float, servers: int) -> float:
    """Ring / parameter server / BML over one NIC per server."""
    return 2 * (servers - 1) / servers * nbytes * 8 / rate_bps


def predicted_seconds(kind: str, algorithm: str, nbytes: float, rate_bps: float,
                      radices: tuple[int, ...]) -> float | None:
    """The bandwidth-bound time, or None where no closed form applies (ring, native on BCube)."""
    n = math.prod(radices)
    if kind == "bcube" and algorithm == "bml":
        return bml_bcube_seconds(nbytes, rate_bps, radices)
    if kind == "fattree":
        # Exact for bml, ring and MPICH's ring (native-ring); for other native algorithms a
        # lower bound: any allreduce sends at least 2(N-1)/N · P from each server's one NIC.
        return one_nic_seconds(nbytes, rate_bps, n)
    return None
