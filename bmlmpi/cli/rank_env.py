"""torch's per-rank variables from the MPI launcher's, then the program: what ``bmlmpi-run``
starts in front of a Python program on every rank.

    python -m bmlmpi.cli.rank_env PROGRAM [ARGS ...]     # by hand, e.g. after srun

torch's ``env://`` rendezvous and scripts written for ``torchrun`` read ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. An
MPI launcher gives each rank the same numbers under other names, before MPI starts:

* Open MPI: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``;
* MPICH's hydra: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``;
* Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (``SLURM_NTASKS``),
  ``SLURM_LOCALID`` and this node's entry of ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``).

:func:`torch_variables` takes each of torch's rank numbers from the first of these present
(the launcher's numbers win over any value the environment already had: they are MPI's).
``MASTER_ADDR`` and ``MASTER_PORT`` are the job's, the same on every rank: kept where set
(``bmlmpi-run`` sets them once for the job); under ``srun`` without them, the first node of
the step and a port derived from the job and step ids. :func:`main` sets them and replaces
itself with the program (``exec``: the same process, which the launcher keeps following).

Standard library only, and no import of bmlmpi: ``bmlmpi-run`` starts this file with
``python -S -I`` before the rank's own Python; it imports ``os`` and ``sys`` alone (``re`` or
``typing`` would double its 25 ms a rank), so its mappings are annotated as dicts.
"""

from __future__ import annotations

import os
import sys

#: torch's name: the launchers' names for it, in the order they are looked for
RANK_NAMES = {
    "RANK": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS",
                   "SLURM_NTASKS"),
    "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
    "LOCAL_WORLD_SIZE": ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
}
#: where srun's ports start (torchrun's default MASTER_PORT is 29500; these stay below it)
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 9000


def tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """Slurm's ``2(x3),1`` (2 tasks on each of 3 nodes, then 1) at node index ``node``."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        count, times, repeat = part.strip().partition("(x")
        if times and not (repeat.endswith(")") and repeat[:-1].isdigit()):
            return None
        if not count.isdigit():
            return None
        counts += [int(count)] * (int(repeat[:-1]) if times else 1)
    return counts[node] if 0 <= node < len(counts) else None


def first_host(nodelist: str) -> str | None:
    """The first host of a Slurm host list: ``node[07-09,12],gpu1`` -> ``node07``."""
    text = nodelist.strip()
    comma, bracket = text.find(","), text.find("[")
    if bracket < 0 or 0 <= comma < bracket:       # the first host has no range
        first = text.split(",")[0].strip()
        return first or None
    close = text.find("]", bracket)
    if close < 0:
        return None
    prefix, ranges = text[:bracket], text[bracket + 1:close]
    suffix = text[close + 1:].split(",")[0]
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def torch_variables(env: dict[str, str]) -> dict[str, str]:
    """torch's variables for this rank from the launcher's in ``env`` (module docstring);
    empty where no launcher's are found."""
    out: dict[str, str] = {}
    for name, sources in RANK_NAMES.items():
        value = next((env[s] for s in sources if env.get(s, "").strip().isdigit()), None)
        if value is not None:
            out[name] = value.strip()
    if "LOCAL_WORLD_SIZE" not in out and "SLURM_LOCALID" in env:
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        node = env.get("SLURM_NODEID", "")
        if per_node and node.isdigit():
            count = tasks_on_node(per_node, int(node))
            if count is not None:
                out["LOCAL_WORLD_SIZE"] = str(count)
    if not out:
        return out
    slurm = "SLURM_PROCID" in env and "OMPI_COMM_WORLD_RANK" not in env and \
        "PMI_RANK" not in env
    if not env.get("MASTER_ADDR") and slurm:
        host = first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        if host:
            out["MASTER_ADDR"] = host
    if not env.get("MASTER_PORT") and slurm and env.get("SLURM_JOB_ID", "").isdigit():
        step = int(env["SLURM_STEP_ID"]) if env.get("SLURM_STEP_ID", "").isdigit() else 0
        out["MASTER_PORT"] = str(SLURM_PORT_BASE + (int(env["SLURM_JOB_ID"]) * 16 + step)
                                 % SLURM_PORT_SPAN)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m bmlmpi.cli.rank_env PROGRAM [ARGS ...]\n"
              "sets torch's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (and MASTER_ADDR, "
              "MASTER_PORT under srun)\nfrom the MPI launcher's variables, then runs PROGRAM",
              file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    os.environ.update(torch_variables(os.environ))
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"bmlmpi rank_env: cannot start {args[0]}: {exc}", file=sys.stderr)
        return 127
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
