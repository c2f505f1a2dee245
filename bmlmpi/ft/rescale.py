"""Mini-batch rescaling after failures (the BML slides), MPI-free.

When x of n data-parallel workers fail, each survivor's mini-batch grows from u to
u + u·x/(n−x) = u·n/(n−x), so that the survivors together still process the global batch u·n
per step and the learning-rate schedule tuned for it stays valid.
"""

from __future__ import annotations

import math

import numpy as np


def rescaled_batch(u: float, n: int, x: int, *, rank: int | None = None) -> float | int:
    """Each survivor's mini-batch after x of n ranks failed: u + u·x/(n−x) (the BML slides), so the
    n−x survivors together still process the global batch u·n.

    Floats get the exact value. Integers: with ``rank`` (this survivor's index among the n−x,
    e.g. the communicator's new rank) the global batch u·n is split exactly — every survivor
    gets ⌊u·n/(n−x)⌋ and the first (u·n) mod (n−x) survivors one more; without ``rank`` the
    value is rounded half up (⌊u·n/(n−x) + 1/2⌋), which may change the global batch by less
    than (n−x)/2 samples.
    """
    if isinstance(n, bool) or isinstance(x, bool) or not (isinstance(n, int)
                                                          and isinstance(x, int)):
        raise TypeError(f"n and x must be integers, got {n!r}, {x!r}")
    if n < 1 or not 0 <= x < n:
        raise ValueError(f"need n >= 1 and 0 <= x < n, got n={n}, x={x}")
    if isinstance(u, bool) or not isinstance(u, (int, float, np.integer, np.floating)):
        raise TypeError(f"u must be a number, got {u!r}")
    if u < 0 or (isinstance(u, (float, np.floating)) and not math.isfinite(u)):
        raise ValueError(f"u must be a non-negative finite number, got {u}")
    survivors = n - x
    if isinstance(u, (float, np.floating)):
        if rank is not None:
            raise ValueError("rank= splits integer batches; a float batch is exact")
        return float(u) + float(u) * x / survivors
    total = int(u) * n
    if rank is None:
        return (2 * total + survivors) // (2 * survivors)
    if not 0 <= rank < survivors:
        raise ValueError(f"rank {rank} outside the {survivors} survivors")
    base, extra = divmod(total, survivors)
    return base + (1 if rank < extra else 0)
