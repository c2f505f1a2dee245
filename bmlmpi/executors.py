"""Which executor runs a compiled plan: the one place that asks.

A schedule compiles to one of two kinds of plan (:meth:`bmlmpi.plans.PlanCache.bind`): a
:class:`~bmlmpi.shm.ShmPlan` where it has shared-memory steps, which read and write a node's
shared window (with message phases of their own between them), else a
:class:`~bmlmpi.execute.Plan`, whose steps are MPI messages. Each has its executor, a
:class:`~bmlmpi.execute.Run` or a :class:`~bmlmpi.shm.ShmRun`. Every layer above this one
holds a plan without asking which kind it is and starts it here, so the choice is made once,
in the transport layer, and a third executor is one more branch here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from .execute import Plan, Run, collective_run
from .shm import ShmPlan, ShmRun


def start_allreduce(plan: Plan | ShmPlan, buf: np.ndarray, op: str, tag_base: int,
                    label: str | Callable[[], str], finish: Callable[[], None] | None = None,
                    src: np.ndarray | None = None) -> Run | ShmRun:
    """The run of an allreduce's ``plan`` in place on ``buf`` (``src``: a separate input,
    read where the schedule needs it instead of copied up front, :mod:`bmlmpi.deferred`),
    with tags from ``tag_base``; ``finish`` runs once it completed."""
    if isinstance(plan, ShmPlan):
        return ShmRun(plan, buf, op, tag_base, label, finish, src)
    return Run(plan, buf, op, tag_base, label, finish, src=src)


def start_collective(plan: Plan | ShmPlan, inp: np.ndarray | None, out: np.ndarray | None,
                     op: str, tag_base: int, label: str | Callable[[], str],
                     finish: Callable[[], None] | None = None,
                     dtype: np.dtype | None = None) -> Run | ShmRun:
    """The run of any collective's ``plan`` on this rank's input and output buffers (None
    where it has none), through the schedule's input and output copies:
    :meth:`ShmPlan.start_collective` or :func:`bmlmpi.execute.collective_run`."""
    if isinstance(plan, ShmPlan):
        return plan.start_collective(inp, out, op, tag_base, label, finish, dtype)
    return collective_run(plan, inp, out, op, tag_base, label, finish, dtype)


def defer_behind(run: object, earlier: Iterable[object]) -> None:
    """A message run posts nothing while one of ``earlier`` (runs started before it, oldest
    first) holds its tags (:meth:`bmlmpi.execute.Run.defer_behind`); other runs are left as
    they are."""
    if type(run) is Run:
        run.defer_behind(earlier)


def busy_poll(run: object) -> float:
    """How long a waiter on ``run`` keeps polling without yielding after each progress: the
    shared-memory executor's own bound (:attr:`bmlmpi.shm.ShmRun.busy`), none for the
    others."""
    return run.busy if isinstance(run, ShmRun) else 0.0
