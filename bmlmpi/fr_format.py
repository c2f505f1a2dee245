"""The flight recorder in PyTorch's Flight Recorder format, for torch's analyzer
``python -m torch.distributed.flight_recorder.fr_trace DIR``.

torch's analyzer reads one file per rank, named ``<prefix><global rank>``: a pickled dict with
``version`` (``"2.10"``, what torch 2.13's own recorder writes), ``entries`` (one dict per
call, oldest first), ``pg_config`` (each process group's name, description and global ranks)
and ``pg_status``. It lines the ranks' entries up by process group and
``collective_seq_id``, and names the ranks missing from a collective, and those whose
collective, sizes, dtypes or state differ. :func:`document` builds that dict from the
snapshots of every :class:`~bmlmpi.recorder.FlightRecorder` of a process (plain dicts: torch
is not needed to write it); :func:`write` pickles it, replacing the rank's file.

What maps to what (docs/tracing.md has the table):

* a communicator is a process group: its name is torch's group name on the torch backend
  (``"0"`` for the default group) and ``c<index>`` on a plain communicator (bmlmpi-trace's
  ``communicator c<index>``); its description is torch's (``default_pg``) or the MPI
  communicator's name (``MPI_COMM_WORLD``; ``undefined`` where MPI gives none); its ranks are
  the members' ranks in ``MPI_COMM_WORLD``;
* a call is an entry: its number on the communicator is ``collective_seq_id`` and ``op_id``;
  the collective is ``profiling_name`` (``gloo:all_reduce``, ...: the analyzer accepts only
  its own list of libraries, and gloo is torch's CPU one); its count is a one-dimensional size
  (the recorder keeps element counts, not tensor shapes); its dtype is torch's name
  (``Float``, ``Double``, ...); ``done`` is ``completed`` (retired), a call in progress or
  given up at its deadline is ``started`` (not retired), as torch leaves a collective that
  timed out;
* bmlmpi records collectives only: every entry has ``is_p2p`` False and ``p2p_seq_id`` 0.
  A call refused before its count was known (every rank refuses it) has no entry: torch
  records a call only once its arguments are accepted.

Core layer: imports only :mod:`bmlmpi` (its version) and, lazily, mpi4py.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the format's version: what torch 2.13's recorder writes and its analyzer reads
VERSION = "2.10"
#: the library part of ``profiling_name`` (``<library>:<collective>``): fr_trace refuses any
#: name outside its list of torch's libraries (nccl, gloo, ...); gloo is torch's CPU library
LIBRARY = "gloo"
#: bmlmpi's collectives by torch's names (the ``profiling_name`` torch's own recorder gives
#: the c10d call the torch backend serves with each)
TORCH_NAMES = {
    "allreduce": "all_reduce",
    "reduce_scatter": "_reduce_scatter_base",    # reduce_scatter_tensor
    "allgather": "_all_gather_base",             # all_gather_into_tensor
    "reduce": "reduce",
    "bcast": "broadcast",
    "alltoall": "all_to_all",                    # all_to_all_single
}
#: a reduce-scatter or allgather whose blocks are not equal (the count does not divide by
#: the ranks): torch's names of its uneven forms
UNEVEN_NAMES = {"reduce_scatter": "reduce_scatter_v", "allgather": "all_gather_v"}
#: numpy's dtype names by torch's (c10's ScalarType names, as torch's recorder writes them)
TORCH_DTYPES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int8": "Char", "uint8": "Byte", "int16": "Short", "uint16": "UInt16", "int32": "Int",
    "uint32": "UInt32", "int64": "Long", "uint64": "UInt64", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}
#: a process group's description where there is none (torch's word for it)
NO_DESCRIPTION = "undefined"


def torch_dtype(name: str) -> str:
    """torch's name of the numpy dtype ``name`` (the name itself where torch has none)."""
    return TORCH_DTYPES.get(name, name)


def shapes(collective: str, count: int, size: int) -> tuple[str, list[list[int]],
                                                                list[list[int]]]:
    """torch's collective name and the input and output sizes of a call of ``count``
    elements on ``size`` ranks (``count``: the recorder's, the whole buffer of a
    reduce-scatter or allgather, the whole exchange of an all-to-all). A collective bmlmpi
    does not map raises ``KeyError``."""
    name = TORCH_NAMES[collective]
    if collective in UNEVEN_NAMES:
        if size > 0 and count % size == 0:
            block = count // size
            if collective == "reduce_scatter":
                return name, [[count]], [[block]]
            return name, [[block]], [[count]]
        # this rank's block is not recorded: the whole buffer on both sides
        return UNEVEN_NAMES[collective], [[count]], [[count]]
    return name, [[count]], [[count]]


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(seconds * 1e9))


def entry(call: dict[str, Any], group: tuple[str, str], pg_id: int, size: int,
          timeout: float, record_id: int) -> dict[str, Any] | None:
    """torch's entry for one recorded call (a dict of :meth:`FlightRecorder.calls`) of the
    communicator ``group`` = (name, description) of ``size`` ranks; None for a call refused
    before its count was known."""
    if call.get("count") is None or call.get("collective") is None:
        return None
    name, inputs, outputs = shapes(call["collective"], int(call["count"]), size)
    dtype = torch_dtype(call["dtype"])
    done = call["state"] == "done"
    start, end = call["start"], call.get("end")
    return {
        "record_id": record_id,
        "pg_id": pg_id,
        "process_group": (group[0], group[1]),
        "collective_seq_id": call["seq"],
        "p2p_seq_id": 0,
        "op_id": call["seq"],
        "profiling_name": f"{LIBRARY}:{name}",
        "time_created_ns": _ns(start),
        "input_sizes": inputs,
        "input_dtypes": [dtype],
        "output_sizes": outputs,
        "output_dtypes": [dtype],
        "state": "completed" if done else "started",
        "time_discovered_started_ns": _ns(start),
        "time_discovered_completed_ns": _ns(end) if done else None,
        "duration_ms": (end - start) * 1e3 if done else None,
        "retired": done,
        "timeout_ms": int(round(timeout * 1e3)),
        "is_p2p": False,
        "frames": [],
    }


def document(snapshots: Iterable[dict[str, Any]], library_version: str = "") -> dict[str, Any]:
    """The dict torch's analyzer reads for one rank, from the snapshots
    (:meth:`FlightRecorder.snapshot`) of every recorder of the process. Entries of all
    communicators, oldest first by start time; ``record_id`` counts the process's calls in
    that order, from the calls the rings no longer hold (so that the ranks' ids line up where
    their rings wrapped alike)."""
    snaps = sorted(snapshots, key=lambda s: s["comm"])
    merged = []
    dropped = 0
    for s in snaps:
        dropped += max(0, s["recorded"] - len(s["calls"]))
        merged += [(c["start"], s["comm"], c["seq"], c, s) for c in s["calls"]]
    merged.sort(key=lambda item: item[:3])
    entries = []
    for i, (_, _, _, call, s) in enumerate(merged):
        e = entry(call, group_of(s), s["comm"], s["size"], s["timeout"], dropped + i)
        if e is not None:
            entries.append(e)
    pg_config, pg_status = {}, {}
    for s in snaps:
        name, desc = group_of(s)
        pg_config[name] = {"name": name, "desc": desc, "ranks": str(list(s["members"]))}
        completed = [c["seq"] for c in s["calls"] if c["state"] == "done"]
        last = s["recorded"] if s["recorded"] else -1
        pg_status[name] = {"last_enqueued_collective": last, "last_started_collective": last,
                           "last_completed_collective": max(completed, default=-1)}
    return {"version": VERSION, "comm_lib_version": library_version, "entries": entries,
            "pg_config": pg_config, "pg_status": pg_status}


def group_of(snapshot: dict[str, Any]) -> tuple[str, str]:
    """A snapshot's process group: (name, description)."""
    name, desc = snapshot["group"]
    return str(name), str(desc) if desc else NO_DESCRIPTION


def library_version() -> str:
    """bmlmpi's version and the MPI library's (the dump's ``comm_lib_version``)."""
    from . import __version__
    text = f"bmlmpi {__version__}"
    try:
        from mpi4py import MPI
        mpi = MPI.Get_library_version().splitlines()[0].strip("\x00 ")
        text += f"; {mpi}"
    except Exception:  # noqa: BLE001 - the version is a courtesy; the dump must be written
        pass
    return text


def path(prefix: str, rank: int) -> Path:
    """The file of global rank ``rank``: ``<prefix><rank>``, as torch names its dumps."""
    return Path(f"{prefix}{rank}")


def write(prefix: str, rank: int, doc: dict[str, Any]) -> Path:
    """Pickle ``doc`` to ``<prefix><rank>`` (replacing it; its folder made where missing)."""
    target = path(prefix, rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    # a name that ends in no digit: fr_trace takes a file ending in digits for a rank's
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(doc, f)
    os.replace(tmp, target)
    return target
