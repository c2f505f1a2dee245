"""The tuning table: ``auto``'s committed choices on disk, so that the next job starts tuned.

One file per (host, MPI library, rank count, node layout), beside the calibration cache:
``$BMLMPI_CACHE_DIR/tuning-<host>-<mpi>-n<ranks>-<layout>.jsonl`` (:func:`table_path`), or
the file ``BMLMPI_TUNING`` names. The format is JSON lines, one object a line, so that a user
can read, diff and hand-edit it:

* line 1, the header: ``{"format": "bmlmpi-tuning", "version": 1, "host": ..., "mpi": ...,
  "ranks": N, "layout": "1x4"}`` (``layout``: :func:`layout_name`);
* every other line, one signature's choice: ``collective``, ``bytes`` (the size class: 0 or a
  power of two, :func:`bmlmpi.tuner.size_class`), ``dtype``, ``op`` (``""`` where the
  collective reduces nothing), ``root`` (null for a collective without one), ``algorithm``,
  and optionally ``wire`` (the call format a signature's values are carried in,
  ``"reproducible"``; absent: none), ``why`` (how it was chosen), ``candidates`` and their
  agreed ``medians`` in seconds (null: not measured), which let a later job's calls
  contradict the entry.

:func:`load` keeps every sound entry and refuses the others — a line that is not JSON, a
field missing or of the wrong type, an unknown collective or algorithm, an algorithm that
does not run the collective, a size that is no size class, a root outside the ranks, medians
that are negative or do not match the candidates, a second line for the same signature — with
one warning for the file naming each refused line and its cause. A header of another version,
rank count or layout refuses the whole file (one warning).

:func:`save` writes under an exclusive ``fcntl`` lock on ``<file>.lock`` (polled, with a
deadline: a writer that cannot get the lock in time warns and skips, never hangs), re-reads
the file inside the lock and merges: the entries this job decided replace those of the same
signature, every other entry another job wrote meanwhile stays, and a refused line stays as
the user wrote it. The merged table goes to a temporary file in the same folder, then
``os.replace``: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import config
from .schedules import algorithms as records
from .tuner import WHYS, Tuner, TuningKey

__all__ = ["FORMAT", "VERSION", "TableEntry", "entries_from", "layout_name", "load", "save",
           "seed", "table_path"]

FORMAT = "bmlmpi-tuning"
VERSION = 1
#: seconds a writer waits for another job's lock before it skips its save
LOCK_SECONDS = 10.0


@dataclass(frozen=True)
class TableEntry:
    """One signature's committed choice (see the module's docstring for the fields)."""

    key: TuningKey
    algorithm: str
    why: str = "measured"
    candidates: tuple[str, ...] = ()
    medians: tuple[float, ...] | None = None

    def to_line(self) -> str:
        row = {"collective": self.key.collective, "bytes": self.key.size,
               "dtype": self.key.dtype, "op": self.key.op, "root": self.key.root,
               "algorithm": self.algorithm, "why": self.why}
        if self.key.wire:
            row["wire"] = self.key.wire
        if self.candidates:
            row["candidates"] = list(self.candidates)
        if self.medians is not None:
            row["medians"] = [m if math.isfinite(m) else None for m in self.medians]
        return json.dumps(row, sort_keys=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:48] or "unknown"


def layout_name(node_sizes: Sequence[int]) -> str:
    """Which ranks share a node, in a file name: ``"2x4"`` for 2 nodes of 4 ranks,
    ``"4+3"`` for nodes of different sizes (largest first)."""
    sizes = sorted((int(n) for n in node_sizes), reverse=True)
    if not sizes or sizes[-1] < 1:
        raise ValueError(f"a layout is one or more nodes of at least one rank: {node_sizes}")
    if len(set(sizes)) == 1:
        return f"{len(sizes)}x{sizes[0]}"
    return "+".join(map(str, sizes))


def table_path(host: str, mpi: str, ranks: int, layout: str) -> Path:
    """The table of this host, MPI library, rank count and layout: ``BMLMPI_TUNING`` where
    set, else beside the calibration cache."""
    named = config.get("BMLMPI_TUNING")
    if named is not None:
        return Path(named)
    return config.cache_dir() / (f"tuning-{_slug(host)}-{_slug(mpi)}-n{int(ranks)}-"
                                 f"{_slug(layout)}.jsonl")


def _header(host: str, mpi: str, ranks: int, layout: str) -> dict:
    return {"format": FORMAT, "version": VERSION, "host": host, "mpi": mpi,
            "ranks": int(ranks), "layout": layout}


def _entry(row: object, ranks: int, layout: str) -> TableEntry:
    """One line's entry; ValueError saying why it is refused."""
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    missing = [f for f in ("collective", "bytes", "dtype", "op", "algorithm") if f not in row]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    size, root = row["bytes"], row.get("root")
    if not isinstance(size, int) or isinstance(size, bool):
        raise ValueError(f"bytes {size!r} is not an integer")
    if root is not None and (not isinstance(root, int) or isinstance(root, bool)):
        raise ValueError(f"root {root!r} is not an integer or null")
    for name in ("collective", "dtype", "op", "algorithm"):
        if not isinstance(row[name], str):
            raise ValueError(f"{name} {row[name]!r} is not a string")
    wire = row.get("wire", "")
    if not isinstance(wire, str):
        raise ValueError(f"wire {wire!r} is not a string")
    key = TuningKey(row["collective"], size, row["dtype"], row["op"], ranks, layout, root,
                    wire)
    rec = records.get(row["algorithm"])
    if not (rec.offered and rec.serves(key.collective)):
        raise ValueError(f"{rec.name} does not run {key.collective}")
    why = row.get("why", "measured")
    if why not in WHYS:
        raise ValueError(f"why {why!r} is not one of {', '.join(WHYS)}")
    cands = row.get("candidates", [])
    if not isinstance(cands, list) or not all(isinstance(c, str) for c in cands):
        raise ValueError("candidates is not a list of algorithm names")
    for c in cands:
        if not records.get(c).serves(key.collective):
            raise ValueError(f"candidate {c} does not run {key.collective}")
    if cands and rec.name not in cands:
        raise ValueError(f"{rec.name} is not among its candidates {cands}")
    medians = row.get("medians")
    if medians is not None:
        if not isinstance(medians, list) or len(medians) != len(cands):
            raise ValueError(f"medians do not match the {len(cands)} candidates")
        for m in medians:
            if m is not None and (isinstance(m, bool) or not isinstance(m, int | float)
                                  or not math.isfinite(m) or m <= 0):
                raise ValueError(f"median {m!r} is not a time > 0 seconds (nor null)")
        medians = tuple(math.inf if m is None else float(m) for m in medians)
    return TableEntry(key, rec.name, why, tuple(cands), medians)


def _read(path: Path, ranks: int, layout: str
          ) -> tuple[dict[TuningKey, TableEntry], list[str], list[str]]:
    """(sound entries, refused lines as written, causes) of the table at ``path``; a file
    that does not exist is empty. A header that does not fit refuses the whole file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, [], []
    lines = text.splitlines()
    if not lines:
        return {}, [], []
    try:
        head = json.loads(lines[0])
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} header")
        if head.get("version") != VERSION:
            raise ValueError(f"version {head.get('version')!r}, this bmlmpi reads {VERSION}")
        if head.get("ranks") != ranks or head.get("layout") != layout:
            raise ValueError(f"a table for {head.get('ranks')} ranks in layout "
                             f"{head.get('layout')!r}, not {ranks} in {layout!r}")
    except ValueError as exc:
        raise _WholeFileRefused(f"{path}:1: {exc}") from None
    found: dict[TuningKey, TableEntry] = {}
    where: dict[TuningKey, int] = {}
    refused, causes = [], []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = _entry(json.loads(line), ranks, layout)
            if entry.key in found:
                raise ValueError(f"a second entry for the signature of line {where[entry.key]}")
        except ValueError as exc:
            refused.append(line)
            causes.append(f"line {number}: {exc}")
            continue
        found[entry.key], where[entry.key] = entry, number
    return found, refused, causes


class _WholeFileRefused(ValueError):
    pass


def load(path: Path, ranks: int, layout: str) -> dict[TuningKey, TableEntry]:
    """The sound entries of the table at ``path`` (for ``ranks`` in ``layout``); refused
    lines, or a whole file that does not fit, get one warning naming the file, the lines and
    their causes."""
    path = Path(path)
    try:
        found, _, causes = _read(path, ranks, layout)
    except _WholeFileRefused as exc:
        warnings.warn(f"bmlmpi: tuning table refused: {exc}", RuntimeWarning, stacklevel=2)
        return {}
    except OSError as exc:
        warnings.warn(f"bmlmpi: cannot read the tuning table {path}: {exc}", RuntimeWarning,
                      stacklevel=2)
        return {}
    if causes:
        warnings.warn(f"bmlmpi: tuning table {path}: refused {len(causes)} entr"
                      f"{'y' if len(causes) == 1 else 'ies'} (the rest kept): "
                      + "; ".join(causes), RuntimeWarning, stacklevel=2)
    return found


def save(path: Path, entries: Mapping[TuningKey, TableEntry], *, host: str, mpi: str,
         ranks: int, layout: str, lock_seconds: float = LOCK_SECONDS) -> bool:
    """Merge ``entries`` into the table at ``path`` (module docstring): atomically, under
    the lock, keeping what another job wrote. False, with a warning, where it cannot (the
    lock not got in ``lock_seconds``, a file for another version or shape, a folder that
    cannot be written): a table is an aid, never a reason for a call to fail."""
    path = Path(path)
    if any(k.ranks != ranks or k.layout != layout for k in entries):
        raise ValueError(f"entries for another rank count or layout than {ranks} in {layout}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            deadline = time.monotonic() + lock_seconds
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        warnings.warn(f"bmlmpi: tuning table {path} stayed locked for "
                                      f"{lock_seconds:g} s; this job's choices are not saved",
                                      RuntimeWarning, stacklevel=2)
                        return False
                    time.sleep(0.01)
            try:
                found, refused, _ = _read(path, ranks, layout)
            except _WholeFileRefused as exc:
                warnings.warn(f"bmlmpi: tuning table not saved, the file is another "
                              f"table: {exc}", RuntimeWarning, stacklevel=2)
                return False
            merged = {**found, **entries}
            lines = [json.dumps(_header(host, mpi, ranks, layout), sort_keys=True)]
            lines += [merged[k].to_line() for k in sorted(merged)]
            lines += refused
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".",
                                       suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as out:
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
    except OSError as exc:
        warnings.warn(f"bmlmpi: cannot write the tuning table {path}: {exc}", RuntimeWarning,
                      stacklevel=2)
        return False
    return True


def entries_from(tuner: Tuner) -> dict[TuningKey, TableEntry]:
    """The choices ``tuner`` committed in this job, as table entries."""
    return {k: TableEntry(k, algorithm, why, cands, medians)
            for k, (algorithm, cands, medians, why) in tuner.table_entries().items()}


def seed(tuner: Tuner, entries: Mapping[TuningKey, TableEntry]) -> None:
    """Seed ``tuner`` with a loaded table: each entry's key commits at its first call with
    ``why="table"``."""
    for key, e in entries.items():
        tuner.seed(key, e.algorithm, e.candidates, e.medians)
