"""The flight recorder's dumps read by PyTorch's own analyzer and by ``bmlmpi-trace``, in the
torch venv (:mod:`torch_venv`; skipped with the reason where torch cannot be installed).

One launch at N = 3 of ``tests/frameworks/torch_fr_skip_ranks.py``: a plain communicator's
allreduce, then ``all_reduce`` on backend ``bmlmpi`` three times, rank 1 skipping the last one
(a deadline of 8 s ends the others' wait). ``BMLMPI_TRACE_TORCH`` asks for PyTorch's format
beside bmlmpi's own. The job must exit non-zero, every rank must leave a file of each format,
and ``python -m torch.distributed.flight_recorder.fr_trace`` and ``bmlmpi-trace`` must both name
rank 1 (and no other) as the rank missing from call 3 of the torch group. A second test checks,
without MPI, the names bmlmpi writes against torch's: its collectives and the dtypes torch's own
recorder writes for a gloo group."""

from __future__ import annotations

import json
import re
import subprocess

from test_torch_backend import LAUNCH_TIMEOUT, ROOT, launch

from bmlmpi import fr_format

#: the deadline of the ranks that wait for the skipped call; rank 1 must have ended (and
#: written its clean end's dump) before it: it has nothing else to do
DEADLINE = "8"
FR_TRACE = "torch.distributed.flight_recorder.fr_trace"


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_both_analyzers_name_the_rank_that_skipped_a_collective(torch_python, tmp_path):
    folder = tmp_path / "dumps"
    torch_dir = folder / "torch"
    res = launch(torch_python, 3, ["tests/frameworks/torch_fr_skip_ranks.py"],
                 timeout=LAUNCH_TIMEOUT,
                 env={"BMLMPI_TIMEOUT": DEADLINE, "BMLMPI_TRACE_DIR": str(folder),
                      "BMLMPI_TRACE_TORCH": str(torch_dir / "rank_")})
    out = (res.stdout + res.stderr)[-6000:]
    assert res.returncode != 0, out                        # a hang's job never exits 0
    assert "FR-SKIP rank 1 calls 2" in res.stdout, out
    for rank in (0, 2):
        assert re.search(rf"FR-SKIP rank {rank} raised (DeadlineExceeded|CommunicatorRevoked)",
                         res.stdout), out
    assert "WRONG" not in res.stdout, out
    assert sorted(p.name for p in torch_dir.iterdir()) == ["rank_0", "rank_1", "rank_2"], out

    # PyTorch's analyzer: its exit status is 0 once it read every rank's file; what it found
    # it logs
    fr = run([str(torch_python), "-m", FR_TRACE, str(torch_dir), "--prefix", "rank_"])
    story = fr.stdout + fr.stderr
    assert fr.returncode == 0, story
    assert "Not all ranks joining collective, sequence number: 3" in story, story
    assert "group info: 0:default_pg" in story, story
    assert "collective: gloo:all_reduce" in story, story
    assert re.findall(r"missing ranks: (.*)", story) == ["{1}"], story
    # the plain communicator's call (group c0) matched on every rank: no other finding
    assert story.count("Not all ranks joining") == 1 and "has errors" not in story, story

    # bmlmpi's own: the torch group's communicator is the second one (c1)
    bt = run([str(torch_python), "-m", "bmlmpi.cli.trace", str(folder)])
    assert bt.returncode == 1, bt.stdout + bt.stderr
    assert ("=> rank 0 waits in call 3 on rank 1: it ended cleanly after call 2 and never "
            "entered call 3") in bt.stdout, bt.stdout
    reports = json.loads(run([str(torch_python), "-m", "bmlmpi.cli.trace", "--json",
                              str(folder)]).stdout)["communicators"]
    by_comm = {r["comm"]: r for r in reports}
    assert by_comm[0]["ok"] and by_comm[1]["culprit"] == 1, reports
    assert by_comm[1]["behind"] == [1], reports


PROBE = """
import os, pickle, socket
os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
import torch, torch.distributed as dist
from torch.distributed.flight_recorder.components.types import COLLECTIVES
from bmlmpi import fr_format
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
written = {}
for name in fr_format.TORCH_DTYPES:
    try:
        dist.broadcast(torch.zeros(2, dtype=getattr(torch, name)), 0)
    except Exception:
        continue   # a dtype gloo refuses: its recorder writes nothing for it
    entry = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"][-1]
    written[name] = entry["input_dtypes"][0]
names = set(fr_format.TORCH_NAMES.values()) | set(fr_format.UNEVEN_NAMES.values())
print(json.dumps({"written": written, "unknown": sorted(names - COLLECTIVES)}))
dist.destroy_process_group()
"""


def test_names_are_torchs_own(torch_python):
    res = run([str(torch_python), "-c", "import json\n" + PROBE])
    assert res.returncode == 0, res.stdout + res.stderr
    found = json.loads(res.stdout.splitlines()[-1])
    assert found["unknown"] == [], found
    written = found["written"]
    assert {"float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool"} \
        <= set(written), written
    # torch hands a complex tensor to its backends as a real view (two floats per element),
    # so its recorder writes Float for it; bmlmpi records numpy's complex dtypes by torch's
    # names of them
    mismatched = {k: v for k, v in written.items()
                  if fr_format.torch_dtype(k) != v and not k.startswith("complex")}
    assert mismatched == {}, (mismatched, written)
