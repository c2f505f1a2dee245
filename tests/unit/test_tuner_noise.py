"""auto's exploration on a loaded machine (bmlmpi.tuner): one call's time can be a scheduler's
time slice, so the Tuner times blocks of consecutive calls, interleaves the candidates'
blocks, compares the median block means and keeps the prior unless a candidate beats it in
every block. Per-call timings are injected as functions of the candidate's own call count, so
each scenario reads the same whatever the block length; several ranks are several Tuners, and
the MAX the pipeline takes across ranks is taken here."""

from __future__ import annotations

from collections.abc import Callable

from bmlmpi import selection
from bmlmpi.tuner import Tuner, TuningKey

RANKS = 2
#: an 8 B allreduce: a block of 16 calls by default
KEY = TuningKey("allreduce", 8, "float32", "sum", RANKS, "1x2")
US = 1e-6
#: the calls of one of its exploration blocks (the last test holds it)
BLOCK = 16


def rule_pick() -> selection.Explanation:
    """auto without a calibration at 8 B on two ranks: the fixed rule picks native, every
    applicable record is a candidate."""
    why = selection.explain(2, 4, RANKS)
    assert (why.rule, why.chosen) == ("fixed rule", "native")
    assert {"tree", "ring", "native"} <= set(why.applicable)
    return why


def explore(tuners: list[Tuner], time_of: Callable[[int, str, int], float]) -> list[str]:
    """KEY's exploration on every rank's Tuner until it commits (a runoff included): call
    ``index`` runs the candidate every rank chooses alike; ``time_of(rank, name, k)`` is that
    rank's seconds for the ``k``-th call of ``name`` (0 first, the warm-up's included). At
    each agreement the MAX over ranks is agreed and committed. Returns each rank's commit."""
    why = rule_pick()
    for t in tuners:
        t.begin(KEY, why)
    count: dict[str, int] = {}
    index = start = 0
    most = tuners[0].most_calls(KEY.size, len(tuners[0].report(KEY).candidates))
    while tuners[0].committed(KEY) is None:
        assert index < most, "no commit within the most calls the Tuner says it takes"
        calls = tuners[0].exploration_calls(KEY)
        names = {t.choose(KEY, index) for t in tuners}
        assert len(names) == 1
        name = names.pop()
        k = count[name] = count.get(name, -1) + 1
        for rank, t in enumerate(tuners):
            t.record(KEY, name, time_of(rank, name, k))
        assert {t.due(KEY, index) for t in tuners} == {index - start == calls - 1}
        if index - start == calls - 1:
            agreed = [max(col) for col in zip(*(t.proposal(KEY) for t in tuners),
                                              strict=True)]
            for t in tuners:
                t.commit(KEY, agreed)
            start = index + 1
        index += 1
    return [t.committed(KEY) for t in tuners]


def steady(name: str) -> float:
    """Candidates no scenario disturbs: native 70 us, the others 100 us (a little jitter)."""
    return 70 * US if name == "native" else 100 * US


def test_a_schedule_whose_calls_lose_the_core_does_not_win_on_its_median_call():
    """At load above the core count tree (a schedule that yields while it polls) runs 50 us,
    but every third call waits out another process's time slice (5 ms): its single calls'
    median is 50 us, a user's loop of it 1.7 ms a call. Native is kept."""
    def time_of(rank, name, k):
        if name == "tree":
            return 5000 * US if k % 3 == 0 else 50 * US
        return steady(name) * (1 + 0.01 * (k % 5))
    tuners = [Tuner() for _ in range(RANKS)]
    assert explore(tuners, time_of) == ["native"] * RANKS
    tree = next(c for c in tuners[0].report(KEY).candidates if c.name == "tree")
    assert tree.measured > 1000 * US and len(tree.blocks) == 3


def test_a_median_gap_within_the_blocks_spread_is_run_off():
    """tree's median block (60 us) beats native's (70 us) by more than the margin, but one of
    its three blocks ran while the machine was busy (3 ms a call): the gap is within tree's
    spread, so the two run off, four more rounds of their blocks in turn. tree's blocks
    beat native's in every round but the busy one: tree (measured), its median over the
    seven blocks. Had tree's runoff blocks run at 75 us (its first ones lucky), native's
    would have beaten them, and native stays (why: the rule's pick kept)."""
    def busy_second_block(after: float):
        def time_of(rank, name, k):
            if name == "tree":
                if BLOCK < k <= 2 * BLOCK:   # the second counted block (k 0: the warm-up)
                    return 3000 * US
                return 60 * US if k <= 3 * BLOCK else after
            return steady(name)
        return time_of
    tuners = [Tuner() for _ in range(RANKS)]
    assert explore(tuners, busy_second_block(60 * US)) == ["tree"] * RANKS
    report = tuners[0].report(KEY)
    assert report.why == "measured"
    tree = next(c for c in report.candidates if c.name == "tree")
    native = next(c for c in report.candidates if c.name == "native")
    assert len(tree.blocks) == len(native.blocks) == 3 + 4
    assert tree.measured == 60 * US and max(tree.blocks) == 3000 * US
    assert all(len(c.blocks) == 3 for c in report.candidates if c.name not in ("tree", "native"))

    tuners = [Tuner() for _ in range(RANKS)]
    assert explore(tuners, busy_second_block(75 * US)) == ["native"] * RANKS
    assert tuners[0].report(KEY).why == "rule"


def test_a_runoff_is_two_candidates_blocks_in_turn_and_every_rank_agrees_to_it():
    """After the exploration's agreement the key explores on (no commit) with the prior
    and the fastest only: each a warm-up call, then four rounds of their blocks in turn,
    then one more agreement of their eight block means. Without runoff rounds the prior is
    kept at once."""
    def time_of(rank, name, k):
        if name == "tree":
            return 3000 * US if BLOCK < k <= 2 * BLOCK else 60 * US
        return steady(name)
    t = Tuner()
    t.begin(KEY, rule_pick())
    first = t.exploration_calls(KEY)
    count: dict[str, int] = {}
    for index in range(first):
        name = t.choose(KEY, index)
        k = count[name] = count.get(name, -1) + 1
        t.record(KEY, name, time_of(0, name, k))
    t.commit(KEY, t.proposal(KEY))
    assert t.committed(KEY) is None and t.exploring(KEY)
    assert t.exploration_calls(KEY) == 2 * (1 + 4 * BLOCK)
    runs = [t.choose(KEY, first + i) for i in range(t.exploration_calls(KEY))]
    pair = [c for c in (c.name for c in t.report(KEY).candidates) if c in ("native", "tree")]
    assert runs == pair + [c for _ in range(4) for c in pair for _ in range(BLOCK)]
    assert not t.due(KEY, first + len(runs) - 2) and t.due(KEY, first + len(runs) - 1)
    assert len(t.proposal(KEY)) == 2 * 4
    assert t.most_calls(KEY.size, 6) == 6 * (1 + 3 * BLOCK) + 2 * (1 + 4 * BLOCK)

    none = Tuner(runoff_rounds=0)
    assert explore([none], time_of) == ["native"]
    assert none.report(KEY).why == "rule"


def test_a_clear_winner_wins_though_its_single_calls_alternate():
    """ring's calls alternate 10 us and 50 us (30 us a call in any block) and every one of
    its blocks beats every one of native's: ring is committed, measured. tree looks faster
    call by call (20 us) but loses every fourth call to another process (5 ms)."""
    def time_of(rank, name, k):
        if name == "ring":
            return (10 if k % 2 == 0 else 50) * US
        if name == "tree":
            return 5000 * US if k % 4 == 0 else 20 * US
        return steady(name)
    tuners = [Tuner() for _ in range(RANKS)]
    assert explore(tuners, time_of) == ["ring"] * RANKS
    report = tuners[0].report(KEY)
    assert report.why == "measured"
    assert next(c for c in report.candidates if c.name == "ring").measured == 30 * US


def by_block(times: dict[str, tuple[float, ...]]) -> Callable[[int, str, int], float]:
    """Per-call times that make each named candidate's counted blocks the given means
    (seconds; its warm-up call runs as its first block, its blocks beyond the last given as
    the last, a runoff's warm-up call as the block after it), the others :func:`steady`."""
    def time_of(rank, name, k):
        if name not in times:
            return steady(name)
        return times[name][min(len(times[name]) - 1, max(0, k - 1) // BLOCK)]
    return time_of


def test_a_decisively_faster_median_wins_though_its_blocks_overlap_the_priors():
    """The 512 KiB allgather at load ~8 (docs/tuning.md), its blocks a hundredth: shm's (here
    tree's) 22, 53 and 191 us, native's 145, 285 and 487 us. tree's slowest block is slower
    than native's fastest, but its median is 5.4 times faster and faster than every block of
    native's: tree wins (measured). The rule without the decisive factor kept native."""
    tuners = [Tuner() for _ in range(RANKS)]
    got = explore(tuners, by_block({"native": (145 * US, 285 * US, 487 * US),
                                    "tree": (22 * US, 53 * US, 191 * US)}))
    assert got == ["tree"] * RANKS
    assert tuners[0].report(KEY).why == "measured"


def test_a_median_a_few_tenths_faster_with_one_slow_block_wins():
    """A quiet machine's 1 MiB allreduce at two ranks: shm's (here tree's) median 1.76 times
    faster than the prior's and faster than every block of the prior's, one of its three
    blocks slower than the prior's fastest (a first touch of its buffers, or one time slice):
    tree wins (measured). A decisive factor of 2 kept the prior, which the committed calls
    then ran 1.8 times slower."""
    tuners = [Tuner() for _ in range(RANKS)]
    got = explore(tuners, by_block({"native": (118 * US, 120 * US, 125 * US),
                                    "tree": (65 * US, 68 * US, 130 * US)}))
    assert got == ["tree"] * RANKS
    assert tuners[0].report(KEY).why == "measured"


def test_a_median_under_the_decisive_factor_within_the_spread_keeps_the_prior():
    """tree's median (40 us) is 1.2 times faster than native's (48 us) and below every block
    of native's, but one of its blocks (500 us) is slower than native's fastest: under the
    decisive factor (1.25) the spread rules, and native stays."""
    tuners = [Tuner() for _ in range(RANKS)]
    got = explore(tuners, by_block({"native": (46 * US, 48 * US, 50 * US),
                                    "tree": (38 * US, 40 * US, 500 * US)}))
    assert got == ["native"] * RANKS
    assert tuners[0].report(KEY).why == "rule"


def test_a_decisive_median_that_a_block_of_the_prior_beats_keeps_the_prior():
    """tree's median (90 us) is 2.2 times faster than native's (200 us), but native ran one
    block at 40 us, faster than tree's median: native's slow blocks may be the load's, so
    the gap is not decisive, and native stays. (The others run 100 us, tree's median is the
    fastest.)"""
    tuners = [Tuner() for _ in range(RANKS)]
    got = explore(tuners, by_block({"native": (40 * US, 200 * US, 300 * US),
                                    "tree": (80 * US, 90 * US, 5000 * US)}))
    assert got == ["native"] * RANKS
    assert tuners[0].report(KEY).why == "rule"


def test_every_rank_commits_alike_when_one_ranks_blocks_alone_would_pick_another():
    """On rank 1 tree runs a steady 40 us and would win alone; on rank 0 every third tree
    call loses the core. A block ends when its slowest rank does: the agreed blocks are
    rank 0's, and both ranks keep native."""
    def time_of(rank, name, k):
        if name == "tree":
            return 5000 * US if rank == 0 and k % 3 == 0 else 40 * US
        return steady(name)
    alone = Tuner()
    assert explore([alone], lambda rank, name, k: time_of(1, name, k)) == ["tree"]
    assert explore([Tuner() for _ in range(RANKS)], time_of) == ["native"] * RANKS


def test_exploration_runs_whole_blocks_interleaved_and_costs_what_the_docs_say():
    """Blocks of 16 calls at 8 B, fewer from 512 KiB, one call from 4 MiB, each after
    settling calls not counted (3 from 512 KiB, 1 from 16 MiB, none from 64 MiB); a warm-up
    call per candidate where a block has none, then three counted rounds of the candidates'
    blocks in turn."""
    t = Tuner()
    why = rule_pick()
    t.begin(KEY, why)
    cands = [c.name for c in t.report(KEY).candidates]
    assert t.block_calls_at(KEY.size) == BLOCK
    assert t.exploration_calls(KEY) == len(cands) * (1 + 3 * BLOCK)
    runs = [t.choose(KEY, i) for i in range(t.exploration_calls(KEY))]
    assert runs == cands + [c for _ in range(3) for c in cands for _ in range(BLOCK)]
    # size: (counted calls of a block, its leading calls, calls per candidate)
    sizes = {1 << 18: (16, 0, 49), 1 << 19: (8, 3, 33), 1 << 20: (4, 3, 21),
             1 << 21: (2, 3, 15),
             4 << 20: (1, 3, 12), 8 << 20: (1, 3, 12), 16 << 20: (1, 1, 6),
             32 << 20: (1, 1, 6), 64 << 20: (1, 0, 4), 1 << 30: (1, 0, 4)}
    for size, (block, lead, calls) in sizes.items():
        assert (t.block_calls_at(size), t.lead_calls_at(size)) == (block, lead)
        assert t.warmup_calls_at(size) == (lead == 0)
        assert t.calls_per_candidate(size) == calls == (lead == 0) + 3 * (lead + block)
