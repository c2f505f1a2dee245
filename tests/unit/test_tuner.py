"""The measured ``auto``'s core (bmlmpi.tuner): candidates, rotation, the agreed commit, the
prior's margin, reviews that re-explore, table seeds. Timings are injected, never measured;
several ranks are several Tuners, and the MAX the pipeline takes across ranks is taken here."""

from __future__ import annotations

import math

import pytest

from bmlmpi.selection import Candidate, Explanation
from bmlmpi.tuner import MARGIN, Tuner, TuningKey, pick_candidates, size_class

KEY = TuningKey("allreduce", 1 << 20, "float64", "sum", 4, "1x4")


def priced(*pairs: tuple[str, float], chosen: str | None = None,
           rule: str = "cost model") -> Explanation:
    cands = tuple(Candidate(n, t, t, 1.0) for n, t in pairs)
    best = chosen or min(pairs, key=lambda p: p[1])[0]
    return Explanation("allreduce", 1 << 17, 8, 4, best, rule, "test", cands)


MODEL = priced(("bml", 3e-4), ("ring", 4e-4), ("tree", 5e-4), ("multitree", 6e-4),
               ("native", 7e-4))


def explore(tuners: list[Tuner], key: TuningKey, times: list[dict[str, float]],
            start: int = 0) -> int:
    """Run one exploration on every rank's Tuner with each rank's own ``times`` per
    candidate (each candidate's first call 10x slower, so that counting it would change the
    choice); then agree the MAX and commit. Returns the next call index."""
    calls = tuners[0].exploration_calls(key)
    ran: set[str] = set()
    for index in range(start, start + calls):
        names = {t.choose(key, index) for t in tuners}
        assert len(names) == 1  # every rank runs the same candidate at every call
        name = names.pop()
        first = name not in ran
        ran.add(name)
        for rank, t in enumerate(tuners):
            assert t.timed(key, index)
            t.record(key, name, times[rank][name] * (10 if first else 1))
        dues = {t.due(key, index) for t in tuners}
        assert dues == {index == start + calls - 1}
    agreed = [max(col) for col in zip(*(t.proposal(key) for t in tuners), strict=True)]
    for t in tuners:
        t.commit(key, agreed)
    return start + calls


def test_size_class_is_the_next_power_of_two():
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 5, 4096, 4097)] == [0, 1, 2, 4, 4, 8,
                                                                        4096, 8192]
    with pytest.raises(ValueError):
        size_class(-1)


def test_a_key_refuses_what_cannot_be_a_signature():
    with pytest.raises(ValueError, match="power of two"):
        TuningKey("allreduce", 24, "float64", "sum", 4, "1x4")
    with pytest.raises(ValueError, match="needs a root"):
        TuningKey("reduce", 8, "float64", "sum", 4, "1x4")
    with pytest.raises(ValueError, match="has no root"):
        TuningKey("allgather", 8, "float64", "", 4, "1x4", root=0)
    with pytest.raises(ValueError, match="unknown collective"):
        TuningKey("scan", 8, "float64", "sum", 4, "1x4")


def test_candidates_are_the_model_best_three_then_native_in_one_order():
    assert pick_candidates("allreduce", [(c.name, c.predicted) for c in MODEL.candidates],
                           "bml") == ("bml", "ring", "tree", "native")
    # the order does not depend on the order the prices come in
    shuffled = [("native", 7e-4), ("tree", 5e-4), ("bml", 3e-4), ("ring", 4e-4)]
    assert pick_candidates("allreduce", shuffled, "bml") == ("bml", "ring", "tree", "native")
    # native among the best: not twice
    assert pick_candidates("allreduce", [("native", 1e-6), ("bml", 2e-6), ("ring", 3e-6)],
                           "native") == ("native", "bml", "ring")
    # the prior (kept by the model's margin) is always explored
    assert "multitree" in pick_candidates("allreduce", shuffled + [("multitree", 9e-4)],
                                          "multitree")
    # a record that does not serve the collective is left out (ring has no reduce)
    assert pick_candidates("reduce", [("ring", 1e-6), ("bml", 2e-6)], "bml") == ("bml",
                                                                                "native")
    # the fixed rule, nothing priced: its pick and native
    assert pick_candidates("allreduce", [], "bml") == ("bml", "native")


def test_exploration_rotates_blocks_and_drops_each_blocks_settling_calls():
    t = Tuner()
    report = t.begin(KEY, MODEL)
    assert report.state == "exploring" and report.prior == "bml"
    cands = [c.name for c in report.candidates]
    block = t.block_calls_at(KEY.size)
    assert block == 4    # 1 MiB: a quarter of the 4 MiB from which a block is one call
    lead = t.lead_calls_at(KEY.size)
    assert lead == 3     # and each block starts with three more calls (no warm-up call)
    assert t.exploration_calls(KEY) == len(cands) * 3 * (lead + block)
    runs = [t.choose(KEY, i) for i in range(t.exploration_calls(KEY))]
    assert runs == [c for c in cands for _ in range(lead + block)] * 3
    for i, name in enumerate(runs):
        t.choose(KEY, i)
        leading = i % (lead + block) < lead
        t.record(KEY, name, 1.0 if leading
                 else 1e-3 * (cands.index(name) + 1) * (1 + i % 2))
    # each block's leading calls (1 s) are not counted: three blocks each, each block's
    # mean proposed
    assert [c.samples for c in t.report(KEY).candidates] == [3 * block] * len(cands)
    assert t.proposal(KEY) == tuple(1.5e-3 * (i + 1) for i in range(len(cands))
                                    for _ in range(3))


def test_every_rank_commits_alike_though_one_rank_alone_would_pick_another():
    ranks = [Tuner() for _ in range(3)]
    for t in ranks:
        t.begin(KEY, MODEL)
    # rank 0 alone sees ring fastest; rank 2 is slow at ring: the slowest rank counts
    times = [{"bml": 5e-4, "ring": 2e-4, "tree": 6e-4, "native": 7e-4},
             {"bml": 3e-4, "ring": 2.5e-4, "tree": 6e-4, "native": 7e-4},
             {"bml": 3e-4, "ring": 9e-4, "tree": 4e-4, "native": 6e-4}]
    alone = Tuner()
    alone.begin(KEY, MODEL)
    explore([alone], KEY, times[:1])
    assert alone.committed(KEY) == "ring"
    explore(ranks, KEY, times)
    chosen = {t.committed(KEY) for t in ranks}
    # the MAX over ranks: bml 5e-4, ring 9e-4, tree 6e-4, native 7e-4
    assert chosen == {"bml"}
    assert {t.report(KEY).why for t in ranks} == {"measured"}  # the prior won outright
    measured = [c.measured for c in ranks[1].report(KEY).candidates]
    assert measured == [5e-4, 9e-4, 6e-4, 7e-4]


def test_each_commit_is_logged_once_at_debug(caplog):
    t = Tuner()
    t.begin(KEY, MODEL)
    with caplog.at_level("DEBUG", logger="bmlmpi"):
        explore([t], KEY, [{"bml": 1e-4, "ring": 3e-4, "tree": 6e-4, "native": 7e-4}])
    commits = [r.getMessage() for r in caplog.records if "auto committed" in r.getMessage()]
    assert len(commits) == 1 and "bml (measured)" in commits[0]


def test_the_model_pick_stays_unless_beaten_by_more_than_the_margin():
    near = {"bml": 1e-3, "ring": 1e-3 / MARGIN * 1.001, "tree": 2e-3, "native": 2e-3}
    t = Tuner()
    t.begin(KEY, MODEL)
    explore([t], KEY, [near])
    assert (t.committed(KEY), t.report(KEY).why) == ("bml", "model")
    clear = {**near, "ring": 1e-3 / MARGIN * 0.99}
    t = Tuner()
    t.begin(KEY, MODEL)
    explore([t], KEY, [clear])
    assert (t.committed(KEY), t.report(KEY).why) == ("ring", "measured")


def test_a_candidate_without_a_time_on_one_rank_cannot_win():
    ranks = [Tuner(), Tuner()]
    for t in ranks:
        t.begin(KEY, MODEL)
    calls = ranks[0].exploration_calls(KEY)
    for index in range(calls):
        name = ranks[0].choose(KEY, index)
        ranks[1].choose(KEY, index)
        ranks[0].record(KEY, name, {"ring": 1e-5}.get(name, 1e-3))
        if name != "ring":  # rank 1 never timed ring
            ranks[1].record(KEY, name, 1e-3)
    rounds = ranks[1].rounds   # ring's blocks, the second candidate's
    assert all(map(math.isinf, ranks[1].proposal(KEY)[rounds:2 * rounds]))
    agreed = [max(a, b) for a, b in zip(ranks[0].proposal(KEY), ranks[1].proposal(KEY),
                                        strict=True)]
    for t in ranks:
        t.commit(KEY, agreed)
    assert {t.committed(KEY) for t in ranks} == {"bml"}


def test_past_the_exploration_without_a_commit_every_rank_runs_the_prior():
    t = Tuner()
    t.begin(KEY, MODEL)
    assert t.choose(KEY, t.exploration_calls(KEY) + 3) == "bml"


def test_a_contradicted_choice_is_explored_again_on_every_rank_alike():
    ranks = [Tuner(sample_every=2, review_samples=3) for _ in range(2)]
    for t in ranks:
        t.begin(KEY, MODEL)
    fast_ring = {"bml": 3e-4, "ring": 1e-4, "tree": 6e-4, "native": 7e-4}
    nxt = explore(ranks, KEY, [fast_ring, fast_ring])
    assert {t.committed(KEY) for t in ranks} == {"ring"}
    committed_at = nxt - 1
    # ring slows down 5x on rank 1 only; bml's agreed median stays 3e-4
    reviews = []
    for index in range(nxt, nxt + 2 * 3):
        for rank, t in enumerate(ranks):
            assert t.choose(KEY, index) == "ring"
            if t.timed(KEY, index):
                t.record(KEY, "ring", 5e-4 if rank == 1 else 1e-4)
        if ranks[0].due(KEY, index):
            reviews.append(index)
            agreed = [max(c) for c in zip(*(t.proposal(KEY) for t in ranks), strict=True)]
            assert agreed[1] == 5e-4
            for t in ranks:
                t.commit(KEY, agreed)
    assert reviews == [committed_at + 6]
    assert {t.report(KEY).state for t in ranks} == {"exploring"}
    # the new exploration starts at the next call, candidate 0 first
    start = reviews[0] + 1
    assert {t.choose(KEY, start) for t in ranks} == {"bml"}
    explore(ranks, KEY, [fast_ring, {**fast_ring, "ring": 5e-4}], start=start)
    assert {t.committed(KEY) for t in ranks} == {"bml"}


def test_a_choice_that_holds_stays_committed():
    t = Tuner(sample_every=1, review_samples=2)
    t.begin(KEY, MODEL)
    times = {"bml": 1e-4, "ring": 3e-4, "tree": 6e-4, "native": 7e-4}
    nxt = explore([t], KEY, [times])
    for index in range(nxt, nxt + 10):
        t.choose(KEY, index)
        if t.timed(KEY, index):
            t.record(KEY, "bml", 1.1e-4)
        if t.due(KEY, index):
            t.commit(KEY, t.proposal(KEY))
    assert (t.committed(KEY), t.report(KEY).why) == ("bml", "measured")


def test_a_table_entry_commits_at_once_and_a_named_rule_is_not_explored():
    t = Tuner()
    t.seed(KEY, "ring", ("bml", "ring", "native"), (3e-4, 1e-4, 2e-4))
    report = t.begin(KEY, MODEL)
    assert (report.state, report.chosen, report.why) == ("committed", "ring", "table")
    assert t.choose(KEY, 0) == "ring" and not t.timed(KEY, 0)
    assert t.table_entries() == {}  # a seeded entry is the table's already
    other = TuningKey("allreduce", 8, "float64", "sum", 4, "1x4")
    one = t.begin(other, Explanation("allreduce", 1, 8, 4, "native", "one rank", "x"))
    assert (one.chosen, one.why) == ("native", "rule")
    with pytest.raises(ValueError, match="does not run"):
        t.seed(TuningKey("reduce", 8, "float64", "sum", 4, "1x4", 0), "ring")


def test_bad_times_and_vectors_are_refused():
    t = Tuner()
    t.begin(KEY, MODEL)
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="finite"):
            t.record(KEY, "bml", bad)
    with pytest.raises(ValueError, match="not a candidate"):
        t.record(KEY, "multitree", 1e-3)
    with pytest.raises(ValueError, match="do not fit"):
        t.commit(KEY, [1e-3])
    with pytest.raises(KeyError, match="not begun"):
        t.choose(TuningKey("allgather", 8, "float64", "", 4, "1x4"), 0)


def test_the_report_renders_predicted_measured_and_why():
    t = Tuner()
    t.begin(KEY, MODEL)
    explore([t], KEY, [{"bml": 1e-4, "ring": 3e-4, "tree": 6e-4, "native": 7e-4}])
    text = str(t.report(KEY))
    assert "bml (measured)" in text and "<- chosen" in text
    assert ("predicted     300.0 us  measured     100.0 us (12 samples, blocks 100.0-100.0 us)"
            "  <- chosen") in text



def test_a_preview_opens_nothing_and_tells_what_begin_would():
    """What explain shows of a key no call has opened yet: begin's state, not stored (a rank
    that explains must not open a key the others open from their own call)."""
    t = Tuner()
    shown = t.preview(KEY, MODEL)
    assert KEY not in t.keys()
    assert shown == t.begin(KEY, MODEL) and shown.state == "exploring"
    small = TuningKey("allreduce", 1 << 10, "float64", "sum", 4, "1x4")
    t.seed(small, "ring")
    seeded = t.preview(small, MODEL)
    assert (seeded.state, seeded.chosen, seeded.why) == ("committed", "ring", "table")
    assert small not in t.keys()


def test_without_prices_every_applicable_record_is_a_candidate():
    """No calibration (none cached: a job measures none): nothing ranks the records, so the
    user's calls time every one that opts in to auto and applies, the rule's pick kept as
    the prior within the margin."""
    from bmlmpi import selection

    ranks = 4
    why = selection.explain(1 << 17, 8, ranks)   # 1 MiB, no calibration: the fixed rule
    assert why.rule == "fixed rule" and why.candidates == ()
    applicable = selection.candidates(1 << 17, ranks)
    assert why.applicable == tuple(applicable) and len(applicable) >= 3
    t = Tuner()
    report = t.begin(KEY, why)
    names = [c.name for c in report.candidates]
    assert set(names) == set(applicable) | {"native"} and report.prior == why.chosen
    assert all(c.predicted is None for c in report.candidates)
    family = selection.explain_collective("reduce_scatter", 1 << 17, 8, ranks)
    assert family.rule == "fixed rule" and family.chosen == "native"
    assert family.applicable == tuple(selection.candidates(1 << 17, ranks,
                                                           collective="reduce_scatter"))
    key = TuningKey("reduce_scatter", 1 << 20, "float64", "sum", ranks=ranks, layout="1x4")
    assert len(t.begin(key, family).candidates) == len(set(family.applicable) | {"native"}) > 1
