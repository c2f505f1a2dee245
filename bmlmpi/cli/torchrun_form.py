"""``bmlmpi-run`` in torchrun's form: ``bmlmpi-run --nproc_per_node 4 train.py ARGS``.

A script written for ``torchrun`` moves to bmlmpi by its launcher's name alone: its flags are
read here and turned into mpiexec's (``-n``, placement), and the script runs under the
interpreter ``bmlmpi-run`` runs under (as torchrun runs it, ``python -u``). torchrun's flags
come first, right after ``bmlmpi-run``'s own (``--ft``, ``--tolerate-lost``, ``--dry-run``):

* ``--nproc_per_node``/``--nproc-per-node`` N, ``cpu`` (the cores), ``gpu`` (the CUDA
  devices torch sees) or ``auto`` (the CUDA devices, else the cores);
* ``--nnodes`` K or ``K:K``: K nodes of N ranks each, N×K ranks placed N a node (Open MPI's
  ``--map-by ppr:N:node``, MPICH's ``-ppn N``); the nodes are the allocation's (Slurm) or
  those of ``--hostfile``/``--host``, since one ``bmlmpi-run`` starts every node;
* ``--standalone`` (one node), ``--node_rank``/``--node-rank`` 0 (the one command is node 0),
  ``--master_addr``/``--master-addr``, ``--master_port``/``--master-port`` (the job's
  ``MASTER_ADDR`` and ``MASTER_PORT``), ``-m``/``--module`` (the script is a module);
* and, passed to mpiexec: ``--hostfile F``, ``--host H``, ``-H H``, ``-x VAR``,
  ``--mca NAME VALUE``.

Anything else before the script is refused with a message naming it: an elastic range of
nodes, restarts and torchrun's rendezvous options have no meaning for one MPI launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: torchrun's flags read here (the underscore and the hyphen spellings), and whether each
#: takes a value
FLAGS = {"--nproc_per_node": True, "--nproc-per-node": True, "--nnodes": True,
         "--standalone": False, "--node_rank": True, "--node-rank": True,
         "--master_addr": True, "--master-addr": True, "--master_port": True,
         "--master-port": True, "-m": False, "--module": False}
#: mpiexec's options taken in torchrun's form, and how many values each takes
PASSED = {"--hostfile": 1, "--host": 1, "-H": 1, "-x": 1, "--mca": 2}


class FormError(SystemExit):
    """A torchrun-form command bmlmpi-run cannot run (the message says why)."""

    def __init__(self, message: str):
        super().__init__(f"bmlmpi-run: {message}")


@dataclass
class TorchrunForm:
    """What a torchrun-form command asks for."""

    nproc: int = 1
    nnodes: int = 1
    master_addr: str | None = None
    master_port: str | None = None
    module: bool = False
    program: list[str] = field(default_factory=list)   # the script (or module) and its args
    passed: list[str] = field(default_factory=list)    # mpiexec's options, in order


def applies(args: list[str]) -> bool:
    """Whether ``args`` (bmlmpi-run's own flags removed) start with one of torchrun's flags."""
    return bool(args) and args[0].split("=", 1)[0] in FLAGS


def _processes(value: str) -> int:
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus:
            return gpus
        if value == "gpu":
            raise FormError("--nproc_per_node gpu: torch sees no CUDA device here")
        return os.cpu_count() or 1
    raise FormError(f"--nproc_per_node takes a positive number, cpu, gpu or auto, not "
                    f"{value!r}")


def _nodes(value: str) -> int:
    low, _, high = value.partition(":")
    if low.isdigit() and int(low) > 0 and (not high or high == low):
        return int(low)
    raise FormError(f"--nnodes {value}: bmlmpi-run starts a fixed number of nodes in one MPI "
                    f"launch (K or K:K), not an elastic range")


def parse(args: list[str]) -> TorchrunForm:
    """Read a torchrun-form command (bmlmpi-run's own flags removed)."""
    form = TorchrunForm()
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            form.program = args[i:]
            break
        name, eq, inline = token.partition("=")
        if name in FLAGS:
            value = None
            if FLAGS[name]:
                if eq:
                    value = inline
                elif i + 1 < len(args):
                    i += 1
                    value = args[i]
                else:
                    raise FormError(f"{name} needs a value")
            elif eq:
                raise FormError(f"{name} takes no value")
            if name in ("--nproc_per_node", "--nproc-per-node"):
                form.nproc = _processes(value)
            elif name == "--nnodes":
                form.nnodes = _nodes(value)
            elif name in ("--node_rank", "--node-rank") and value != "0":
                raise FormError(f"{name} {value}: one bmlmpi-run starts every node (it is node "
                                f"0); run it once, with --nnodes and the nodes' hosts")
            elif name in ("--master_addr", "--master-addr"):
                form.master_addr = value
            elif name in ("--master_port", "--master-port"):
                form.master_port = value
            elif name in ("-m", "--module"):
                form.module = True
        elif token in PASSED and i + PASSED[token] < len(args):
            form.passed += args[i:i + PASSED[token] + 1]
            i += PASSED[token]
        else:
            raise FormError(
                f"{token} is not taken in torchrun's form (bmlmpi-run --nproc_per_node N "
                f"SCRIPT ...): it reads {', '.join(sorted(FLAGS))}, and passes "
                f"{', '.join(sorted(PASSED))} to mpiexec; give any other mpiexec option as "
                f"bmlmpi-run [OPTIONS] -n N python SCRIPT ...")
        i += 1
    if not form.program:
        raise FormError("torchrun's form needs the script to run after its flags")
    return form


def mpiexec_args(form: TorchrunForm, python: str, kind: str) -> list[str]:
    """mpiexec's arguments for ``form``: the ranks, their placement, the options passed on,
    then ``python -u [-m] SCRIPT ARGS``."""
    out = ["-n", str(form.nproc * form.nnodes)]
    if form.nnodes > 1:
        out += ["-ppn", str(form.nproc)] if kind == "mpich" else \
            ["--map-by", f"ppr:{form.nproc}:node"]
    return [*out, *form.passed, python, "-u", *(["-m"] if form.module else []), *form.program]


__all__ = ["FLAGS", "FormError", "PASSED", "TorchrunForm", "applies", "mpiexec_args", "parse"]
