"""Calibration under real ranks: collective, identical on every rank, cached on disk."""

import pytest
from mpi4py import MPI

from bmlmpi.calibrate import calibrate
from bmlmpi.model import cheapest


@pytest.mark.mpi
def test_calibrate_agrees_on_every_rank_and_caches(tmp_path_factory, monkeypatch):
    comm = MPI.COMM_WORLD
    where = comm.bcast(str(tmp_path_factory.mktemp("calib")) if comm.rank == 0 else None)
    monkeypatch.setenv("BMLMPI_CACHE_DIR", where)
    monkeypatch.delenv("BMLMPI_RECALIBRATE", raising=False)
    first = calibrate(comm, timeout=60)
    assert first.meta["source"] == "measured"
    assert first.meta["ranks"] == comm.size
    # every rank holds the same numbers (meta is not compared), so every rank chooses alike
    assert all(c == first for c in comm.allgather(first))
    again = calibrate(comm, timeout=60)
    assert again.meta["source"] == "cache" and again == first
    # BMLMPI_RECALIBRATE is a boolean like every other: "false"/"off" keep the cache
    for text in ("false", "off", "No", "0"):
        monkeypatch.setenv("BMLMPI_RECALIBRATE", text)
        assert calibrate(comm, timeout=60).meta["source"] == "cache", text
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "maybe")
    with pytest.raises(ValueError, match="BMLMPI_RECALIBRATE='maybe'"):
        calibrate(comm, timeout=60)   # every rank reads it before anything is shared
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "on")
    assert calibrate(comm, timeout=60).meta["source"] == "measured"
    monkeypatch.delenv("BMLMPI_RECALIBRATE")
    names = ["bml", "ring", "ps", "native"]
    for count in (1, 1000, 1 << 20):
        picks = comm.allgather(cheapest(names, count, 4, comm.size, calib=again))
        assert len(set(picks)) == 1
