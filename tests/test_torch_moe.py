"""jobs/train_moe.py, the mixture-of-experts example (tokens dispatched and combined by
``all_to_all_single`` with uneven split sizes), in the torch venv (:mod:`torch_venv`; skipped
with the reason where torch cannot be installed): one launch at N = 2 trains on backend
``bmlmpi``, then from the same start on a gloo group beside it (``--check-gloo``), and the two
end with bitwise identical parameters and losses."""

from __future__ import annotations

import json

from test_torch_backend import LAUNCH_TIMEOUT, launch


def test_moe_job_matches_gloo_bit_for_bit(torch_python, tmp_path):
    out = tmp_path / "moe.json"
    res = launch(torch_python, 2, ["jobs/train_moe.py", "--epochs", "1", "--check-gloo", "--out",
                           str(out)], timeout=LAUNCH_TIMEOUT)
    tail = (res.stdout + res.stderr)[-5000:]
    assert res.returncode == 0, tail
    report = json.loads(out.read_text())
    assert report["backend"] == "bmlmpi" and report["world_size"] == 2, tail
    assert report["replicated_identical"], tail
    assert report["gloo_identical"], (report["params_sha256"], report["gloo"], tail)
    assert report["params_sha256"] == report["gloo"]["params_sha256"]
    assert report["losses"] == report["gloo"]["losses"]
    # the split sizes were uneven: some step sent each rank a different number of tokens, on
    # both ranks, and the rows sent add up to every rank's batch
    for rank, steps in enumerate(report["split_sizes"]):
        assert len(steps) == report["steps"] > 0, rank
        assert all(sum(s) == report["batch_per_rank"] for s in steps), (rank, steps)
        assert any(len(set(s)) > 1 for s in steps), (rank, steps)
    assert report["losses"][-1] < report["losses"][0], report["losses"]
