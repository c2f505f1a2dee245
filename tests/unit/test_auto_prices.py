"""auto's prices on one rank (bmlmpi.auto_tuning): a calibration that cannot be true is
refused with one warning, a cache entry that cannot be read is not used (one warning), an
empty cache measures nothing in the job, and a measurement asked for stops at its deadline,
on every rank at the same phase."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from mpi4py import MPI

from bmlmpi import calibrate
from bmlmpi.auto_tuning import AutoTuning, trusted
from bmlmpi.model.estimate import Calibration

SOUND = Calibration(alpha=7.4e-6, beta=2e-10, gamma=1e-10,
                    native=((8, 4.9e-6), (65536, 3.9e-5), (1 << 20, 4e-4)))
# README command 1's calibration under load ~19: alpha 4681 us, beta 0, native 8 B = 26 ms
IMPOSSIBLE = Calibration(alpha=4681.03e-6, beta=0.0, native=((8, 26e-3), (65536, 2e-3)),
                         meta={"loadavg": 19.0, "cores": 2})


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bmlmpi" and r.levelno == logging.WARNING]


def test_an_impossible_calibration_is_refused_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger="bmlmpi")
    assert trusted(IMPOSSIBLE, 9, 0) is None
    (said,) = warnings_of(caplog)
    assert "an infinite bandwidth" in said and "is refused" in said
    assert "load 19.0, above the 2 cores" in said and "BMLMPI_RECALIBRATE=1" in said
    caplog.clear()
    assert trusted(IMPOSSIBLE, 9, 3) is None   # every rank refuses it; rank 0 says so
    assert warnings_of(caplog) == []


def test_a_sound_calibration_is_kept_and_one_taken_under_load_says_so(caplog):
    caplog.set_level(logging.WARNING, logger="bmlmpi")
    assert trusted(SOUND, 2, 0) is SOUND
    assert warnings_of(caplog) == []
    busy = Calibration(alpha=SOUND.alpha, beta=SOUND.beta, native=SOUND.native,
                       meta={"loadavg": 5.5, "cores": 2, "source": "cache"})
    assert trusted(busy, 2, 0) is busy
    (said,) = warnings_of(caplog)
    assert "the cache calibration of 2 ranks was measured at load 5.5, above the 2 cores" in said


def _one_rank(timeout: float = 10.0):
    return SimpleNamespace(comm=MPI.COMM_SELF, rank=0, size=1, timeout=timeout,
                           plans=SimpleNamespace(choices={}))


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The calibration cache in a folder of its own; measurements counted (SOUND)."""
    monkeypatch.setenv("BMLMPI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BMLMPI_RECALIBRATE", raising=False)
    calls = []

    def measure(comm, timeout=None, nodes=None, budget=None):
        calls.append(budget)
        return SOUND
    monkeypatch.setattr(calibrate, "measure", measure)
    return calls


def _cache_file() -> tuple:
    host = MPI.Get_processor_name()[:64]
    path = calibrate.cache_path(host, calibrate.mpi_library())
    return path, calibrate._entry_key(1, 1)


def test_an_impossible_cached_entry_is_refused_and_not_measured_again(measured, caplog):
    caplog.set_level(logging.WARNING, logger="bmlmpi")
    path, key = _cache_file()
    path.write_text(json.dumps({"format": calibrate.FORMAT, "entries":
                                {key: IMPOSSIBLE.to_dict()}}))
    tuning = AutoTuning(_one_rank())
    assert tuning.take() is None
    assert measured == []                      # read, refused, not measured in this job
    (said,) = warnings_of(caplog)
    assert "the cache calibration of 1 rank" in said and str(path) in said
    assert "the native allreduce of 8 B took 26000.0 us, more than 4x its 65536 B" in said


def test_a_corrupt_cache_entry_is_not_used_with_one_warning(measured, caplog):
    caplog.set_level(logging.WARNING, logger="bmlmpi")
    path, key = _cache_file()
    path.write_text(json.dumps({"format": calibrate.FORMAT, "entries": {key: {"alpha": "x"}}}))
    tuning = AutoTuning(_one_rank(timeout=7.0))
    assert tuning.take() is None
    assert measured == []                      # not measured inside the job
    (said,) = warnings_of(caplog)
    assert "cannot be read, so it is not used" in said and key in said


def test_an_empty_cache_measures_nothing_unless_asked(measured, monkeypatch):
    """The first auto call's prices: with nothing cached, no measurement at all in the job
    (the user's calls then time every applicable record); BMLMPI_RECALIBRATE=1 asks for
    one, given the communicator's deadline as its budget."""
    tuning = AutoTuning(_one_rank(timeout=7.0))
    assert tuning.take() is None and measured == []
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "1")
    assert tuning.take() == SOUND and measured == [7.0]
    monkeypatch.delenv("BMLMPI_RECALIBRATE")
    assert tuning.take() == SOUND and measured == [7.0]   # now cached: read, not measured


def test_a_measurement_stops_at_its_deadline(monkeypatch, caplog, tmp_path):
    """Each phase is preceded by the ranks' agreement on the time spent: past the budget every
    rank stops there (here after the first phase, which overran it), nothing is kept."""
    caplog.set_level(logging.WARNING, logger="bmlmpi")
    phases = []

    def slow_exchange(comm, nbytes, reps, timeout):
        phases.append(nbytes)
        import time
        time.sleep(0.3)
        return 1e-6
    monkeypatch.setattr(calibrate, "_exchange_time", slow_exchange)
    with pytest.raises(calibrate.MeasurementOverrun, match="past its budget of 0.2 s"):
        calibrate.measure(MPI.COMM_SELF, timeout=10, budget=0.2)
    assert phases == [calibrate.SMALL_BYTES]   # the second phase never started
    monkeypatch.setenv("BMLMPI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "1")
    phases.clear()
    tuning = AutoTuning(_one_rank(timeout=0.2))
    assert tuning.take() is None and phases == [calibrate.SMALL_BYTES]
    (said,) = warnings_of(caplog)
    assert "auto uses the fixed rule on this communicator" in said


def test_the_load_travels_with_a_cached_entry():
    vec = calibrate._pack(IMPOSSIBLE)
    back = calibrate._unpack(vec, {"source": "cache"})
    assert back.meta["loadavg"] == 19.0 and back.meta["cores"] == 2
    assert calibrate._unpack(calibrate._pack(SOUND), {}).meta == {}
