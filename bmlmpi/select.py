"""Which algorithm ``auto`` runs.

The rule (measured on the development machine, see perf/README.md; the cost-model issue
replaces it with a calibrated model): one rank or an empty buffer → nothing to exchange (bml,
which has no steps); messages below ``BMLMPI_AUTO_BML_BYTES`` (default 64 KiB) → native
``MPI_Allreduce``, whose single C call beats a Python-driven schedule on latency; larger
messages → bml. ``BMLMPI_ALGORITHM`` overrides the choice for every call that asks for auto.
"""

from __future__ import annotations

import os

IMPLEMENTED = ("auto", "bml", "native")
DEFAULT_BML_BYTES = 64 * 1024


def algorithms() -> list[str]:
    """The implemented algorithms, ``auto`` first and ``native`` last."""
    return list(IMPLEMENTED)


def check_algorithm(name: str) -> str:
    name = name.lower()
    if name not in IMPLEMENTED:
        raise ValueError(f"unknown algorithm {name!r}; implemented: {', '.join(IMPLEMENTED)}")
    return name


def env_algorithm() -> str | None:
    env = os.environ.get("BMLMPI_ALGORITHM", "").strip()
    return check_algorithm(env) if env else None


def choose(nbytes: int, size: int) -> str:
    """The algorithm ``auto`` uses for ``nbytes`` per rank on ``size`` ranks."""
    env = env_algorithm()
    if env and env != "auto":
        return env
    threshold = int(os.environ.get("BMLMPI_AUTO_BML_BYTES", DEFAULT_BML_BYTES))
    if size == 1 or nbytes == 0 or nbytes >= threshold:
        return "bml"
    return "native"
