"""The flight recorder in PyTorch's Flight Recorder format (bmlmpi.fr_format), without MPI or
torch: the entries' fields and types, the states, collectives and not point-to-point, the
sizes per collective, the process groups, and the file the recorder writes where
``BMLMPI_TRACE_TORCH`` asks. That torch's own analyzer reads these files and names the rank
that skipped a call: tests/test_fr_trace_launch.py."""

from __future__ import annotations

import pickle

import pytest

from bmlmpi import config, fr_format, recorder
from bmlmpi.recorder import FlightRecorder, Signature
from bmlmpi.schedules.collectives import COLLECTIVES

#: the keys of an entry torch's analyzer reads (components/types.py, builder.py, utils.py)
READ_KEYS = {"record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
             "profiling_name", "time_created_ns", "input_sizes", "input_dtypes",
             "output_sizes", "output_dtypes", "state", "time_discovered_started_ns",
             "time_discovered_completed_ns", "retired", "is_p2p", "frames"}


class StuckRun:
    """A schedule's run at step 2 of 4, waiting to receive from rank 1."""

    class plan:  # noqa: N801 - stands for a Plan
        nsteps = 4

    def waiting(self):
        return 2, [("recv", 1)]


def sig(collective="allreduce", count=12, dtype="float32"):
    return Signature(collective, count, dtype, "sum", None, "auto", "ring")


def entries_of(rec: FlightRecorder) -> list[dict]:
    return fr_format.document([rec.snapshot("test")])["entries"]


def test_a_completed_call_has_every_field_torch_reads_with_its_type():
    rec = FlightRecorder(8, rank=1, size=3, timeout=7.5, members=(0, 1, 2))
    rec.done(rec.begin(sig()))
    (e,) = entries_of(rec)
    assert READ_KEYS <= set(e), READ_KEYS - set(e)
    assert e["record_id"] == 0 and e["pg_id"] == rec.index
    assert e["process_group"] == (f"c{rec.index}", "undefined")
    assert isinstance(e["process_group"], tuple)
    assert e["collective_seq_id"] == e["op_id"] == 1
    assert e["profiling_name"] == "gloo:all_reduce"
    assert e["input_sizes"] == e["output_sizes"] == [[12]]
    assert e["input_dtypes"] == e["output_dtypes"] == ["Float"]
    assert e["state"] == "completed" and e["retired"] is True
    for key in ("time_created_ns", "time_discovered_started_ns",
                "time_discovered_completed_ns"):
        assert isinstance(e[key], int) and e[key] > 1_600_000_000 * 10**9, (key, e[key])
    assert e["time_discovered_completed_ns"] >= e["time_created_ns"]
    assert e["duration_ms"] >= 0
    assert e["timeout_ms"] == 7500
    assert e["frames"] == []


def test_states_completed_started_and_given_up():
    rec = FlightRecorder(8, rank=0, size=2)
    rec.done(rec.begin(sig()))
    rec.begin(sig(count=5), run=StuckRun())                 # in progress
    failed = rec.begin(sig(count=6))
    rec.fail(failed, TimeoutError("deadline"), StuckRun())  # given up at its deadline
    done, running, gave_up = entries_of(rec)
    assert (done["state"], done["retired"]) == ("completed", True)
    # bmlmpi starts a call at once (no queue: never torch's "scheduled"); a call that did not
    # complete is "started" and not retired, as torch leaves a collective that timed out
    for e in (running, gave_up):
        assert (e["state"], e["retired"]) == ("started", False)
        assert e["time_discovered_completed_ns"] is None and e["duration_ms"] is None
        assert isinstance(e["time_discovered_started_ns"], int)
    assert [e["collective_seq_id"] for e in (done, running, gave_up)] == [1, 2, 3]


def test_collectives_not_point_to_point():
    # bmlmpi records collectives only: each entry is numbered by collective_seq_id, none is
    # a send or recv torch would pair by p2p_seq_id
    rec = FlightRecorder(16, rank=0, size=2)
    for name in COLLECTIVES:
        rec.done(rec.begin(sig(name, count=8)))
    entries = entries_of(rec)
    assert len(entries) == len(COLLECTIVES)
    for i, e in enumerate(entries, 1):
        assert e["is_p2p"] is False and e["p2p_seq_id"] == 0
        assert e["collective_seq_id"] == i
        kind = e["profiling_name"].split(":")[1].split(" ")[0]
        assert kind not in ("send", "recv"), e["profiling_name"]


def test_every_collective_has_torchs_name():
    # a collective added to bmlmpi without a name in torch's format fails here, not in the
    # analyzer (which refuses a name it does not know)
    assert set(COLLECTIVES) <= set(fr_format.TORCH_NAMES), set(COLLECTIVES) - set(
        fr_format.TORCH_NAMES)


@pytest.mark.parametrize("collective, count, size, want", [
    ("allreduce", 10, 3, ("all_reduce", [[10]], [[10]])),
    ("reduce", 10, 3, ("reduce", [[10]], [[10]])),
    ("bcast", 10, 3, ("broadcast", [[10]], [[10]])),
    # the recorder's count is the whole buffer: rank blocks of count / size
    ("reduce_scatter", 12, 3, ("_reduce_scatter_base", [[12]], [[4]])),
    ("allgather", 12, 3, ("_all_gather_base", [[4]], [[12]])),
    # uneven blocks: this rank's is not recorded
    ("reduce_scatter", 10, 3, ("reduce_scatter_v", [[10]], [[10]])),
    ("allgather", 10, 3, ("all_gather_v", [[10]], [[10]])),
    ("alltoall", 18, 3, ("all_to_all", [[18]], [[18]])),
    ("allreduce", 0, 2, ("all_reduce", [[0]], [[0]])),
])
def test_sizes_per_collective(collective, count, size, want):
    assert fr_format.shapes(collective, count, size) == want


def test_dtypes_by_torchs_names():
    rec = FlightRecorder(8, rank=0, size=2)
    for dtype in ("float64", "float16", "int64", "int32", "uint8", "bool", "complex128"):
        rec.done(rec.begin(sig(dtype=dtype)))
    assert [e["input_dtypes"][0] for e in entries_of(rec)] == [
        "Double", "Half", "Long", "Int", "Byte", "Bool", "ComplexDouble"]
    assert fr_format.torch_dtype("float128") == "float128"   # none of torch's: kept


def test_a_refused_call_has_no_entry_but_keeps_the_record_ids_in_step():
    rec = FlightRecorder(8, rank=0, size=2)
    rec.done(rec.begin(sig()))
    rec.fail(rec.begin(Signature("allreduce", None, None, "sum", None, "auto", None)),
             ValueError("refused"))
    rec.done(rec.begin(sig()))
    entries = entries_of(rec)
    assert [(e["record_id"], e["collective_seq_id"]) for e in entries] == [(0, 1), (2, 3)]


def test_a_wrapped_ring_counts_the_calls_it_dropped():
    # the ranks' record ids line up where their rings wrapped alike (torch keeps the ids
    # from the largest first one on)
    rec = FlightRecorder(3, rank=0, size=2)
    for _ in range(7):
        rec.done(rec.begin(sig()))
    entries = entries_of(rec)
    assert [e["record_id"] for e in entries] == [4, 5, 6]
    assert [e["collective_seq_id"] for e in entries] == [5, 6, 7]


def test_one_document_for_every_communicator_of_the_process():
    plain = FlightRecorder(8, rank=1, size=2, members=(0, 2), description="MPI_COMM_WORLD")
    torch_group = FlightRecorder(8, rank=2, size=3, members=(0, 1, 2))
    torch_group.name_group("0", "default_pg")
    torch_group.done(torch_group.begin(sig()))
    plain.done(plain.begin(sig("bcast", 4, "int64")))
    running = torch_group.begin(sig(count=3), run=StuckRun())
    assert running.seq == 2
    doc = fr_format.document([torch_group.snapshot("x"), plain.snapshot("x")], "bmlmpi test")
    assert doc["version"] == fr_format.VERSION == "2.10"
    assert doc["comm_lib_version"] == "bmlmpi test"
    # oldest first across the communicators, numbered in that order
    got = [(e["record_id"], e["process_group"], e["collective_seq_id"], e["profiling_name"])
           for e in doc["entries"]]
    assert got == [(0, ("0", "default_pg"), 1, "gloo:all_reduce"),
                   (1, (f"c{plain.index}", "MPI_COMM_WORLD"), 1, "gloo:broadcast"),
                   (2, ("0", "default_pg"), 2, "gloo:all_reduce")]
    # torch reads the ranks with ast.literal_eval: the members' ranks in MPI_COMM_WORLD
    assert doc["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        f"c{plain.index}": {"name": f"c{plain.index}", "desc": "MPI_COMM_WORLD",
                            "ranks": "[0, 2]"}}
    assert doc["pg_status"]["0"] == {"last_enqueued_collective": 2,
                                     "last_started_collective": 2,
                                     "last_completed_collective": 1}
    assert pickle.loads(pickle.dumps(doc)) == doc   # plain values: no torch needed to read


def test_name_group_keeps_what_is_not_given():
    rec = FlightRecorder(2, rank=0, size=1, description="MPI_COMM_SELF")
    rec.name_group("7")
    assert rec.group == ("7", "MPI_COMM_SELF")
    rec.name_group(description="pp_stage")
    assert rec.group == ("7", "pp_stage")
    assert rec.snapshot("x")["group"] == ["7", "pp_stage"]


def test_the_dump_writes_torchs_file_where_asked(tmp_path, monkeypatch):
    rec = FlightRecorder(4, rank=0, size=1)
    rec.done(rec.begin(sig()))
    monkeypatch.delenv("BMLMPI_TRACE_TORCH", raising=False)
    rec.dump("test", tmp_path / "json", announce=False, counted=False)
    assert list(tmp_path.iterdir()) == [tmp_path / "json"]      # not asked: not written
    prefix = tmp_path / "fr" / "rank_"
    monkeypatch.setenv("BMLMPI_TRACE_TORCH", str(prefix))
    assert config.get("BMLMPI_TRACE_TORCH") == str(prefix)
    rec.dump("test", tmp_path / "json", announce=False, counted=False)
    rank = max(recorder.world_rank(), 0)
    files = sorted(p.name for p in (tmp_path / "fr").iterdir())
    assert files == [f"rank_{rank}"], files                     # no temporary file left
    doc = pickle.loads((tmp_path / "fr" / f"rank_{rank}").read_bytes())
    assert {"version", "entries", "pg_config", "pg_status"} <= set(doc)
    assert doc["comm_lib_version"].startswith("bmlmpi ")
    mine = [e for e in doc["entries"] if e["pg_id"] == rec.index]
    assert [e["collective_seq_id"] for e in mine] == [1]
