"""Every form of a call takes its number and its tag slot by one rule (bmlmpi.call_numbers,
docs/architecture.md item 6): one number per call, one tag slot per scheduled launch, none
for a native call — blocking (its checked first call, the checked native blocking call and
the fast path), ``I…`` and persistent alike. A rank that took a slot on one path and none on
another would pick other tags than its peers for every later scheduled call of a signature.
Results are checked exactly with position-, rank- and call-dependent data."""

import numpy as np
import pytest
from conftest import all_ranks_agree

import bmlmpi

N = 7   # elements: odd, so that no block size divides evenly by accident


def data(rank: int, call: int) -> np.ndarray:
    return ((np.arange(N) * 7 + rank * 3 + call * 5) % 11).astype(np.float64)


def bcast_forms(c, algorithm):
    """Each form of a broadcast from the last rank: (form, run(buf) -> None, the call
    numbers it takes: ``_init`` is a call, and so is each start)."""
    root = c.size - 1

    def persistent(buf):
        req = c.Bcast_init(buf, root=root, algorithm=algorithm)
        try:
            req.Start()
            req.Wait()
        finally:
            req.Free()
    def blocking(buf):
        c.Bcast(buf, root=root, algorithm=algorithm)
    return [("blocking, checked", blocking, 1), ("blocking, agreed", blocking, 1),
            ("blocking, fast", blocking, 1), ("blocking, fast again", blocking, 1),
            ("I…", lambda buf: c.Ibcast(buf, root=root, algorithm=algorithm).Wait(), 1),
            ("_init and a start", persistent, 2)]


@pytest.mark.parametrize("algorithm,slots", [("native", 0), ("tree", 1)])
def test_every_form_takes_one_number_and_its_slots(comm, algorithm, slots):
    c = bmlmpi.Communicator(comm, timeout=30)
    failures = []
    try:
        numbers = c._numbers
        for call, (form, run, taken) in enumerate(bcast_forms(c, algorithm)):
            before = (numbers.callno, numbers.launches)
            buf = data(c.rank, call)
            run(buf)
            after = (numbers.callno, numbers.launches)
            if after != (before[0] + taken, before[1] + slots):
                failures.append(f"{algorithm} {form}: (numbers, slots) went from {before} to "
                                f"{after}, not +{taken} number(s) and +{slots} slot(s)")
            if not np.array_equal(buf, data(c.size - 1, call)):
                failures.append(f"{algorithm} {form}: {buf} is not the root's {call}th data")
        # a scheduled allreduce after all of them pairs on every rank (the same tags)
        out = np.empty(N)
        c.Allreduce(data(c.rank, 9), out, algorithm="ring")
        want = sum(data(r, 9) for r in range(c.size))
        if not np.array_equal(out, want):
            failures.append(f"the allreduce after the {algorithm} forms: {out} != {want}")
    finally:
        c.Free()
    all_ranks_agree(comm, failures)
