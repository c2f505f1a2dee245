"""``bmlmpi-calibrate --tune`` under two ranks: it fills the tuning table for the sizes and
collectives asked, in the documented text format, and a later job pointed at the table
(``BMLMPI_TUNING``) commits those signatures from it (``explain`` says ``table``) and runs
the tabled algorithm, exactly."""

import json

from test_mpi_launch import run_ranks

JOB = """
import json
import numpy as np
from mpi4py import MPI
import bmlmpi

world = MPI.COMM_WORLD
c = bmlmpi.Communicator(world, timeout=60)
n = (1 << 20) // 4
x = ((np.arange(n) * 7 + world.rank * 13) % 101).astype(np.float32)
out, ref = np.empty_like(x), np.empty_like(x)
c.Allreduce(x, out)        # the first auto call: the prices and the table are taken after it
c.Allreduce(x, out)
world.Allreduce(x, ref)
why = c.explain(n, np.float32)
family = c.explain(n, np.float32, collective="reduce_scatter")
print("TUNE-JSON", json.dumps({"rank": world.rank, "rule": why.rule, "chosen": why.chosen,
                               "ran": c.recorder.calls()[-1]["chosen"],
                               "family": [family.rule, family.chosen],
                               "exact": bool(np.array_equal(out, ref))}), flush=True)
c.Free()
"""


def test_tune_fills_the_table_and_a_job_reads_it(tmp_path):
    table = tmp_path / "tuning.jsonl"
    # the exploration's default blocks (16 calls at 8 B, 4 at 1 MiB), as a tuning run makes
    env = {"BMLMPI_TUNING": str(table), "BMLMPI_CACHE_DIR": str(tmp_path / "cache"),
           "BMLMPI_TUNING_BLOCK": "16"}
    res = run_ranks(2, ["-m", "bmlmpi.cli.calibrate", "--tune", "--sizes", "8,1M",
                        "--collectives", "allreduce,reduce_scatter"], timeout=120, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert f"# tuning table: {table}" in res.stdout, out[-4000:]
    header, *lines = [json.loads(line) for line in table.read_text().splitlines()]
    assert header["format"] == "bmlmpi-tuning" and header["ranks"] == 2
    rows = {(r["collective"], r["bytes"]): r for r in lines}
    assert set(rows) == {("allreduce", 8), ("allreduce", 1 << 20),
                         ("reduce_scatter", 8), ("reduce_scatter", 1 << 20)}, lines
    assert all(r["why"] in ("measured", "rule") and r["algorithm"] in r["candidates"]
               and len(r["medians"]) == len(r["candidates"]) for r in lines), lines
    res = run_ranks(2, ["-c", JOB], timeout=120, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    seen = [json.loads(line.split("TUNE-JSON", 1)[1]) for line in res.stdout.splitlines()
            if "TUNE-JSON" in line]
    assert len(seen) == 2, out[-4000:]
    tabled = rows[("allreduce", 1 << 20)]["algorithm"]
    for r in seen:
        assert r["rule"] == "table" and r["chosen"] == tabled and r["ran"] == tabled, r
        assert r["family"] == ["table", rows[("reduce_scatter", 1 << 20)]["algorithm"]], r
        assert r["exact"], r
