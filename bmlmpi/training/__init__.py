"""Data-parallel training support: gradient buckets that overlap allreduces with computation.

* :mod:`.buckets` — :class:`GradientBuckets` (fusion, progress thread, registration check);
* :mod:`.plans` — the bucket plans ``layer``, ``single``, ``threshold``, ``ibatch``;
* :mod:`.ibatch` — iBatch's greedy batching, its allreduce mapping and the exhaustive check;
* :mod:`.costs` — the startup and per-byte times, from the cost model or measured on the comm.
"""

from .buckets import GradientBuckets, RegistrationMismatch, flat_arena
from .ibatch import Batching, Profile, exhaustive_plan, ibatch_plan, iteration_time
from .plans import PLANS, make_plan

__all__ = ["PLANS", "Batching", "GradientBuckets", "Profile", "RegistrationMismatch",
           "exhaustive_plan", "flat_arena", "ibatch_plan", "iteration_time", "make_plan"]
