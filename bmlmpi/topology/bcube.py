"""BCube(n, k) addressing with mixed radices, MPI-free.

A shape is a tuple of radices ``(n_0, n_1, ..., n_{k-1})`` with N = prod(n_l) servers. Server
``a`` has digits ``a_l = (a // (n_0 · … · n_{l-1})) mod n_l``: digit 0 is the least
significant. Its level-l group is the n_l servers that differ from it only in digit l (the
servers under one level-l switch). Written as text a shape is ``"n_0xn_1x…"``, level 0 first:
``"2x2x3"`` is n_0 = 2, n_1 = 2, n_2 = 3.

Default shape (:func:`default_shape`): the prime factorisation of N in ascending order, one
level per prime factor — 9 → 3x3, 8 → 2x2x2, 12 → 2x2x3, a prime N is one level, N = 1 is
the empty shape (no levels, nothing to exchange). It maximises the number of levels (pipelines)
and keeps every group small, which on shared memory and on BCube hardware alike keeps each step's
fan-out low; users with real BCube hardware name their shape (``BMLMPI_BCUBE=4x4``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .. import config

Shape = tuple[int, ...]


def prime_factors(n: int) -> list[int]:
    if n < 1:
        raise ValueError(f"cannot factorise {n}: need a positive integer")
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def default_shape(n: int) -> Shape:
    return tuple(prime_factors(n))


def parse_shape(text: str | Sequence[int]) -> Shape:
    """``"3x3"`` / ``"2x2x3"`` / ``[3, 3]`` → a validated tuple of radices (level 0 first)."""
    if isinstance(text, str):
        parts = [p for p in text.lower().replace("*", "x").split("x") if p.strip()]
        try:
            radices = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"bad BCube shape {text!r}: expected radices like '3x3' "
                             f"or '2x2x3'") from None
    else:
        radices = tuple(int(r) for r in text)
    if any(r < 1 for r in radices):
        raise ValueError(f"bad BCube shape {text!r}: every radix must be >= 1")
    # A radix of 1 is a level with no peers: harmless, but it would add empty steps.
    return tuple(r for r in radices if r > 1)


def resolve_shape(n: int, shape: str | Sequence[int] | None = None) -> Shape:
    """The shape to use for ``n`` ranks: explicit, else ``BMLMPI_BCUBE``, else the default."""
    source = "topology"
    if shape is None:
        env = config.get("BMLMPI_BCUBE")
        if env:
            shape, source = env, "BMLMPI_BCUBE"
    if shape is None:
        return default_shape(n)
    radices = parse_shape(shape)
    if math.prod(radices) != n:
        raise ValueError(f"BCube shape {shape!r} (from {source}) has "
                         f"{math.prod(radices)} servers but the communicator has {n} ranks")
    return radices


def format_shape(radices: Shape) -> str:
    return "x".join(map(str, radices)) if radices else "1"


@dataclass(frozen=True)
class BCube:
    """Addresses and groups of a mixed-radix BCube."""

    radices: Shape

    @property
    def size(self) -> int:
        return math.prod(self.radices)

    @property
    def levels(self) -> int:
        return len(self.radices)

    def stride(self, level: int) -> int:
        return math.prod(self.radices[:level])

    def digit(self, rank: int, level: int) -> int:
        return (rank // self.stride(level)) % self.radices[level]

    def digits(self, rank: int) -> tuple[int, ...]:
        return tuple(self.digit(rank, lv) for lv in range(self.levels))

    def with_digit(self, rank: int, level: int, value: int) -> int:
        """The rank whose digits equal ``rank``'s except digit ``level`` = ``value``."""
        s = self.stride(level)
        return rank + (value - self.digit(rank, level)) * s

    def group(self, rank: int, level: int) -> list[int]:
        """The level-``level`` group of ``rank``, ordered by digit (member b has digit b)."""
        return [self.with_digit(rank, level, b) for b in range(self.radices[level])]

    def color(self, rank: int, level: int) -> int:
        """A number shared by exactly the members of ``rank``'s level group (for Comm.Split)."""
        return rank - self.digit(rank, level) * self.stride(level)
