"""PyTorch's own ``DistributedTest._DistTestBase`` units (torch/testing/_internal/distributed/
distributed_test.py of the installed torch), run unchanged under ``mpiexec`` with rank and size
from MPI, on backend ``bmlmpi`` or, for the control, ``gloo``.

    bmlmpi-run -n 2 python tests/frameworks/torch_dist_suite_ranks.py --backend bmlmpi
    bmlmpi-run -n 2 python tests/frameworks/torch_dist_suite_ranks.py --backend gloo -k barrier

torch runs these units in processes it spawns for each (``TestDistBackend._run``: the group
made, the unit run, the group destroyed). Here the ranks are MPI's, started once: for every
unit, every rank makes the default group (bmlmpi's or gloo's, rank and size from MPI, on the
launch's one store made through MPI under a prefix of the unit's own), runs the unit's method
on an instance of the same test class torch's own spawn suite builds, destroys the group and
reports. torch's ``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR``
variables are set as its harness sets them (``TEMP_DIR``: one folder made by rank 0, removed
at the end). A unit that raises ``unittest.SkipTest`` or exits with one of torch's skip codes
is a skip (the reason printed); any other exception a failure; a unit that has not finished
on every rank within ``--unit-timeout`` seconds aborts the launch (``HANG`` printed first).
torch's CPU all-to-all units, skipped by torch for every backend but ``mpi``, run with that
one skip lifted (:data:`LIFTED_SKIP`: on bmlmpi all of them, on gloo the
``all_to_all_single`` ones), marked ``LIFTED``.
A unit listed in ``REFUSED`` must fail on backend bmlmpi with the error given there (a
refusal docs/torch.md documents): then it is REFUSED, and a FAIL if it passes or fails
otherwise. Rank 0 prints ``DIST-SUITE IMPORTS <seconds> s`` (torch's test modules), then
``UNIT <name> PASS|FAIL|REFUSED|SKIP [<seconds> s] <detail>`` per unit (a FAIL on any rank
makes the unit a FAIL) and ``DIST-SUITE DONE``, the counts, the seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import unittest

from mpi4py import MPI

COMM = MPI.COMM_WORLD


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["bmlmpi", "gloo"], default="bmlmpi")
    p.add_argument("-k", dest="pattern", default="", help="only units whose name holds this")
    p.add_argument("--unit-timeout", type=float, default=120.0)
    return p.parse_args()


#: units that cannot run with the units in one process per rank, or test what the bmlmpi
#: backend does otherwise by design; each skipped with this reason on both backends
EXCLUDED = {
    "test_barrier_timeout_global": "rank 0 stays out of a barrier the others time out of "
                                   "(torch's timeout=): the ranks leave the unit at different "
                                   "points, which needs a process per unit",
    "test_barrier_timeout_group": "as test_barrier_timeout_global",
    "test_barrier_timeout_full_group": "as test_barrier_timeout_global",
}


#: the start of the reason torch gives its CPU all-to-all units' skip where BACKEND is not
#: "mpi" ("Only MPI supports CPU all_to_all_single", "Only MPI supports all_to_all"): a
#: statement about the backends of its day, not a need of the test: bmlmpi serves both
#: forms on CPU, gloo ``all_to_all_single``. So the adapter lifts that one skip (the bodies
#: run unchanged, their other skips apply: the _group units still need 8 ranks), each unit
#: printed with LIFTED in its detail: on bmlmpi for every such unit, on gloo for the
#: ``all_to_all_single`` units only (gloo's list form takes tensors of one size, and these
#: units send each peer its own size: "ProcessGroupGloo::alltoall: invalid tensor size")
LIFTED_SKIP = "Only MPI supports"


def lifted(name: str, method, backend: str) -> bool:
    """Whether torch's :data:`LIFTED_SKIP` of the CPU all-to-all unit ``name`` is lifted on
    ``backend``."""
    why = getattr(method, "__unittest_skip_why__", "")
    if "all_to_all" not in name or "cuda" in name or not why.startswith(LIFTED_SKIP):
        return False
    return backend == "bmlmpi" or "all_to_all_single" in name


#: units the bmlmpi backend fails by design, each with the error it must raise (the type's
#: name and a part of the message, on at least one rank; docs/torch.md lists them): REFUSED
#: when it does, FAIL when the unit passes or fails otherwise
REFUSED = {
    "test_get_backend": ("AssertionError", "'bmlmpi' != 'gloo'",
                         "the backend is named bmlmpi, the units were written for gloo"),
    "test_sparse_all_reduce_sum": ("UnsupportedCall", "reduces dense tensors",
                                   "sparse tensors are refused"),
    "test_monitored_barrier_gloo": ("ValueError", "only implemented for GLOO",
                                    "torch 2.13 serves monitored_barrier for gloo only"),
    "test_monitored_barrier_gloo_subgroup": ("ValueError", "only implemented for GLOO",
                                             "as test_monitored_barrier_gloo"),
    "test_monitored_barrier_gloo_rank_0_timeout": (
        "AssertionError", "No backend type associated with device type cpu",
        "as test_monitored_barrier_gloo (torch's own path for other backends raises this)"),
}


def prepare_environment(backend: str) -> str:
    """torch's harness variables, before its test module is imported (it reads BACKEND
    then); the shared TEMP_DIR with its barrier/, test_dir/ and init_dir/. BACKEND is
    ``gloo`` on both backends: the units choose what to run, and how, by that name, and the
    bmlmpi backend stands in for gloo on CPU (the default group is bmlmpi's)."""
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(COMM.size)
    temp = tempfile.mkdtemp(prefix="bmlmpi-dist-suite-") if COMM.rank == 0 else None
    temp = COMM.bcast(temp)
    if COMM.rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.mkdir(os.path.join(temp, sub))
    COMM.Barrier()
    os.environ["TEMP_DIR"] = temp
    return temp


def unit_outcome(outcomes: list[str]) -> str:
    """One unit's outcome from every rank's: all alike, that; a refusal where the others
    passed (a unit that checks the error on one rank only), REFUSED; otherwise FAIL."""
    kinds = set(outcomes)
    if len(kinds) == 1:
        return outcomes[0]
    return "REFUSED" if kinds == {"REFUSED", "PASS"} else "FAIL"


class Watchdog:
    """Aborts the launch when a unit has not finished within ``limit`` seconds."""

    def __init__(self, limit: float):
        self.limit = limit
        self.unit: str | None = None
        self.since = 0.0
        threading.Thread(target=self._watch, daemon=True).start()

    def start(self, unit: str) -> None:
        self.unit, self.since = unit, time.monotonic()

    def stop(self) -> None:
        self.unit = None

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            unit = self.unit
            if unit is not None and time.monotonic() - self.since > self.limit:
                print(f"UNIT {unit} HANG rank {COMM.rank}: not finished within "
                      f"{self.limit:g} s", flush=True)
                shutil.rmtree(os.environ["TEMP_DIR"], ignore_errors=True)
                COMM.Abort(3)


def main() -> int:
    a = parse_args()
    t_import = time.perf_counter()
    temp = prepare_environment(a.backend)
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.common_utils import set_rng_seed
    from torch.testing._internal.distributed.distributed_test import (
        Barrier,
        DistributedTest,
        TestDistBackend,
    )

    import bmlmpi.torch

    class Units(TestDistBackend, DistributedTest._DistTestBase):
        """The class torch's test_distributed_spawn.py runs, here on MPI's ranks."""

    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    names = sorted(n for n in dir(DistributedTest._DistTestBase)
                   if n.startswith("test_") and a.pattern in n)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "REFUSED": 0}
    if COMM.rank == 0:
        print(f"DIST-SUITE IMPORTS {time.perf_counter() - t_import:.1f} s", flush=True)
    watchdog = Watchdog(a.unit_timeout)
    started = time.perf_counter()
    # torch's harness gives each unit a store of its own (a file); here one TCPStore serves
    # the launch, each unit under a prefix of its own, so no unit reads another's keys: a
    # TCPStore made per unit took 5 s to connect about once in 13 (load 20 on 2 cores), more
    # than the units' own work at N = 2
    store = bmlmpi.torch.store_from_mpi(COMM)
    for index, name in enumerate(names):
        if COMM.rank == 0:
            Barrier.init()
            for f in os.listdir(os.path.join(temp, "test_dir")):
                os.unlink(os.path.join(temp, "test_dir", f))
        COMM.Barrier()
        Barrier.barrier_id = 0
        watchdog.start(name)
        t_unit = time.perf_counter()
        outcome, detail, lift = "PASS", "", False
        set_rng_seed()   # as torch's run_test, before every unit
        try:
            method = getattr(Units, name)
            lift = lifted(name, method, a.backend)
            if getattr(method, "__unittest_skip__", False) and not lift:  # as unittest skips
                raise unittest.SkipTest(getattr(method, "__unittest_skip_why__", ""))
            if name in EXCLUDED:
                raise unittest.SkipTest(f"bmlmpi's adapter: {EXCLUDED[name]}")
            made: Exception | None = None
            try:
                dist.init_process_group(a.backend, rank=COMM.rank, world_size=COMM.size,
                                        store=dist.PrefixStore(f"unit{index}/", store))
            except Exception as exc:  # noqa: BLE001 - raised below, once every rank knows
                made = exc
            # as torch's harness does (TestDistBackend._run's barrier after the group is
            # made): no rank starts the unit before every rank has its group, so a unit that
            # one rank skips at once cannot close the group while another still connects
            # (gloo's connectFullMesh then fails: "Connection closed by peer")
            if not COMM.allreduce(made is None, op=MPI.LAND):
                raise made or RuntimeError("the default group failed on another rank")
            unit = Units(name)
            unit.rank = COMM.rank
            getattr(unit, name)()
        except unittest.SkipTest as exc:
            outcome, detail = "SKIP", str(exc)
        except SystemExit as exc:
            if exc.code in skip_codes:
                outcome, detail = "SKIP", skip_codes[exc.code]
            else:
                outcome, detail = "FAIL", f"exit {exc.code}"
        except Exception as exc:  # noqa: BLE001 - the unit's failure, reported
            outcome = "FAIL"
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            expected = REFUSED.get(name) if a.backend == "bmlmpi" else None
            if expected and type(exc).__name__ == expected[0] and expected[1] in str(exc):
                outcome = "REFUSED"
                detail = f"{expected[2]} ({detail})"
            if os.environ.get("BMLMPI_DIST_SUITE_TRACEBACKS"):
                traceback.print_exc()
        finally:
            # as torch's harness: every rank is out of the unit before any destroys its group
            COMM.Barrier()
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001 - a unit may have destroyed it
                    pass
        watchdog.stop()
        every = COMM.gather((outcome, detail), root=0)
        if COMM.rank == 0:
            final = unit_outcome([o for o, _ in every])
            details = "; ".join(f"rank {r}: {d}" for r, (o, d) in enumerate(every) if d)
            if lift:
                details = f"LIFTED torch's skip {LIFTED_SKIP!r}... {details}".rstrip()
            counts[final] += 1
            print(f"UNIT {name} {final} [{time.perf_counter() - t_unit:.2f} s] "
                  f"{details[:400]}".rstrip(), flush=True)
    COMM.Barrier()
    if COMM.rank == 0:
        shutil.rmtree(temp, ignore_errors=True)
        print(f"DIST-SUITE DONE {counts['PASS']} passed {counts['FAIL']} failed "
              f"{counts['REFUSED']} refused {counts['SKIP']} skipped of {len(names)} in "
              f"{time.perf_counter() - started:.0f} s backend {a.backend} ranks {COMM.size}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
