"""What every rank agrees on about a call (its signature), without MPI.

The fault-tolerant communicator runs an allreduce that was prepared before a failure among the
survivors without preparing it again; a survivor that lagged prepares the same call after the
shrink. Both must hash alike, or the call's agreement raises ArgumentMismatch on every
survivor although every rank passed the same arguments (seen under load in
tests/test_buckets_ft.py's lagging-survivor test). The family's calls are prepared again for
the survivors (their counts are per member), so their size stays in the signature.
"""

import numpy as np
from mpi4py import MPI

from bmlmpi.call_agreement import signature_hash
from bmlmpi.calls import CollectiveCall, prepare_allreduce
from bmlmpi.family import prepare_reduce_scatter


def _allreduce(rank: int, size: int) -> CollectiveCall:
    x = np.arange(300, dtype=np.float64)
    return prepare_allreduce(rank, size, x, np.empty_like(x), MPI.SUM, "bml",
                             lambda count, dtype, op: "bml")


def test_an_allreduce_prepared_before_and_after_a_shrink_agrees():
    before, after = _allreduce(0, 4), _allreduce(0, 3)
    shape = (3,)
    assert signature_hash(before.signature(shape)) == signature_hash(after.signature(shape))


def test_a_family_call_keeps_the_size_it_was_prepared_for():
    def blocks(size):
        x = np.arange(4 * size, dtype=np.float64)
        return prepare_reduce_scatter(0, size, x, np.empty(4), None, MPI.SUM, True, "ring")
    sig4, sig3 = blocks(4).signature((4,)), blocks(3).signature((3,))
    assert signature_hash(sig4) != signature_hash(sig3)
    text = CollectiveCall.describe_signature(sig4)
    assert "of 4 ranks" in text and "bcube=(4,)" in text, text


def test_a_mismatch_names_what_differs():
    shape_a, shape_b = (2, 2), (4,)
    a = CollectiveCall.describe_signature(_allreduce(0, 4).signature(shape_a))
    b = CollectiveCall.describe_signature(_allreduce(0, 4).signature(shape_b))
    assert a != b and "bcube=(2, 2)" in a, (a, b)
