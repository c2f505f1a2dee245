"""The torch.distributed backend ``bmlmpi`` under real ranks, in the torch venv
(:mod:`torch_venv`: made once, skipped with the reason where torch cannot be installed).

One launch per N (2, 3, 4) of ``tests/frameworks/torch_ranks.py`` runs every check of the
backend: each collective against backend gloo on the same inputs (exact), async work objects
and their futures, refusals, a sub-group, DDP (against gloo, parameters identical on every
rank), the DDP hooks (fp16 against torch's fp16_compress_hook, bf16, the TDF filters with their
error feedback, the iBatch bucket plan), ZeRO (bit for bit) and FSDP against plain DDP, FSDP2
and DTensor on a 1-D CPU mesh against gloo and the one-process result, and FSDP2 on
reproducible groups of ring and bml at N = 3 (the same parameter bits; differing ones on
plain groups). The job (jobs/train_torch.py) loses a rank at a random step under the
fault-tolerant backend, ends with the same parameters under ring, bml and auto in
reproducible mode (and, in the same launch, differing ones without it), and runs through its
mpirun script. The family calls (broadcast, reduce, reduce-scatter, all-gather) each lose a
rank on the fault-tolerant backend (``tests/frameworks/torch_ft_family_ranks.py``).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_TORCH_LAUNCH_TIMEOUT", "600"))


def launch(py: Path, n: int, args: list[str], *, ft: bool = False, timeout: float,
           env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(py), "-m", "bmlmpi.cli.launch", *(["--ft", "--tolerate-lost"] if ft else []), "-n",
           str(n), str(py), *args]
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0",
            "BMLMPI_TIMEOUT": "120", **(env or {})}
    for name in ("BMLMPI_ALGORITHM", "BMLMPI_BCUBE", "BMLMPI_COMPRESSION",
                 "BMLMPI_FAULT_TOLERANT", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        if name not in (env or {}):
            full.pop(name, None)
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{n} ranks did not finish within {timeout} s (a hang):\n{out[-4000:]}")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_backend_against_gloo(torch_python, n):
    # auto explores in blocks of one call (4 calls per candidate) without a runoff: its check
    # stays short
    res = launch(torch_python, n, ["tests/frameworks/torch_ranks.py"], timeout=LAUNCH_TIMEOUT,
                 env={"BMLMPI_TUNING_BLOCK": "1", "BMLMPI_TUNING_RUNOFF": "0"})
    out = res.stdout + res.stderr
    tail = out[-6000:]
    failed = [line for line in res.stdout.splitlines() if " FAIL" in line]
    assert not failed, "\n".join(failed[:40]) + "\n" + tail
    done = re.findall(r"TORCH-RANKS DONE (\d+) failed 0", res.stdout)
    assert len(done) == n, tail
    assert res.returncode == 0, tail
    checks = {line.split()[1] for line in res.stdout.splitlines() if line.startswith("CHECK ")}
    for name in ("ddp_equals_gloo", "fp16_hook_step1_gradient_matches_torch",
                 "tdf:0.002:0.5:0.5_error_feedback", "topk:0.05_error_feedback",
                 "ibatch_hook_planned", "zero_equals_ddp", "auto_commits_through_the_tuner",
                 "fsdp2_equals_ddp", "fsdp1_equals_ddp", "refused_band", "future_without_wait",
                 "store_on_given_host",
                 "reduce_scatter_list[4099,torch.int64]", "reduce[5,torch.float32,root1]",
                 "batch_isend_irecv", "send_recv_blocking", "recv_by_tag_out_of_order",
                 "recv_from_any_rank", "isend_irecv_ring[1000,torch.bfloat16]",
                 "gather[4099,torch.float64,root1]", "scatter[4099,torch.int32,root1]",
                 "gather_object", "scatter_object_list", "all_gather_coalesced[torch.int64]",
                 "all_reduce_coalesced[torch.float32]", "coalescing_manager[cpu]",
                 "all_to_all_single_equal[5,torch.int64]",
                 "all_to_all_single_uneven[torch.float32]", "all_to_all_single_uneven[bcube]",
                 "all_to_all_single_future[torch.int32]", "all_to_all_list_uneven[torch.int64]",
                 "all_to_all_list[torch.float32]", "all_to_all_single_bad_split_sizes",
                 "all_to_all_single_bad_split_sizes_elsewhere",
                 "all_to_all_single_pairs_disagree", "all_to_all_single_after_refusals",
                 "recv_deadline",
                 "recv_of_a_shorter_message", "monitored_barrier_is_torchs_gloo_only",
                 "fsdp2_equals_gloo", "dtensor_distribute[shard0]", "dtensor_distribute[shard1]",
                 "dtensor_distribute[replicate]", "dtensor_full_tensor[shard1]",
                 "dtensor_redistribute[shard0->replicate]",
                 "dtensor_redistribute[replicate->shard1]",
                 "dtensor_redistribute[shard0->shard1]",
                 "dtensor_redistribute[partial->replicate]",
                 "dtensor_redistribute[partial->shard0]", "dtensor_matmul[colwise]",
                 "dtensor_matmul[rowwise]"):
        assert name in checks, f"check {name} did not run\n{tail}"
    if n > 2:
        assert "subgroup_all_reduce" in checks
    if n == 3:
        assert {"fsdp2_reproducible_same_bits_ring_bml",
                "fsdp2_plain_ring_bml_differ_from_3_ranks"} <= checks, tail


def run_job(py: Path, n: int, tmp_path: Path, name: str, args: list[str], *, ft: bool = False):
    out = tmp_path / f"{name}.json"
    res = launch(py, n, ["jobs/train_torch.py", "--out", str(out), *args], ft=ft,
                 timeout=LAUNCH_TIMEOUT)
    tail = (res.stdout + res.stderr)[-5000:]
    assert out.exists(), f"{name}: no report\n{tail}"
    return json.loads(out.read_text()), res, tail


def test_train_torch_survives_a_rank_killed_at_a_random_step(torch_python, tmp_path):
    """Under the fault-tolerant backend, original rank 1..3 dies (SIGKILL) at a random step
    of jobs/train_torch.py at N = 4: the survivors finish every epoch with identical
    parameters and an accuracy within 1 point of the undisturbed run, nothing hangs."""
    epochs, batch, n = 8, 16, 4
    steps = epochs * (1437 // (batch * n))
    rng = random.Random()
    victim, step = rng.randint(1, n - 1), rng.randint(1, steps - 2)
    common = ["--epochs", str(epochs), "--batch", str(batch), "--lr", "0.1",
              "--fault-tolerant", "--hang-timeout", "20"]
    calm, res, tail = run_job(torch_python, n, tmp_path, "calm", common, ft=True)
    assert res.returncode == 0, tail
    assert calm["params_identical"] and calm["survivors"] == n and not calm["failed"], tail
    hit, res, tail = run_job(torch_python, n, tmp_path, "killed",
                             [*common, "--kill-rank", str(victim), "--kill-step", str(step)],
                             ft=True)
    where = f"rank {victim} killed at step {step} of {steps}\n{tail}"
    assert res.returncode == 0, where   # --tolerate-lost: the survivors finished
    assert hit["failed"] == [victim] and hit["survivors"] == n - 1, where
    assert hit["params_identical"], where
    assert [h["epoch"] for h in hit["history"]] == list(range(1, epochs + 1)), where
    assert hit["history"][-1]["ranks"] == n - 1, where
    assert abs(hit["accuracy"] - calm["accuracy"]) <= 0.01, (
        f"accuracy {hit['accuracy']:.4f} killed vs {calm['accuracy']:.4f} undisturbed; {where}")


def test_train_torch_reproducible_parameters_do_not_depend_on_the_algorithm(torch_python, tmp_path):
    """jobs/train_torch.py at N = 3 (at N = 2 every algorithm adds one pair, a sum whose bits
    do not depend on the order), eight steps, one launch training the same model on a
    reproducible group of each of ``ring``, ``bml`` and ``auto`` and on a plain group of each
    (``--algorithm ring,bml,auto --compare-plain``): the three reproducible runs end with
    bitwise identical parameters, the plain ``ring`` and ``bml`` runs with differing ones
    (the three gradients summed in other orders).

    DDP's gradient all_reduce is non-blocking, and ``auto`` times its candidates on blocking
    calls only, so here ``auto`` runs its priced choice, by the fixed rule (the launch takes
    no calibration, and a tuning table of its own): the one gradient bucket holds 13706
    float32 values, 54 KB, under the rule's 64 KiB, so plain ``auto`` runs ``native``, while
    the reproducible signature is priced on its words, 8 bytes a value, 110 KB, so it runs
    ``bml``: a third algorithm and order beside ``ring`` and ``bml`` in plain mode, the
    reproducible words' own signature and pricing in reproducible mode."""
    args = ["--epochs", "1", "--steps", "8", "--batch", "16", "--reproducible",
            "--compare-plain", "--algorithm", "ring,bml,auto"]
    out = tmp_path / "report.json"
    res = launch(torch_python, 3, ["jobs/train_torch.py", "--out", str(out), *args],
                 timeout=LAUNCH_TIMEOUT, env={"BMLMPI_TUNING": str(tmp_path / "tuning.jsonl")})
    tail = (res.stdout + res.stderr)[-5000:]
    assert res.returncode == 0 and out.exists(), tail
    report = json.loads(out.read_text())
    assert report["params_identical"] and report["reproducible"], tail
    assert report["steps_per_epoch"] == 8, report
    runs = report["by_algorithm"]
    assert list(runs) == ["ring", "bml", "auto"], runs
    ran = {name: (r["ran"], r["plain_ran"]) for name, r in runs.items()}
    assert ran == {"ring": (["ring"], ["ring"]), "bml": (["bml"], ["bml"]),
                   "auto": (["bml"], ["native"])}, ran
    reproducible = {r["params_sha256"] for r in runs.values()}
    assert len(reproducible) == 1, runs
    plain = {name: r["plain_params_sha256"] for name, r in runs.items()}
    assert plain["ring"] != plain["bml"], plain
    assert plain["auto"] not in (plain["ring"], plain["bml"]), plain
    assert reproducible.isdisjoint(plain.values()), runs


def test_train_torch_mpirun_script_with_compression(torch_python, tmp_path):
    """jobs/train-torch-mpirun.sh at N = 2 with the fp16 hook: the report, losses falling."""
    out = tmp_path / "job"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "BMLMPI_", "OMPI_", "PMIX_"))}
    if "OMPI_MCA_btl_sm_backing_directory" in os.environ:  # tests/conftest.py
        env["OMPI_MCA_btl_sm_backing_directory"] = os.environ["OMPI_MCA_btl_sm_backing_directory"]
    env.update(PATH=f"{torch_python.parent}:{env.get('PATH', '')}", BMLMPI_PYTHON=str(torch_python),
               BMLMPI_RANKS="2", BMLMPI_OUT=str(out), BMLMPI_CALIBRATE="0",
               BMLMPI_TRAIN_ARGS="--epochs 3 --compression fp16")
    try:
        res = subprocess.run([str(ROOT / "jobs" / "train-torch-mpirun.sh")], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"train-torch-mpirun.sh did not finish: {exc}")
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, tail
    report = json.loads((out / "train-torch.json").read_text())
    assert report["compression"] == "fp16" and report["params_identical"], tail
    assert report["losses"][-1] < report["losses"][0], tail
    assert "check_world: 2 ranks" in res.stdout + res.stderr, tail


def test_family_calls_under_kills_on_the_fault_tolerant_backend(torch_python):
    """reduce_scatter_tensor, all_gather_into_tensor, broadcast and reduce through torch on
    the fault-tolerant backend, a rank killed in each (before or during the call), at N = 6:
    every survivor sees bmlmpi's family contract (tests/frameworks/torch_ft_family_ranks.py:
    RootFailed for the lost root, the survivors' sums, the own block, ContributionsLost with
    zeros for the lost slot) and the same errors, and the 2 left go on exactly (about 10 s)."""
    res = launch(torch_python, 6, ["tests/frameworks/torch_ft_family_ranks.py"], ft=True,
                 timeout=LAUNCH_TIMEOUT)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, tail
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("TORCH-FT-FAMILY ")]
    assert sorted(r["survivor"] for r in records) == [0, 5], tail
    for r in records:
        bad = [c for c in r["results"] if not c["ok"]]
        assert not bad, f"original rank {r['survivor']}: {bad}\n{tail}"
        # a victim that delivered its part before dying is noticed by the next call
        sizes = [c["size"] for c in r["results"]]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] == 5 and sizes[-1] == 2, r
        assert r["results"][-1]["failed"] == [1, 2, 3, 4], r
    raised = [[c["raised"] for c in r["results"]] for r in records]
    assert raised[0] == raised[1], f"the survivors raised differently: {raised}"
    assert raised[0][:3] == ["RootFailed", None, None], raised
    assert raised[0][3] == "ContributionsLost", raised
