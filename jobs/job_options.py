"""Command-line options the training jobs in jobs/ share (no MPI here: importing this module
must not initialise MPI, so that a job's single-process reference mode stays MPI-free)."""

from __future__ import annotations

import argparse
import os


def env_int(name: str, default: int | None, prog: str = "train_example") -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{prog}: {name}={value!r} is not an integer") from None


def add_loop_options(p: argparse.ArgumentParser, prog: str, *, epochs: int,
                     steps_help: str) -> None:
    """--epochs, --steps and --batch, defaulting to BMLMPI_TRAIN_EPOCHS/STEPS/BATCH (the batch
    scripts in jobs/ set those): the loop options every training job shares."""
    p.add_argument("--epochs", type=int, default=env_int("BMLMPI_TRAIN_EPOCHS", epochs, prog))
    p.add_argument("--steps", type=int, default=env_int("BMLMPI_TRAIN_STEPS", None, prog),
                   help=steps_help)
    p.add_argument("--batch", type=int, default=env_int("BMLMPI_TRAIN_BATCH", 32, prog),
                   help="samples per rank per step")
