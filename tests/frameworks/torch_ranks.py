"""Rank program of the torch backend tests: every collective of backend ``bmlmpi`` against
backend ``gloo`` on the same inputs, work objects, DDP and its hooks, ZeRO and FSDP (FSDP2 also
on reproducible groups); point-to-point, gather, scatter and the coalesced calls
(``torch_p2p_ranks.py``); all-to-all (``torch_alltoall_ranks.py``); DTensor and FSDP2 against
gloo (``torch_dtensor_ranks.py``).

Started by ``tests/test_torch_backend.py`` as ``bmlmpi-run -n N python
tests/frameworks/torch_ranks.py`` in the torch venv (never collected by pytest: it needs
ranks). One launch per N runs every check; each prints one line ``CHECK <name> PASS|FAIL
<detail>``, the last line is ``TORCH-RANKS DONE <checks>``. Inputs depend on the rank and the
position (a misplaced range fails); comparisons of integers and small-integer floats are exact.
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch_alltoall_ranks import checks as alltoall_checks
from torch_dtensor_ranks import checks as dtensor_checks
from torch_p2p_ranks import checks as p2p_checks

import bmlmpi.torch
from bmlmpi.torch import Options, UnsupportedCall, hooks

R = dist.ReduceOp
FAILED = []
COUNT = [0]


def check(name: str, ok: bool, detail: str = "") -> None:
    COUNT[0] += 1
    if not ok:
        FAILED.append(name)
    print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}".rstrip(), flush=True)


def data(n: int, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Small integers depending on rank and position (exact in every dtype)."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 13 + salt * 5) % 11 - 3
    return v.to(dtype)


def positive(n: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.int64)
    return ((i + rank) % 3 + 1).to(dtype)


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def collectives(rank: int, n: int, gloo, groups: dict) -> None:
    dtypes = [torch.int32, torch.int64, torch.float32, torch.float64]
    for gname, grp in groups.items():
        for count in (1, 7, 1000, 65543):
            for dt in dtypes:
                for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
                    make = positive if op == R.PRODUCT else data
                    a = make(count, dt, rank)
                    b = a.clone()
                    dist.all_reduce(a, op=op, group=grp)
                    dist.all_reduce(b, op=op, group=gloo)
                    check(f"all_reduce[{gname},{count},{dt},{op}]", equal(a, b))
            for dt in (torch.float32, torch.float64, torch.int64):
                a = data(count, dt, rank)
                b = a.clone()
                work = dist.all_reduce(a, op=R.AVG, group=grp, async_op=True)
                work.wait()
                dist.all_reduce(b, op=R.SUM, group=gloo)
                want = b / n if dt.is_floating_point else torch.div(b, n, rounding_mode="floor")
                check(f"all_reduce_avg_async[{gname},{count},{dt}]", equal(a, want))
    # reduce-scatter, all-gather, broadcast, reduce: every dtype, sync and async
    for count in (1, 5, 4099):
        for dt in dtypes:
            for op in (R.SUM, R.MAX, R.MIN):
                x = data(count * n, dt, rank, salt=1)
                a, b = torch.empty(count, dtype=dt), torch.empty(count, dtype=dt)
                dist.reduce_scatter_tensor(a, x, op=op)
                dist.reduce_scatter_tensor(b, x.clone(), op=op, group=gloo)
                check(f"reduce_scatter_tensor[{count},{dt},{op}]", equal(a, b))
            x = data(count * n, dt, rank, salt=2)
            a, b = torch.empty(count, dtype=dt), torch.empty(count, dtype=dt)
            dist.reduce_scatter_tensor(a, x, op=R.AVG, async_op=True).wait()
            dist.reduce_scatter_tensor(b, x.clone(), op=R.SUM, group=gloo)
            want = b / n if dt.is_floating_point else torch.div(b, n, rounding_mode="floor")
            check(f"reduce_scatter_tensor_avg[{count},{dt}]", equal(a, want))
            ins = [data(count, dt, rank, salt=3 + j) for j in range(n)]
            a, b = torch.empty(count, dtype=dt), torch.empty(count, dtype=dt)
            dist.reduce_scatter(a, ins)
            dist.reduce_scatter(b, [t.clone() for t in ins], group=gloo)
            check(f"reduce_scatter_list[{count},{dt}]", equal(a, b))
            x = data(count, dt, rank, salt=4)
            a, b = torch.empty(count * n, dtype=dt), torch.empty(count * n, dtype=dt)
            w = dist.all_gather_into_tensor(a, x, async_op=True)
            dist.all_gather_into_tensor(b, x, group=gloo)
            w.wait()
            check(f"all_gather_into_tensor[{count},{dt}]", equal(a, b))
            la = [torch.empty(count, dtype=dt) for _ in range(n)]
            lb = [torch.empty(count, dtype=dt) for _ in range(n)]
            dist.all_gather(la, x)
            dist.all_gather(lb, x, group=gloo)
            check(f"all_gather_list[{count},{dt}]",
                  all(equal(p, q) for p, q in zip(la, lb, strict=True)))
            for root in range(n):
                a = data(count, dt, rank, salt=5 + root)
                b = a.clone()
                dist.broadcast(a, src=root)
                dist.broadcast(b, src=root, group=gloo)
                check(f"broadcast[{count},{dt},root{root}]", equal(a, b))
                a = data(count, dt, rank, salt=6 + root)
                b = a.clone()
                dist.reduce(a, dst=root, op=R.SUM)
                dist.reduce(b, dst=root, op=R.SUM, group=gloo)
                check(f"reduce[{count},{dt},root{root}]", rank != root or equal(a, b))
    # the family on the groups whose algorithm serves it (bml, ring, tree where they do)
    for gname in ("bml", "ring", "tree"):
        grp = groups[gname]
        for count in (3, 4099):
            for dt in (torch.int64, torch.float32):
                x = data(count * n, dt, rank, salt=7)
                a, b = torch.empty(count, dtype=dt), torch.empty(count, dtype=dt)
                dist.reduce_scatter_tensor(a, x, group=grp)
                dist.reduce_scatter_tensor(b, x.clone(), group=gloo)
                check(f"reduce_scatter_tensor[{gname},{count},{dt}]", equal(a, b))
                x = data(count, dt, rank, salt=8)
                a, b = torch.empty(count * n, dtype=dt), torch.empty(count * n, dtype=dt)
                dist.all_gather_into_tensor(a, x, group=grp)
                dist.all_gather_into_tensor(b, x, group=gloo)
                check(f"all_gather_into_tensor[{gname},{count},{dt}]", equal(a, b))
                for root in range(n):
                    a = data(count, dt, rank, salt=9 + root)
                    b = a.clone()
                    dist.broadcast(a, group_src=root, group=grp)
                    dist.broadcast(b, src=root, group=gloo)
                    check(f"broadcast[{gname},{count},{dt},root{root}]", equal(a, b))
                    a = data(count, dt, rank, salt=10 + root)
                    b = a.clone()
                    dist.reduce(a, group_dst=root, group=grp)
                    dist.reduce(b, dst=root, group=gloo)
                    check(f"reduce[{gname},{count},{dt},root{root}]", rank != root or equal(a, b))
    # a tensor that is not contiguous, bfloat16 through the copying collectives
    a = data(64, torch.float32, rank).reshape(8, 8).t()
    b = a.contiguous().clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    check("all_reduce_noncontiguous", equal(a.contiguous(), b))
    a = (data(33, torch.float32, rank) / 4).to(torch.bfloat16)
    b = a.clone()
    dist.broadcast(a, src=n - 1)
    dist.broadcast(b, src=n - 1, group=gloo)
    check("broadcast_bfloat16", equal(a, b))
    la = [torch.empty(33, dtype=torch.bfloat16) for _ in range(n)]
    lb = [torch.empty(33, dtype=torch.bfloat16) for _ in range(n)]
    dist.all_gather(la, a)
    dist.all_gather(lb, a, group=gloo)
    check("all_gather_bfloat16", all(equal(p, q) for p, q in zip(la, lb, strict=True)))
    # several async works in flight, waited on in reverse order; futures hold the outputs
    ts = [data(1000 + 17 * j, torch.float32, rank, salt=j) for j in range(4)]
    refs = [t.clone() for t in ts]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    gathered = torch.empty(5 * n, dtype=torch.int64)
    works.append(dist.all_gather_into_tensor(gathered, data(5, torch.int64, rank), async_op=True))
    for w in reversed(works):
        check("work_wait_true", w.wait() is True)
    for t, ref, w in zip(ts, refs, works[:-1], strict=True):
        dist.all_reduce(ref, group=gloo)
        fut = w.get_future()
        check("work_future_value", fut.done() and equal(fut.value()[0], ref) and equal(t, ref))
        check("work_is_completed", w.is_completed())
    ref = torch.empty(5 * n, dtype=torch.int64)
    dist.all_gather_into_tensor(ref, data(5, torch.int64, rank), group=gloo)
    check("work_allgather_future", equal(works[-1].get_future().value()[0], ref))
    # a future completes without wait(): the progress thread drives it
    t = data(5000, torch.float64, rank)
    fut = dist.all_reduce(t, async_op=True).get_future()
    got = fut.wait()
    ref = data(5000, torch.float64, rank)
    dist.all_reduce(ref, group=gloo)
    check("future_without_wait", equal(got[0], ref))
    dist.barrier()
    check("barrier", True)
    # unsupported op and dtype: a clear error on every rank, and the group still works
    for name, call in (("bool", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool))),
                       ("band", lambda: dist.all_reduce(torch.ones(3), op=R.BAND)),
                       ("bf16_sum", lambda: dist.all_reduce(torch.ones(3,
                                                                      dtype=torch.bfloat16)))):
        try:
            call()
            check(f"refused_{name}", False, "no error")
        except UnsupportedCall as exc:
            check(f"refused_{name}", "bmlmpi" in str(exc), str(exc)[:80])
    a = data(10, torch.int64, rank)
    b = a.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    check("usable_after_refusal", equal(a, b))
    if n > 2:
        members = list(range(n - 1))
        sub = dist.new_group(ranks=members, backend="bmlmpi")
        subg = dist.new_group(ranks=members, backend="gloo")
        if rank in members:
            a = data(77, torch.int64, rank)
            b = a.clone()
            dist.all_reduce(a, group=sub)
            dist.all_reduce(b, group=subg)
            check("subgroup_all_reduce", equal(a, b) and sub.size() == n - 1)


class Net(torch.nn.Module):
    """A small CNN (the job's shape), deterministic from the seed."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)


def fresh():
    torch.manual_seed(0)
    return Net()


def train(model, rank, steps, group=None, hook=None, state=None, opt=None, ddp=True,
          bucket_cap_mb=25.0, record=None):
    m = model
    if ddp:
        m = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                      bucket_cap_mb=bucket_cap_mb)
        if hook is not None:
            m.register_comm_hook(state, hook)
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        if record is not None:
            record.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    return model


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def identical_on_every_rank(v: torch.Tensor) -> bool:
    arr = v.double().numpy()
    hi, lo = np.empty_like(arr), np.empty_like(arr)
    MPI.COMM_WORLD.Allreduce(arr, hi, MPI.MAX)
    MPI.COMM_WORLD.Allreduce(arr, lo, MPI.MIN)
    return bool(np.array_equal(hi, lo))


def close(a: torch.Tensor, b: torch.Tensor, rtol=1e-5, atol=1e-6) -> tuple[bool, str]:
    err = (a - b).abs().max().item()
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol)), f"max |diff| {err:.3g}"


def ddp_checks(rank: int, n: int, gloo) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    steps = 3
    ref = flat(train(fresh(), rank, steps, group=gloo))
    bml = flat(train(fresh(), rank, steps))
    check("ddp_identical_across_ranks", identical_on_every_rank(bml))
    check("ddp_equals_gloo", *close(bml, ref))
    got = flat(train(fresh(), rank, steps, hook=hooks.allreduce_hook,
                     state=hooks.AllreduceState()))
    check("ddp_allreduce_hook_equals_gloo", *close(got, ref))
    check("ddp_allreduce_hook_identical", identical_on_every_rank(got))
    # fp16: bmlmpi's hook against torch's fp16_compress_hook on gloo, gradient of step 1 and
    # parameters after the steps, to float16 rounding
    g_ref, g_bml = [], []
    p_ref = flat(train(fresh(), rank, steps, group=gloo, hook=fp16_compress_hook, state=gloo,
                       record=g_ref))
    p_bml = flat(train(fresh(), rank, steps, hook=hooks.compression_hook,
                       state=hooks.CompressionState("fp16"), record=g_bml))
    g0r = torch.cat([g.reshape(-1) for g in g_ref[0]])
    g0b = torch.cat([g.reshape(-1) for g in g_bml[0]])
    scale = g0r.abs().max().item()
    tol = scale * 2.0 ** -10 * 2
    check("fp16_hook_step1_gradient_matches_torch", *close(g0b, g0r, rtol=0, atol=tol))
    check("fp16_hook_params_match_torch", *close(p_bml, p_ref, rtol=0, atol=0.1 * tol * steps * 4))
    check("fp16_hook_identical", identical_on_every_rank(p_bml))
    g_plain = []
    train(fresh(), rank, 1, group=gloo, record=g_plain)
    g_bf = []
    p_bf = flat(train(fresh(), rank, steps, hook=hooks.compression_hook,
                      state=hooks.CompressionState("bf16"), record=g_bf))
    g0p = torch.cat([g.reshape(-1) for g in g_plain[0]])
    g0f = torch.cat([g.reshape(-1) for g in g_bf[0]])
    check("bf16_hook_step1_gradient", *close(g0f, g0p, rtol=0,
                                             atol=g0p.abs().max().item() * 2.0 ** -7 * 2))
    check("bf16_hook_identical", identical_on_every_rank(p_bf))
    # the TDF filters and top-k: error feedback conserved, the result the average of what was
    # sent
    for spec in ("threshold:0.002", "tdf:0.002:0.5:0.5", "random:0.5:7", "topk:0.05"):
        state = hooks.CompressionState(spec)
        state.compressor.record = True
        seen = []

        def recording(st, bucket, seen=seen):
            entry = [st.key(bucket), bucket.buffer().detach().clone(), None]
            seen.append(entry)

            def keep(fut, entry=entry):
                entry[2] = fut.value().detach().clone()
                return fut.value()
            return hooks.compression_hook(st, bucket).then(keep)

        p = flat(train(fresh(), rank, 4, hook=recording, state=state, bucket_cap_mb=0.001))
        check(f"{spec}_identical", identical_on_every_rank(p))
        ok, why = conserved(state.compressor, seen, n, state._sizes)
        check(f"{spec}_error_feedback", ok, why)
        check(f"{spec}_dropped_some", state.compressor.dropped > 0,
              f"{state.compressor.dropped} of {state.compressor.elements}")
    # bmlmpi's bucket plans over DDP's buckets (small buckets: one a layer)
    state = hooks.BucketPlanState(plan="ibatch")
    steps_plan = 9
    p = flat(train(fresh(), rank, steps_plan, hook=hooks.bucket_plan_hook, state=state,
                   bucket_cap_mb=0.0001))
    ref9 = flat(train(fresh(), rank, steps_plan, group=gloo))
    check("ibatch_hook_equals_gloo", *close(p, ref9))
    check("ibatch_hook_identical", identical_on_every_rank(p))
    check("ibatch_hook_planned", state.buckets is not None and state.buckets.plan_name ==
          "ibatch" and len(state.buckets.grads) >= 4,
          f"{None if state.buckets is None else state.buckets.buckets}")
    # ZeRO against plain DDP (both on bmlmpi): the same DDP training, the SGD step sharded
    # over the ranks and each shard broadcast by its owner; SGD's step is elementwise, so the
    # parameters must be the DDP run's bit for bit
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = fresh()
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    pz = flat(train(model, rank, steps, opt=zero))
    check("zero_equals_ddp", equal(pz, bml), close(pz, bml)[1])
    check("zero_identical", identical_on_every_rank(pz))
    # FSDP (fully_shard, and FullyShardedDataParallel) on CPU against plain DDP
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    model = fresh()
    for layer in (model.conv, model.fc1, model.fc2):
        fully_shard(layer)
    fully_shard(model)
    train(model, rank, steps, ddp=False)
    full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    check("fsdp2_equals_ddp", *close(full, bml))
    model = FullyShardedDataParallel(fresh(), device_id=torch.device("cpu"),
                                     use_orig_params=True)
    train(model, rank, steps, ddp=False)
    with FullyShardedDataParallel.summon_full_params(model):
        full = flat(model)
    check("fsdp1_equals_ddp", *close(full, bml))


def fsdp_reproducible(rank: int, n: int, groups: dict) -> None:
    """FSDP2 (``fully_shard`` on a mesh of the group) trains two steps on reproducible
    groups of ``ring`` and ``bml`` (``Options(reproducible=True)``): its gradients'
    reduce_scatter_tensor (AVG for float32, the recorder says) runs in the reproducible
    format, and both end with the same parameter bits, on every rank. The same training on
    the plain groups of those algorithms ends with other bits at N >= 3, where their
    reduce-scatters sum three or more addends in other orders (two addends' sum has one
    order). Run at N = 3 only: its four trainings cost ~23 s at N = 3 and 4 on the loaded
    development machine (load ~36), mostly FSDP2's setup, and N = 4 shows nothing more
    (both pass there)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def trained(group) -> tuple[torch.Tensor, set]:
        mesh = DeviceMesh.from_group(group, "cpu")
        model = fresh()
        for layer in (model.conv, model.fc1, model.fc2):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        train(model, rank, 2, ddp=False)
        full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
        ops = {c["op"] for c in group.communicator.recorder.calls()
               if c["collective"] == "reduce_scatter"}
        return full, ops

    got = {}
    for mode in ("reproducible", "plain"):
        for alg in ("ring", "bml"):
            got[mode, alg] = trained(groups[f"{mode} {alg}"])
    same = equal(got["reproducible", "ring"][0], got["reproducible", "bml"][0])
    ops = got["reproducible", "ring"][1] | got["reproducible", "bml"][1]
    check("fsdp2_reproducible_same_bits_ring_bml",
          same and identical_on_every_rank(got["reproducible", "ring"][0]) and ops == {"avg"}
          and groups["reproducible ring"].communicator.reproducible,
          f"bits equal: {same}; reduce-scatter ops {sorted(ops)}")
    plain_same = equal(got["plain", "ring"][0], got["plain", "bml"][0])
    plain_ops = got["plain", "ring"][1] | got["plain", "bml"][1]
    check("fsdp2_plain_ring_bml_differ_from_3_ranks",
          plain_same == (n < 3) and plain_ops == {"avg"},
          f"plain bits equal: {plain_same}; reduce-scatter ops {sorted(plain_ops)}")


def conserved(c, seen, n, sizes) -> tuple[bool, str]:
    """Per call of the compressor on this rank: y = g + what the parameters kept at their
    previous call (residuals follow each parameter when DDP regroups its buckets); sent +
    kept = y exactly; and the hook's result is the average over ranks of what they sent."""
    kept_of: dict[int, np.ndarray] = {}
    worst = 0.0
    rounding = 2.0 ** -9 if c.wire else 1e-6
    for (key, y, sent, kept), (key2, g, result) in zip(c.history, seen, strict=True):
        if key != key2:
            return False, f"keys {key} != {key2}"
        g = g.numpy().astype(y.dtype)
        expect = g
        if all(i in kept_of for i in key):
            expect = g + np.concatenate([kept_of[i] for i in key])
        if not np.array_equal(y, expect):
            return False, f"y != g + residual for {key}"
        if not np.array_equal(sent + kept, y):
            return False, f"sent + kept != y for {key}"
        for i in kept_of.copy():
            if i in key:
                del kept_of[i]
        off = 0
        for i in key:
            kept_of[i] = kept[off:off + sizes[i]]
            off += sizes[i]
        total = np.empty_like(sent, dtype=np.float64)
        MPI.COMM_WORLD.Allreduce(sent.astype(np.float64), total, MPI.SUM)
        want = total / n
        err = float(np.abs(result.numpy() - want).max()) if want.size else 0.0
        bound = rounding * (float(np.abs(want).max()) if want.size else 0.0) + 1e-12
        if err > bound:
            return False, f"result differs from the average sent by {err:.3g} > {bound:.3g}"
        worst = max(worst, err)
    return True, f"{len(c.history)} calls, result within {worst:.3g} of the average sent"


def auto_commits(rank: int, n: int, pg: dist.ProcessGroup) -> None:
    """The backend's ``auto`` is its communicator's (docs/tuning.md): a signature's blocking
    torch all_reduces explore the candidates through the same Tuner, in its blocks, then every
    rank commits alike and the later calls run the committed algorithm, exactly."""
    c = pg.communicator
    dist.all_reduce(torch.ones(3))   # a blocking auto call: the prices are taken after it
    c.tuning.tuner.forget_seeds()    # measured here, whatever a tuning table holds
    size = 777   # float64: an 8 KiB class no other check uses
    key = c.tuning.key("allreduce", size, np.dtype(np.float64), "sum", 0)
    exact, calls, after = True, 0, []
    while len(after) < 3 and calls < 400:   # 6 candidates: 294 calls (24 in blocks of one)
        t = data(size, torch.float64, rank, calls)
        dist.all_reduce(t)
        exact &= torch.equal(t, sum(data(size, torch.float64, r, calls) for r in range(n)))
        calls += 1
        if c.tuning.tuner.committed(key) is not None:
            after.append(c.recorder.calls()[-1]["chosen"])
    report = c.tuning.tuner.report(key)
    # every candidate ran its counted blocks (the warm-up call is not counted)
    blocks = {t.name: (t.samples, len(t.blocks)) for t in report.candidates}
    block = c.tuning.tuner.block_calls_at(key.size)
    agreed = MPI.COMM_WORLD.allgather((report.chosen, [t.measured for t in report.candidates]))
    check("auto_commits_through_the_tuner",
          exact and report.state == "committed" and report.why in ("measured", "rule")
          and len(blocks) > 1 and set(blocks.values()) == {(3 * block, 3)}
          and after[1:] == [report.chosen] * 2 and agreed == [agreed[0]] * n,
          f"{report.chosen} ({report.why}) after {calls} calls; candidates {blocks}")


def main() -> int:
    pg = bmlmpi.torch.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    check("rank_from_mpi", rank == MPI.COMM_WORLD.rank and n == MPI.COMM_WORLD.size)
    check("backend_name", dist.get_backend() == "bmlmpi" and pg.getBackendName() == "bmlmpi")
    # a store on the address given (not the 127.0.0.1 chosen for one node), found by all
    store = bmlmpi.torch.store_from_mpi(host="localhost")
    store.set(f"rank{rank}", str(rank * 7))
    got = [store.get(f"rank{r}").decode() for r in range(n)]  # get waits for the key
    check("store_on_given_host", store.host == "localhost" and got == [str(r * 7)
                                                                        for r in range(n)])
    gloo = dist.new_group(backend="gloo")
    groups = {"auto": dist.group.WORLD}
    for alg in ("bml", "ring", "tree"):
        groups[alg] = dist.new_group(backend="bmlmpi", pg_options=Options(algorithm=alg))
    fsdp_groups = {}   # FSDP2's own: fsdp_reproducible (sized: its docstring)
    for alg in ("ring", "bml") if n == 3 else ():
        for mode in ("reproducible", "plain"):
            fsdp_groups[f"{mode} {alg}"] = dist.new_group(
                backend="bmlmpi", pg_options=Options(algorithm=alg,
                                                     reproducible=mode == "reproducible"))
    try:
        auto_commits(rank, n, pg)
        collectives(rank, n, gloo, groups)
        p2p_checks(rank, n, gloo, check)
        alltoall_checks(rank, n, gloo, check)
        ddp_checks(rank, n, gloo)
        if fsdp_groups:
            fsdp_reproducible(rank, n, fsdp_groups)
        dtensor_checks(rank, n, gloo, check)
    except Exception:
        traceback.print_exc()
        check("no_exception", False)
    dist.destroy_process_group()
    print(f"TORCH-RANKS DONE {COUNT[0]} failed {len(FAILED)} {FAILED[:5]}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
