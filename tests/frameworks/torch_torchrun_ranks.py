"""Worker program of the torchrun test: the start forms of the bmlmpi backend under torchrun.

    torchrun --nproc_per_node N tests/frameworks/torch_torchrun_ranks.py FORMS FOLDER

FORMS: a comma list of ``bmlmpi`` (``bmlmpi.torch.init_process_group()``), ``init_method``
(``init_method="bmlmpi://"``) and ``plain`` (``dist.init_process_group("bmlmpi")``, torch's
env://), tried in that order while each is refused. Each worker writes
``FOLDER/refused.<FORM>.<RANK>`` (the error's text) for a start refused, or
``FOLDER/ran.<FORM>.<RANK>`` (the world size the backend saw and the all_reduce's result) for
one that ran, and then stops; refused every time, it raises the last refusal. The workers meet
(through files, bounded) after their imports, so that each reaches the start before torchrun
stops the others for the first one's failure; once refused, a worker ignores torchrun's
SIGTERM and ends through its exit handlers, which remove its MPI singleton's shared-memory
segment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import bmlmpi.torch

DEADLINE = 60.0


def meet(folder: Path, prefix: str, n: int) -> None:
    until = time.monotonic() + DEADLINE
    while len(list(folder.glob(f"{prefix}.*"))) < n and time.monotonic() < until:
        time.sleep(0.02)


def main() -> int:
    forms, folder = sys.argv[1].split(","), Path(sys.argv[2])
    rank, n = os.environ["RANK"], int(os.environ["WORLD_SIZE"])
    (folder / f"ready.{rank}").touch()
    meet(folder, "ready", n)
    refusal = None
    for form in forms:
        try:
            if form == "plain":
                dist.init_process_group("bmlmpi")
            elif form == "init_method":
                dist.init_process_group("bmlmpi", init_method="bmlmpi://")
            else:
                bmlmpi.torch.init_process_group()
        except bmlmpi.torch.SeparateWorlds as exc:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            (folder / f"refused.{form}.{rank}").write_text(str(exc))
            refusal = exc
            continue
        t = torch.ones(1)
        dist.all_reduce(t)
        (folder / f"ran.{form}.{rank}").write_text(f"{dist.get_world_size()} {t.item()}")
        dist.destroy_process_group()
        return 0
    meet(folder, f"refused.{forms[-1]}", n)
    raise refusal


if __name__ == "__main__":
    sys.exit(main())
