"""Every ``BMLMPI_*`` environment variable the library reads, declared once.

Each :class:`Variable` gives the name, the type, the value when unset, what it means and the
parser that turns its text into that value; :func:`get` is the only place the library reads
them (``mpi4py.rc`` plays this part for mpi4py). A variable is read when it is needed, not at
import, so a value set in ``os.environ`` before the call counts.

Rules shared by all variables: surrounding whitespace is ignored, and an empty value is the
same as an unset one (the default). Booleans take ``1/0``, ``true/false``, ``yes/no`` and
``on/off`` in any case. Text the parser refuses raises :class:`ConfigError` (a ``ValueError``)
naming the variable and the value, never a silent fallback to the default.

The environment table in docs/environment.md is :func:`markdown_table` (a test holds them
equal). The scripts in ``jobs/`` and the test suite have variables of their own
(``BMLMPI_RANKS``, ``BMLMPI_SLURM_TESTS``, ...), documented where they are used; they are not
library settings, but they are known here (:data:`OTHER_NAMES`): the first time the library
reads its environment, any other ``BMLMPI_*`` name (a typo such as ``BMLMPI_ALGORTHM``) gets a
warning on the ``bmlmpi`` logger naming the nearest known one, on rank 0 only.

This module imports nothing from bmlmpi, so any module (``bmlmpi.kernels`` included) may
import it without an import cycle.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

#: The CPU kernel back ends ``BMLMPI_KERNEL`` may name (``kernels.dispatch`` uses this list).
KERNEL_MODES = ("auto", "numpy", "numba")


class ConfigError(ValueError):
    """A ``BMLMPI_*`` variable holds text its parser does not accept."""


# -- parsers: text (stripped, non-empty) -> value; ValueError says what was expected --------

def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _number(text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise ValueError("not an integer" if kind is int else "not a number") from None
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("not a number (NaN)")
    return value


def _positive_seconds(text: str) -> float:
    value = _number(text, float)
    # No infinity: every wait keeps a deadline.
    if value <= 0 or math.isinf(value):
        raise ValueError("expected a finite number of seconds > 0")
    return value


def _seconds_or_zero(text: str) -> float:
    value = _number(text, float)
    if value < 0 or math.isinf(value):
        raise ValueError("expected a finite number of seconds >= 0")
    return value


def _penalty(text: str) -> float:
    value = _number(text, float)
    if not 0 < value <= 1:
        raise ValueError("expected a number in (0, 1]")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _number(text, int)
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return value
    return parse


def _word(text: str) -> str:
    return text.strip().lower()


def _one_of(modes: tuple[str, ...], text: str) -> str:
    mode = text.strip().lower()
    if mode not in modes:
        raise ValueError(f"expected one of {', '.join(modes)}")
    return mode


def _kernel_mode(text: str) -> str:
    return _one_of(KERNEL_MODES, text)


#: How a blocking native allreduce waits (``BMLMPI_BLOCKING``, see :mod:`bmlmpi.watchdog`).
BLOCKING_MODES = ("watchdog", "polled")


def _blocking_mode(text: str) -> str:
    return _one_of(BLOCKING_MODES, text)


#: How often ranks agree on a call's signature (``BMLMPI_CHECK``, see :mod:`bmlmpi.agreement`).
CHECK_MODES = ("first-call", "every-call")


def _check_mode(text: str) -> str:
    return _one_of(CHECK_MODES, text)


def _text(text: str) -> str:
    return text.strip()


def _path(text: str) -> Path:
    return Path(text.strip()).expanduser()


@dataclass(frozen=True)
class Variable:
    """One environment variable: ``parse`` turns its non-empty text into a value of ``kind``;
    unset or empty it is ``default`` (None: derived where it is used, as ``default_text``
    says)."""

    name: str
    kind: str
    default: Any
    default_text: str
    meaning: str
    parse: Callable[[str], Any]


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("BMLMPI_ALGORITHM", "algorithm", None, "the `auto` rule",
             "algorithm used where `auto` was asked for: a name `bmlmpi.algorithms()` lists "
             "(per collective `bmlmpi.algorithms(\"reduce_scatter\")`; a collective without "
             "it is left to `auto`)", _word),
    Variable("BMLMPI_BCUBE", "shape", None, "prime factors of N, ascending",
             "BCube shape, level 0 first: `3x3` = BCube(3,2), `2x2x3` for 12 ranks", _text),
    Variable("BMLMPI_TIMEOUT", "seconds", 120.0, "120",
             "seconds a wait may go without progress", _positive_seconds),
    Variable("BMLMPI_BLOCKING", "mode", "watchdog", "watchdog",
             "blocking native allreduce after a signature's first call: `watchdog` calls "
             "MPI_Allreduce itself, a thread aborts the job past BMLMPI_TIMEOUT; `polled`: "
             "MPI_Iallreduce polled with a deadline (DeadlineExceeded)", _blocking_mode),
    Variable("BMLMPI_CHECK", "mode", "first-call", "first-call",
             "`first-call`: ranks agree on each signature's first call; `every-call`: on every "
             "call, before any data moves (docs/contracts.md)", _check_mode),
    Variable("BMLMPI_VALIDATE", "boolean", True, "on",
             "off: skip the first-call agreement check", parse_bool),
    Variable("BMLMPI_REPRODUCIBLE", "boolean", False, "off",
             "on: a communicator's float SUM/AVG allreduce, reduce-scatter and reduce return "
             "the same bits for any algorithm, rank order or count (docs/reproducible.md)",
             parse_bool),
    Variable("BMLMPI_LINKS", "preset or file", None, "from MPI placement",
             "link-weight matrix for the trees: a preset (`p3.16xlarge`/`dgx1`), or a file "
             "(JSON, whitespace matrix, `nvidia-smi topo -m` text)", _text),
    Variable("BMLMPI_TREE_LINK_PENALTY", "number", 0.7, "0.7",
             "factor in (0, 1] on a link's weight each time a multi-tree uses it", _penalty),
    Variable("BMLMPI_TREE_ARRAY_BOUND", "elements", None, "unset: the model decides",
             "elements: `auto` considers the single tree at or below it, the multi-tree above",
             _count(0)),
    Variable("BMLMPI_CALIBRATE", "boolean", True, "on",
             "off: `auto` uses the fixed rule below instead of the calibrated model, and "
             "compression's sparse/dense choice keeps shared-memory link defaults instead of "
             "measuring the links",
             parse_bool),
    Variable("BMLMPI_RECALIBRATE", "boolean", False, "off",
             "on: measure the calibration afresh instead of reading the cache (in a job: "
             "after its first `auto` call, within the communicator's timeout; off, a job only "
             "reads what `bmlmpi-calibrate` cached)", parse_bool),
    Variable("BMLMPI_CACHE_DIR", "directory", None, "`~/.cache/bmlmpi`",
             "where calibrations (per host, MPI library, rank count) and compiled kernels "
             "(`numba/`, one folder per version of the kernel sources, shared by every "
             "install of that version) are cached", _path),
    Variable("BMLMPI_TUNING", "file", None, "`tuning-<host>-<mpi>-n<ranks>-<layout>.jsonl` "
             "in the cache folder",
             "the tuning table file `bmlmpi.tuning_table.table_path` names (docs/tuning.md)",
             _path),
    Variable("BMLMPI_TUNING_BLOCK", "calls", 16, "16",
             "consecutive calls `auto` times as one block of a candidate while it explores a "
             "small signature (fewer from 256 KiB, one from 4 MiB, each after one call not "
             "counted from 1 MiB; docs/tuning.md); 1 times single calls", _count(1)),
    Variable("BMLMPI_TUNING_RUNOFF", "rounds", 4, "4",
             "counted rounds of a runoff between `auto`'s prior and a candidate whose median "
             "beat it by more than the margin but not by more than the blocks' spread "
             "(docs/tuning.md); 0: no runoff, the prior is kept", _count(0)),
    Variable("BMLMPI_AUTO_BML_BYTES", "bytes", 64 * 1024, "65536",
             "fixed rule without calibration: native below this many bytes, bml from it",
             _count(0)),
    Variable("BMLMPI_SPIN", "seconds", 0.05, "0.05",
             "seconds a wait polls continuously (yielding the core) before it sleeps between "
             "polls", _seconds_or_zero),
    Variable("BMLMPI_SHM_CHUNK", "bytes", 256 * 1024, "262144",
             "bytes of one rank's slice of a chunk in the shared-memory allreduce (`shm`, "
             "the node tier of `hierarchical`)", _count(1)),
    Variable("BMLMPI_KERNEL", "back end", "auto", "auto",
             "CPU reduction back end: `auto`, `numpy` or `numba`", _kernel_mode),
    Variable("BMLMPI_KERNEL_THREADS", "count", None, "CPUs / ranks on the node",
             "threads per numba kernel call", _count(1)),
    Variable("BMLMPI_CUDA_AWARE", "boolean", None, "detected",
             "whether MPI takes device pointers (overrides the detection)", parse_bool),
    Variable("BMLMPI_HANG_TIMEOUT", "seconds", 30.0, "30",
             "fault-tolerant communicator: heartbeat age at which a peer is fenced",
             _positive_seconds),
    Variable("BMLMPI_HEARTBEAT", "seconds", None, "min(0.25, hang timeout / 8)",
             "fault-tolerant communicator: heartbeat period", _positive_seconds),
    Variable("BMLMPI_ULFM", "boolean", False, "off",
             "on: assume the MPI library has ULFM instead of checking", parse_bool),
    Variable("BMLMPI_RANKS_PER_NODE", "ranks", None, "MPI placement",
             "pretend nodes of this many consecutive ranks (hierarchical, and `auto`'s view of "
             "nodes), read when a Communicator is built", _count(1)),
    Variable("BMLMPI_FUSION_BYTES", "bytes", 25 * 1024 * 1024, "26214400 (25 MiB)",
             "the `threshold` plan's bucket cap of `GradientBuckets`, bytes", _count(1)),
    Variable("BMLMPI_MPIEXEC", "program", None, "beside Python, else on PATH",
             "the `mpiexec` that `bmlmpi-run` starts", _text),
    Variable("BMLMPI_TOLERATE_LOST", "boolean", False, "off",
             "on: under `bmlmpi-run --ft`, ranks lost (killed, never ended) do not fail the "
             "job when the others finished (the flag `--tolerate-lost`)", parse_bool),
    Variable("BMLMPI_STATUS_DIR", "directory", None, "a temporary folder",
             "where `bmlmpi-run --ft` and its ranks note how each rank ended; set by "
             "`bmlmpi-run`, or to a folder every node shares", _path),
    Variable("BMLMPI_EXPECT_SIZE", "ranks", None, "no check",
             "`bmlmpi-bench` fails unless the MPI world has this many ranks", _count(1)),
    Variable("BMLMPI_COMPRESSION", "compressor", None, "none",
             "torch backend `bmlmpi`: compressor spec for every SUM/AVG all_reduce of float "
             "tensors (`fp16`, `bf16`, `tdf:PHI:D:P`, `topk:RATIO`, ...)", _text),
    Variable("BMLMPI_FAULT_TOLERANT", "boolean", False, "off",
             "torch backend `bmlmpi`: on: run on the fault-tolerant communicator "
             "(`bmlmpi-run --ft`)", parse_bool),
    Variable("BMLMPI_TRACE_CALLS", "calls", 256, "256",
             "calls each communicator's flight recorder keeps (the last ones); 0 turns it off",
             _count(0)),
    Variable("BMLMPI_TRACE_DIR", "directory", None, "`bmlmpi-trace-<job>` in the temp dir",
             "where each rank writes its flight recorder (JSON) when a call hangs or fails "
             "between ranks, at a clean end, on SIGUSR1 and on `dump_trace()`; read them with "
             "`bmlmpi-trace DIR`", _path),
    Variable("BMLMPI_TRACE_FILES", "files", 16, "16",
             "the most flight-recorder files one process writes on its own (failed calls, "
             "clean ends); rewriting a communicator's file, SIGUSR1 and `dump_trace()` are "
             "not counted; 0: none", _count(0)),
    Variable("BMLMPI_TRACE_TORCH", "prefix", None, "off",
             "a file-name prefix: every flight-recorder dump also writes the process's "
             "recorders to `<prefix><world rank>` in PyTorch's Flight Recorder format, for "
             "`python -m torch.distributed.flight_recorder.fr_trace` (as torch's "
             "`TORCH_FR_DUMP_TEMP_FILE`)", _text),
    Variable("BMLMPI_TIMELINE", "directory", None, "off",
             "write a Chrome-trace timeline (Perfetto) of every call and step of each rank into "
             "this folder; `bmlmpi-trace --timeline DIR` merges the ranks", _path),
)}


#: ``BMLMPI_*`` names that are not library settings: the job scripts' (jobs/common.sh,
#: jobs/README.md), the test suite's and perf/'s. They get no unknown-variable warning.
OTHER_NAMES = frozenset((
    "BMLMPI_RANKS", "BMLMPI_OUT", "BMLMPI_PYTHON", "BMLMPI_LAUNCHER", "BMLMPI_SRUN_MPI",
    "BMLMPI_MPIRUN", "BMLMPI_ALGORITHMS", "BMLMPI_SIZES", "BMLMPI_ITERS", "BMLMPI_WARMUP",
    "BMLMPI_BENCH_ARGS", "BMLMPI_TRAIN_ARGS", "BMLMPI_TRAIN_EPOCHS", "BMLMPI_TRAIN_STEPS",
    "BMLMPI_TRAIN_BATCH", "BMLMPI_TRAIN_OUT", "BMLMPI_PLAN", "BMLMPI_JOBS_DIR",
    "BMLMPI_SLURM_TESTS", "BMLMPI_SLURM_INSTALL", "BMLMPI_LOCAL_SLURM_DIR",
    "BMLMPI_FT_LAUNCH_TIMEOUT", "BMLMPI_TEST_RANKS", "BMLMPI_TEST_LAUNCH_TIMEOUT",
    "BMLMPI_PLOT_PYTHON", "BMLMPI_TORCH_VENV", "BMLMPI_TORCH_LAUNCH_TIMEOUT",
    "BMLMPI_TORCH_PYTHON", "BMLMPI_PEER_CACHE", "BMLMPI_PEER_RANKS",
    "BMLMPI_DIST_SUITE_TRACEBACKS",
))

#: Environment variables that hold this process's rank under the launchers bmlmpi meets
#: (Open MPI, PMIx, MPICH's hydra, Slurm): read without initialising MPI.
RANK_NAMES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


#: Where the unknown-variable warning goes (Python's last-resort handler prints it on stderr
#: when the program configured no logging).
log = logging.getLogger("bmlmpi")


def unknown_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Each ``BMLMPI_*`` name in ``env`` that is neither a library variable nor one of
    :data:`OTHER_NAMES`, with the nearest known name (None when nothing is close)."""
    env = os.environ if env is None else env
    known = [*VARIABLES, *sorted(OTHER_NAMES)]
    found = []
    for name in sorted(env):
        if name.startswith("BMLMPI_") and name not in VARIABLES and name not in OTHER_NAMES:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            found.append((name, near[0] if near else None))
    return found


def _is_rank_zero(env: Mapping[str, str]) -> bool:
    return all(env.get(name, "0").strip() in ("", "0") for name in RANK_NAMES)


_environment_checked = False


def warn_unknown(env: Mapping[str, str] | None = None) -> None:
    """Log a warning (rank 0 only) for each unknown ``BMLMPI_*`` name in ``env`` (default
    ``os.environ``)."""
    env = os.environ if env is None else env
    if not _is_rank_zero(env):
        return
    for name, near in unknown_variables(env):
        hint = f"; did you mean {near}?" if near else ""
        log.warning("bmlmpi: %s is not a bmlmpi variable and is ignored%s "
                    "(python -m bmlmpi.config lists them)", name, hint)


def _check_environment_once() -> None:
    global _environment_checked
    if not _environment_checked:
        _environment_checked = True
        warn_unknown()


def variable(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared bmlmpi variable") from None


def text(name: str, env: Mapping[str, str] | None = None) -> str:
    """The variable's text, stripped ("" when unset). The first read of the process
    environment also checks it for unknown ``BMLMPI_*`` names (:func:`warn_unknown`)."""
    variable(name)
    if env is None:
        _check_environment_once()
    return (os.environ if env is None else env).get(name, "").strip()


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The value of ``name`` in ``env`` (default ``os.environ``): parsed, or the default when
    unset or empty; :class:`ConfigError` when the text does not parse."""
    var = variable(name)
    raw = text(name, env)
    if not raw:
        return var.default
    try:
        return var.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The base of bmlmpi's disk caches (calibrations, compiled kernels)."""
    return get("BMLMPI_CACHE_DIR", env) or Path.home() / ".cache" / "bmlmpi"


def markdown_table() -> str:
    """The environment table of docs/environment.md."""
    rows = ["| variable | meaning | default |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.meaning} | {v.default_text} |" for v in VARIABLES.values()]
    return "\n".join(rows) + "\n"


def describe(env: Mapping[str, str] | None = None) -> str:
    """Each variable's current value and where it comes from (``python -m bmlmpi.config``)."""
    lines = []
    for v in VARIABLES.values():
        raw = text(v.name, env)
        if not raw:
            lines.append(f"{v.name} = {v.default_text.replace('`', '')} (default)")
            continue
        try:
            value: Any = get(v.name, env)
        except ConfigError as exc:
            value = f"ERROR: {exc}"
        lines.append(f"{v.name} = {value} (set: {raw!r})")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
