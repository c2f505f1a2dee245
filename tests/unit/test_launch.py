"""bmlmpi-run without MPI: the program substitution, the stderr filter, the exit verdict."""

import io
import json
import os
import sys

import pytest

from bmlmpi.cli import launch


def test_bare_python_becomes_this_interpreter():
    args = ["-n", "2", "python", "train.py", "python", ":", "-n", "1", "python3.11", "x.py"]
    assert launch.own_python(args) == ["-n", "2", sys.executable, "train.py", "python", ":",
                                       "-n", "1", sys.executable, "x.py"]
    assert launch.own_python(["-n", "2", "/usr/bin/python3", "a.py"])[2] == "/usr/bin/python3"
    assert launch.own_python(["-n", "2", "pythonista"])[2] == "pythonista"
    env = launch.rank_environment({"PATH": f"/usr/bin:{os.path.dirname(sys.executable)}"})
    assert env["PATH"] == f"{os.path.dirname(sys.executable)}:/usr/bin"


def test_build_command_replaces_python_and_drops_own_flags():
    cmd = launch.build_command(["--ft", "--tolerate-lost", "-n", "2", "python", "t.py"],
                               mpiexec="/x/mpiexec", kind="openmpi")
    assert cmd[-2:] == [sys.executable, "t.py"] and "--tolerate-lost" not in cmd
    assert cmd[cmd.index("-x") + 1] == "BMLMPI_STATUS_DIR"


def test_osc_ucx_is_left_out_only_without_rdma_and_unless_chosen(tmp_path, monkeypatch):
    monkeypatch.delenv("OMPI_MCA_osc", raising=False)
    none, one = tmp_path / "none", tmp_path / "one"
    none.mkdir()
    (one / "mlx5_0").mkdir(parents=True)
    assert not launch.has_rdma_device(none) and launch.has_rdma_device(one)
    assert not launch.has_rdma_device(tmp_path / "missing")

    def command(args, devices):
        monkeypatch.setattr(launch, "RDMA_DEVICES", devices)
        return " ".join(launch.build_command(args, mpiexec="/x/mpiexec", kind="openmpi"))

    assert "--mca osc ^ucx" in command(["-n", "2", "a.out"], none)
    assert "osc" not in command(["-n", "2", "a.out"], one)
    assert command(["--mca", "osc", "ucx", "-n", "2", "a.out"], none).count("osc") == 1
    monkeypatch.setenv("OMPI_MCA_osc", "sm")
    assert "osc" not in command(["-n", "2", "a.out"], none)
    monkeypatch.delenv("OMPI_MCA_osc")
    assert "osc" not in " ".join(launch.build_command(["-n", "2", "a.out"], mpiexec="/x/m",
                                                      kind="mpich"))


def test_libnbc_lines_are_left_out(tmp_path):
    text = (b"rank output\nNBC_Progress: an error 75 was found during schedule 0x1 at "
            b"row-offset 0 - aborting the schedule\n\nmore\n\nprogress 10%\rprogress 20%")
    source = tmp_path / "err"
    source.write_bytes(text)
    sink = io.BytesIO()
    with open(source, "rb") as f:
        assert launch._copy_stderr(f, sink) == 1
    assert sink.getvalue() == b"rank output\nmore\n\nprogress 10%\rprogress 20%"


def _notes(tmp_path, pid, *events):
    with open(tmp_path / f"host-{pid}.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def test_verdict_from_the_ranks_notes(tmp_path):
    _notes(tmp_path, 1, {"event": "start", "rank": 0}, {"event": "exit", "status": 0})
    _notes(tmp_path, 2, {"event": "start", "rank": 1})                        # lost
    _notes(tmp_path, 3, {"event": "start", "rank": 2}, {"event": "end", "error": None})
    out = launch.read_outcome(tmp_path)
    assert (out.finished, out.lost, out.failed, out.replaced) == ([0, 2], [1], {}, [])
    assert out.status(0, tolerate_lost=False) == 1 and out.status(0, tolerate_lost=True) == 0
    _notes(tmp_path, 4, {"event": "start", "rank": 1, "replacement": True},
           {"event": "exit", "status": 0})                                     # replaced
    out = launch.read_outcome(tmp_path)
    assert out.replaced == [1] and out.status(0, tolerate_lost=False) == 0
    _notes(tmp_path, 5, {"event": "start", "rank": 3}, {"event": "end", "error": None},
           {"event": "exit", "status": 4})
    out = launch.read_outcome(tmp_path)
    assert out.failed == {3: "exit status 4"} and out.status(0, tolerate_lost=True) == 1
    assert "failed: rank 3 (exit status 4)" in out.report(tolerate_lost=True)


def test_a_complete_set_of_notes_decides_over_mpiexec(tmp_path):
    for pid, rank in ((1, 0), (2, 1)):
        _notes(tmp_path, pid, {"event": "start", "rank": rank}, {"event": "exit", "status": 0})
    out = launch.read_outcome(tmp_path)
    assert out.status(183, tolerate_lost=False, ranks=2) == 0   # a failed spawn, handled
    assert out.status(183, tolerate_lost=False, ranks=3) == 183  # rank 2 wrote nothing


def test_the_jobs_heartbeat_folders_are_removed(tmp_path):
    import socket
    beat = tmp_path / "bmlmpi-hb-0123"
    beat.mkdir()
    (beat / "0").write_bytes(b"x")
    other = tmp_path / "bmlmpi-hb-4567"   # another host's (or another job's): kept
    other.mkdir()
    notes = tmp_path / "notes"
    notes.mkdir()
    _notes(notes, 1, {"event": "start", "rank": 0, "heartbeat": str(beat),
                      "host": socket.gethostname()})
    _notes(notes, 2, {"event": "start", "rank": 1, "heartbeat": str(other), "host": "elsewhere"})
    launch.remove_heartbeats(notes)
    assert not beat.exists() and other.exists()


def test_flavour_from_each_launchers_version_line(tmp_path):
    lines = {"mpiexec (Open MPI) 5.0.11": "openmpi", "mpiexec (OpenRTE) 4.1.6": "openmpi",
             "prterun (PRRTE) 3.0.6": "openmpi", "HYDRA build details:": "mpich",
             "something else 1.0": "unknown"}
    for line, expected in lines.items():
        fake = tmp_path / "mpiexec"
        fake.write_text(f"#!/bin/sh\necho '{line}'\n")
        fake.chmod(0o755)
        assert launch.flavour(str(fake)) == expected, line


def test_libnbc_ireduce_is_binomial_unless_chosen(monkeypatch):
    """libnbc's segmented chain Ireduce advances only inside polls (the module docstring):
    the launcher picks binomial for Open MPI, unless the user chose an algorithm."""
    monkeypatch.delenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", raising=False)

    def command(args, kind="openmpi"):
        return " ".join(launch.build_command(args, mpiexec="/x/mpiexec", kind=kind))

    assert "--mca coll_libnbc_ireduce_algorithm binomial" in command(["-n", "2", "a.out"])
    chosen = command(["--mca", "coll_libnbc_ireduce_algorithm", "chain", "-n", "2", "a.out"])
    assert chosen.count("coll_libnbc_ireduce_algorithm") == 1 and "binomial" not in chosen
    assert "ireduce" not in command(["-n", "2", "a.out"], kind="mpich")
    monkeypatch.setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "chain")
    assert "ireduce" not in command(["-n", "2", "a.out"])


def test_help_is_an_option_list(capsys):
    """``bmlmpi-run --help``: a usage line and argparse's option list, bmlmpi-run's own
    options (exactly the ones it takes out before mpiexec) apart from mpiexec's."""
    assert launch.main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("usage: bmlmpi-run ") and "-n N PROGRAM" in lines[0], out
    assert len(lines) <= 40, out
    own = out.split("options of bmlmpi-run (not passed to mpiexec):\n", 1)[1].split("\n\n")[0]
    listed = [line.split()[0] for line in own.splitlines() if line.startswith("  -")]
    assert sorted(listed) == sorted(launch.OWN_FLAGS), own
    assert "mpiexec's options (passed on unchanged)" in out and "  -n N, -np N " in out
    assert launch.main([]) == 0 and capsys.readouterr().out == out


RULE = b"-" * 74 + b"\n"
OSC_BOX = (RULE + b"WARNING: The selected 'osc' module 'sm' is not tested for post-failure\n"
           b"operation, yet you have requested support for fault tolerance.\n"
           b"When using this component, normal failure free operation is expected;\n"
           b"However, failures may cause the application to abort, crash or deadlock.\n\n"
           b"In this framework, the following components are tested to operate under\n"
           b"failure scenarios: {}\n" + RULE)


@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_ft_stderr_leaves_out_the_untested_box_nul_bytes_libnbc_and_event_lines(chunk):
    # what an --ft job's stderr held with no failure (the osc/sm box, then a NUL) and after a
    # kill (libnbc's line behind a NUL, then one behind another rank's partial output)
    other_box = RULE + b"A help message bmlmpi does not know\n" + RULE
    text = (OSC_BOX + b"\0rank 0 ok\n" + b"[vm:77] 3 more processes have sent help message "
            b"help-mpi-ft.txt / module:untested:failundef\n"
            b"\0NBC_Progress: an error 77 was found during schedule 0x55 at row-offset 2 - "
            b"aborting the schedule\n\n" + other_box + b"bmlmpi: rank 1 died; 2 of 3 ranks "
            b"carry on\nNBC_Progress: an error 75 was found during schedule 0x1 at row-offset 0"
            b" - aborting the schedule\n[warn] Epoll MOD(4) on fd 21 failed. Old events were 6;"
            b" read change was 2 (del); write change was 0 (none); close change was 0 (none): "
            b"Bad file descriptor\n[warn] something else\nprogress 10%\rprogress 20%")
    keep = launch.StderrFilter()
    out = b"".join(keep.feed(text[i:i + chunk]) for i in range(0, len(text), chunk))
    out += keep.close()
    assert out == (b"rank 0 ok\n" + other_box + b"bmlmpi: rank 1 died; 2 of 3 ranks carry on\n"
                   b"[warn] something else\nprogress 10%\rprogress 20%")
    assert b"\0" not in out and keep.left_out == 5
