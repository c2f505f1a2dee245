"""Bandwidth-only predictions the measurements are compared with (links have no added delay).

BML on BCube(n_0, …, n_{k-1}) splits P bytes into k pipeline slices; pipeline e visits the
levels e, e+1, …, e+k-1 (mod k). A reduce-scatter step at level l keeps 1/n_l of what it holds
and sends the other (n_l-1)/n_l of it to its level-l peers; the allgather replays the same bytes.
So the bytes a server sends on its level-l NIC, as a fraction of P, are

    share_l = 2 · Σ_e (1/k) · (n_l-1)/n_l · 1 / prod(n of the levels pipeline e visits before l)

and the time is max_l share_l · P / R. With equal radices every share is 2(N-1)/(kN), the
paper's 2(N-1)/(kN) · P/R. A ring or parameter server over one NIC per server (the Fat-Tree
twin) sends 2(N-1)/N · P from every server: 2(N-1)/N · P/R.

All-to-all, each server sending P bytes in all (its row: a block of P/N to every server, its
own included). On the one-NIC Fat-Tree every server must send its N−1 other blocks out of its
one NIC and receive N−1 through it: (N−1)/N · P/R for any algorithm, a lower bound that the
pairwise exchange meets (Thakur, Rabenseifner and Gropp, IJHPCA 2005). On BCube a block
crosses one level-l link for each digit l in which its source and destination differ (BCube's
shortest paths correct one digit a hop, Guo et al., SIGCOMM 2009, §3), which a block does for
a fraction (n_l−1)/n_l of the destinations: every server's level-l NIC carries (n_l−1)/n_l · P
each way, and with the levels working at once (bmlmpi's ``bcube`` schedule: k pipelines, each
on another level in every step) the time is max_l (n_l−1)/n_l · P/R. BCube(3,2): 2/3 · P/R
against the Fat-Tree's 8/9 · P/R, a ratio of 3/4 (not 1/k: an all-to-all's blocks take
several hops on BCube, each hop on another NIC).
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


def alltoall_nic_shares(radices: tuple[int, ...]) -> list[float]:
    """Fraction of a server's row P that its all-to-all sends out of each level's NIC on
    BCube, the digit by digit exchange (level 0 first)."""
    return [(n - 1) / n for n in radices]


def alltoall_seconds(kind: str, nbytes: float, rate_bps: float,
                     radices: tuple[int, ...]) -> float:
    """The all-to-all bandwidth bound (module docstring): each server's row of ``nbytes``."""
    if kind == "bcube":
        return max(alltoall_nic_shares(radices)) * nbytes * 8 / rate_bps
    n = math.prod(radices)
    return (n - 1) / n * nbytes * 8 / rate_bps


def predicted_seconds(kind: str, algorithm: str, nbytes: float, rate_bps: float,
                      radices: tuple[int, ...], collective: str = "allreduce") -> float | None:
    """The bandwidth-bound time, or None where no closed form applies (ring, native on BCube).
    An all-to-all's: the bound of its topology for every algorithm (``bcube`` meets it on
    BCube, pairwise on the Fat-Tree)."""
    if collective == "alltoall":
        return alltoall_seconds(kind, nbytes, rate_bps, radices)
    n = math.prod(radices)
    if kind == "bcube" and algorithm == "bml":
        return bml_bcube_seconds(nbytes, rate_bps, radices)
    if kind == "fattree":
        # Exact for bml, ring and MPICH's ring (native-ring); for other native algorithms a
        # lower bound: any allreduce sends at least 2(N-1)/N · P from each server's one NIC.
        return one_nic_seconds(nbytes, rate_bps, n)
    return None
