"""The training job with GradientBuckets: every plan reproduces one process training on the
summed batch (jobs/train_buckets.py --reference), epoch by epoch, to float rounding."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "jobs" / "train_buckets.py"
TIMEOUT = 600
# float64 throughout; the distributed gradient is the average of the ranks' batch means, the
# reference's the mean over the summed batch: they differ by rounding (~1e-16 relative per
# step), which training for two short epochs keeps far below this
RTOL = 1e-9


def run(args: list[str], ranks: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(JOB), *args]
    if ranks is not None:
        cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(ranks), *cmd]
    env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.run(cmd, cwd=ROOT / "jobs", capture_output=True, text=True,
                              timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} did not finish within {TIMEOUT} s: {exc.stdout!r}"[-3000:])


def test_every_plan_matches_one_process_on_the_summed_batch(tmp_path):
    ranks = 3
    common = ["--epochs", "2", "--steps", "6", "--batch", "8"]
    ref_out, out = tmp_path / "ref.json", tmp_path / "dist.json"
    ref = run([*common, "--reference", "--ranks", str(ranks), "--out", str(ref_out)])
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-3000:]
    dist = run([*common, "--plan", "layer,single,threshold,ibatch", "--fusion-bytes", "300000",
                "--out", str(out), "--timeline", str(tmp_path / "tl.json")], ranks)
    assert dist.returncode == 0, (dist.stdout + dist.stderr)[-4000:]
    want = json.loads(ref_out.read_text())
    got = json.loads(out.read_text())
    assert got["ranks"] == ranks and len(got["runs"]) == 4
    assert want["global_batch"] == got["runs"][0]["global_batch"] == ranks * 8
    for run_ in got["runs"]:
        assert len(run_["losses"]) == 3, run_["plan"]
        assert run_["losses"] == pytest.approx(want["losses"], rel=RTOL), run_["plan"]
        assert run_["losses"][-1] < run_["losses"][0]          # it learns
        assert run_["ranks_with_other_parameters"] == []
        layers = [i for first, end in run_["buckets"] for i in range(first, end)]
        assert layers == list(range(22)), run_["plan"]
    by_plan = {r["plan"]: r for r in got["runs"]}
    assert len(by_plan["layer"]["buckets"]) == 22 and len(by_plan["single"]["buckets"]) == 1
    assert 1 < len(by_plan["threshold"]["buckets"]) < 22
    assert "profile" in by_plan["ibatch"]
    tl = json.loads((tmp_path / "tl-ibatch.json").read_text())
    assert len(tl["ranks"]) == ranks
    assert all(r["comm"] and r["compute"] for r in tl["ranks"])


def test_compressed_run_reports_the_measured_links(tmp_path):
    """--compression with a fixed algorithm: the sparse/dense choice priced the links it
    measured (no calibration), and the job reports them."""
    out = tmp_path / "comp.json"
    res = run(["--epochs", "1", "--steps", "4", "--batch", "8", "--plan", "threshold",
               "--algorithm", "bml", "--compression", "tdf:0.1:0.5:0.99:none", "--out",
               str(out)], 2)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    r = json.loads(out.read_text())["runs"][0]
    alpha, beta = r["compression_links_alpha_beta"]
    assert 0 < alpha < 1 and 0 < beta < 1e-6
    assert sum(r["compression_paths"].values()) > 0 and r["dropped_fraction"] > 0.5


def test_sharded_training_gives_the_allreduce_runs_parameters(tmp_path):
    """ZeRO-1 (--shard: reduce-scatter the gradients, update the local shard, allgather the
    parameters) ends with the parameters of the buckets' allreduce run, float64, 1e-9
    relative, and the same losses."""
    import numpy as np

    ranks = 3
    common = ["--epochs", "2", "--steps", "5", "--batch", "8"]
    runs = {}
    for name, extra in (("allreduce", ["--plan", "threshold"]), ("shard", ["--shard"])):
        params, out = tmp_path / f"{name}.npy", tmp_path / f"{name}.json"
        res = run([*common, *extra, "--params-out", str(params), "--out", str(out)], ranks)
        assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
        runs[name] = (np.load(params), json.loads(out.read_text())["runs"][0])
    (want, ar), (got, sh) = runs["allreduce"], runs["shard"]
    assert sh["plan"] == "shard" and sum(sh["shard_counts"]) == want.size
    assert sh["ranks_with_other_parameters"] == []
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
    assert sh["losses"] == pytest.approx(ar["losses"], rel=1e-9)
    assert sh["losses"][-1] < sh["losses"][0]
