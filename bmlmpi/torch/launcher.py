"""One world or none: torch's launcher variables checked against MPI's world.

``torchrun`` (and any launcher that exports ``RANK`` and ``WORLD_SIZE`` but starts each worker
on its own) gives every worker an MPI world of one rank: MPI was not asked to start them, so
each is an MPI singleton. The bmlmpi backend takes its ranks from MPI, so N such workers would
be N separate one-rank jobs whose every ``all_reduce`` returns the worker's own tensor, and the
job would end with status 0. :func:`check_one_world` refuses that on every worker before
anything is sent (each worker decides alone, from its own variables, so none waits for the
others), and the error shows the ``bmlmpi-run`` line that starts the same job as one world.

Connecting the singletons into one MPI world through torch's store (``MPI_Open_port``,
``Comm_accept``/``Comm_connect``, ``Intercomm_merge``) is not done: with the Open MPI 5.0.11
wheel, ``MPI_Comm_accept`` and ``MPI_Comm_connect`` between two singletons both fail at once
with ``MPI_ERR_INTERN`` (docs/torch.md, "Why torchrun is refused, not joined").
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

from mpi4py import MPI


class SeparateWorlds(RuntimeError):
    """The launcher says this process is one of several ranks, but MPI started it alone."""


def relaunch_line(world_size: int, argv: list[str] | None = None) -> str:
    """The ``bmlmpi-run`` command that starts this program as one world of ``world_size``
    ranks: the program's own command line after the interpreter (``sys.orig_argv``), without
    the ``-u`` torchrun adds."""
    args = list(sys.orig_argv[1:] if argv is None else argv)
    if args[:1] == ["-u"]:
        args = args[1:]
    return f"bmlmpi-run -n {world_size} python {shlex.join(args)}"


def check_one_world(env: Mapping[str, str] | None = None, world: MPI.Comm | None = None,
                    argv: list[str] | None = None) -> None:
    """Raise :class:`SeparateWorlds` where the environment's ``WORLD_SIZE`` is above 1 and
    MPI's world (``world``, default ``MPI.COMM_WORLD``) has one rank and no parent (not a
    spawned process): a worker of torchrun or a launcher like it. Else return."""
    env = os.environ if env is None else env
    world = MPI.COMM_WORLD if world is None else world
    given = env.get("WORLD_SIZE", "")
    try:
        size = int(given)
    except ValueError:
        return
    if size <= 1 or world.Get_size() != 1 or MPI.Comm.Get_parent() != MPI.COMM_NULL:
        return
    rank = env.get("RANK", "?")
    raise SeparateWorlds(
        f"bmlmpi.torch: this process is rank {rank} of {size} by its launcher's RANK and "
        f"WORLD_SIZE (torchrun, or another launcher that starts each worker on its own), but "
        f"MPI started it alone, in a world of 1 rank: the bmlmpi backend takes its ranks from "
        f"MPI and would run {size} separate one-rank jobs. Launch it with bmlmpi-run, which "
        f"starts the {size} ranks as one MPI world and exports torch's variables:\n"
        f"    {relaunch_line(size, argv)}\n"
        f"(bmlmpi-run also takes torchrun's flags: bmlmpi-run --nproc_per_node {size} "
        f"SCRIPT ...)")


__all__ = ["SeparateWorlds", "check_one_world", "relaunch_line"]
