"""What a checks file of tests/frameworks does when it is run alone under ``bmlmpi-run``: its
``checks(rank, n, gloo, check)`` on the default group against a gloo group of the same ranks,
one ``CHECK <name> PASS|FAIL`` line per check, then one summary line; exit 1 if any failed."""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch.distributed as dist
from mpi4py import MPI

import bmlmpi.torch


def run_alone(label: str, checks: Callable) -> int:
    failed, count = [], [0]

    def check(name: str, ok: bool, detail: str = "") -> None:
        count[0] += 1
        if not ok:
            failed.append(name)
        print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}".rstrip(), flush=True)

    bmlmpi.torch.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    try:
        checks(rank, n, gloo, check)
    except Exception:
        traceback.print_exc()
        check("no_exception", False)
    dist.destroy_process_group()
    print(f"{label} DONE {count[0]} failed {len(failed)} {failed[:5]} "
          f"rank {MPI.COMM_WORLD.rank}", flush=True)
    return 1 if failed else 0
