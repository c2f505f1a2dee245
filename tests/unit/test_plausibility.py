"""Impossible calibrations (bmlmpi.model.plausibility) and the load a calibration was
measured at (bmlmpi.calibrate stores it)."""

from __future__ import annotations

import os

from bmlmpi.model.estimate import Calibration
from bmlmpi.model.plausibility import implausible, overloaded

# the development machine's 2-rank calibration, as cached
SOUND = Calibration(alpha=7.4e-6, beta=2e-10, gamma=1e-10,
                    native=((8, 4.9e-6), (65536, 3.9e-5), (1 << 20, 4e-4)),
                    natives=(("reduce", 8, 5e-6), ("reduce", 65536, 4e-5)))


def test_a_sound_calibration_has_no_cause():
    assert implausible(SOUND, 2) == []
    assert overloaded(SOUND) is None


def test_the_calibration_of_the_issue_is_refused():
    # README command 1 under load ~19: alpha 4681 us, beta 0, native 8 B = 26 ms
    busy = Calibration(alpha=4681.03e-6, beta=0.0, native=((8, 26e-3), (65536, 2e-3)))
    causes = implausible(busy, 9)
    assert any("an infinite bandwidth" in c for c in causes)
    assert any("native allreduce of 8 B took 26000.0 us, more than 4x its 65536 B" in c
               for c in causes)


def test_one_rank_has_no_exchange_to_measure():
    alone = Calibration(alpha=0.0, beta=0.0, native=((8, 1.4e-6), (65536, 4.9e-6)))
    assert implausible(alone, 1) == []
    assert [c.split(":")[0] for c in implausible(alone, 2)] == ["latency alpha = 0 s",
                                                                "beta = 0 s/B"]


def test_a_latency_above_the_whole_call_is_refused():
    # cached at 5 ranks on 2 cores: the exchange that measured alpha waited for a core
    waited = Calibration(alpha=9.3128e-3, beta=3e-10, native=((8, 2.1e-4), (65536, 5.5e-3)))
    assert implausible(waited, 5) == [
        "latency alpha = 9312.8 us is above the whole native allreduce of 8 B (210.0 us)"]
    near = Calibration(alpha=1.9 * 2.1e-4, beta=3e-10, native=((8, 2.1e-4),))
    assert implausible(near, 5) == []  # within the noise of two medians


def test_native_times_that_contradict_each_other_are_refused_for_every_collective():
    calib = Calibration(alpha=1e-6, beta=1e-10, native=((8, 1e-5), (65536, 5e-5)),
                        natives=(("bcast", 8, 3e-5), ("bcast", 1 << 20, 5e-6),
                                 ("bcast", 4 << 20, 2e-5), ("reduce", 8, 1e-5),
                                 ("reduce", 65536, 3e-6)))
    assert implausible(calib, 4) == [
        "the native bcast of 8 B took 30.0 us, more than 4x its 1048576 B call's 5.0 us"]


def test_a_calibration_taken_above_the_core_count_says_so():
    busy = Calibration(alpha=1e-6, beta=1e-10, meta={"loadavg": 19.2, "cores": 2})
    assert overloaded(busy) == ("measured at load 19.2, above the 2 cores: its times are "
                                "partly other work's")
    assert overloaded(Calibration(alpha=1e-6, beta=1e-10,
                                  meta={"loadavg": 1.5, "cores": 2})) is None


def test_measure_stores_the_load_and_the_cores():
    from mpi4py import MPI

    from bmlmpi.calibrate import measure

    before = os.getloadavg()[0]
    meta = measure(MPI.COMM_SELF, timeout=60).meta
    after = os.getloadavg()[0]
    assert meta["cores"] == os.cpu_count()
    assert min(before, after) - 1 <= meta["loadavg"] <= max(before, after) + 1
