"""Point-to-point, gather, scatter and the coalesced calls of backend ``bmlmpi`` against backend
``gloo`` on the same inputs; the refusals.

:func:`checks` runs inside ``tests/frameworks/torch_ranks.py`` (one launch per N = 2, 3, 4 of
``tests/test_torch_backend.py``); run alone (``bmlmpi-run -n N python
tests/frameworks/torch_p2p_ranks.py``) it makes its own groups and prints the same ``CHECK``
lines. Data depend on the sender, the receiver and the position (a message that lands in the
wrong tensor, or a block at the wrong place, fails); every comparison is exact.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from alone import run_alone

import bmlmpi
import bmlmpi.torch
from bmlmpi.torch import Options, UnsupportedCall


def message(count: int, dtype: torch.dtype, src: int, dst: int, salt: int = 0) -> torch.Tensor:
    """What ``src`` sends ``dst``: small integers of the position and both ranks."""
    i = torch.arange(count, dtype=torch.int64)
    v = (i * 5 + src * 11 + dst * 3 + salt * 7) % 13 - 4
    return (v > 0) if dtype == torch.bool else v.to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def point_to_point(rank: int, n: int, gloo, check: Callable) -> None:
    right, left = (rank + 1) % n, (rank - 1) % n
    for dtype in (torch.int64, torch.float32, torch.bfloat16, torch.bool):
        for count in (0, 1, 1000):
            got = {}
            for name, grp in (("bmlmpi", None), ("gloo", gloo)):
                out = torch.full((count,), 9, dtype=torch.int64).to(dtype)
                reqs = [dist.isend(message(count, dtype, rank, right), right, group=grp, tag=4),
                        dist.irecv(out, left, group=grp, tag=4)]
                for r in reqs:
                    r.wait()
                got[name] = out
            check(f"isend_irecv_ring[{count},{dtype}]",
                  same(got["bmlmpi"], message(count, dtype, left, rank))
                  and same(got["bmlmpi"], got["gloo"]))
    # batch_isend_irecv both ways round the ring; bmlmpi receives into a non-contiguous tensor
    # (gloo takes contiguous ones only)
    for name, grp in (("bmlmpi", None), ("gloo", gloo)):
        frm_left = torch.zeros(6, 4, dtype=torch.int32).t() if name == "bmlmpi" \
            else torch.zeros(4, 6, dtype=torch.int32)
        frm_right = torch.zeros(24, dtype=torch.int32)
        ops = [dist.P2POp(dist.irecv, frm_left, left, group=grp, tag=1),
               dist.P2POp(dist.isend, message(24, torch.int32, rank, right).view(4, 6), right,
                          group=grp, tag=1),
               dist.P2POp(dist.isend, message(24, torch.int32, rank, left, salt=1), left,
                          group=grp, tag=2),
               dist.P2POp(dist.irecv, frm_right, right, group=grp, tag=2)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if name == "bmlmpi":
            mine = (frm_left.clone(), frm_right.clone())
        else:
            check("batch_isend_irecv",
                  same(mine[0], message(24, torch.int32, left, rank).view(4, 6))
                  and same(mine[1], message(24, torch.int32, right, rank, salt=1))
                  and same(mine[0], frm_left) and same(mine[1], frm_right))
    # blocking send/recv between 0 and 1; tags matched out of their sending order
    if n >= 2 and rank < 2:
        peer = 1 - rank
        if rank == 0:
            dist.send(message(7, torch.float64, 0, 1, salt=1), 1, tag=11)
            dist.send(message(7, torch.float64, 0, 1, salt=2), 1, tag=12)
            back = torch.empty(3, dtype=torch.int16)
            src = dist.recv(back, peer, tag=5)
            check("send_recv_blocking", src == 1 and same(back, message(3, torch.int16, 1, 0)))
        else:
            second, first = torch.empty(7, dtype=torch.float64), torch.empty(7, dtype=torch.float64)
            dist.recv(second, 0, tag=12)
            dist.recv(first, 0, tag=11)
            dist.send(message(3, torch.int16, 1, 0), 0, tag=5)
            check("recv_by_tag_out_of_order",
                  same(first, message(7, torch.float64, 0, 1, salt=1))
                  and same(second, message(7, torch.float64, 0, 1, salt=2)))
    # from any rank: rank 0 hears from every other
    if rank == 0:
        heard = {}
        for _ in range(n - 1):
            t = torch.empty(5, dtype=torch.int64)
            src = dist.recv(t, tag=21)
            heard[src] = same(t, message(5, torch.int64, src, 0))
        check("recv_from_any_rank", sorted(heard) == list(range(1, n)) and all(heard.values()),
              str(heard))
    else:
        dist.send(message(5, torch.int64, rank, 0), 0, tag=21)
    dist.barrier()


def gather_scatter(rank: int, n: int, gloo, check: Callable) -> None:
    for root in range(n):
        for dtype in (torch.int32, torch.float64, torch.bfloat16):
            for count in (0, 3, 4099):
                got = {}
                for name, grp in (("bmlmpi", None), ("gloo", gloo)):
                    outs = [torch.full((count,), -1, dtype=torch.int64).to(dtype)
                            for _ in range(n)] if rank == root else None
                    dist.gather(message(count, dtype, rank, root), outs, dst=root, group=grp)
                    got[name] = outs
                if rank == root:
                    ok = all(same(got["bmlmpi"][r], message(count, dtype, r, root))
                             and same(got["bmlmpi"][r], got["gloo"][r]) for r in range(n))
                    check(f"gather[{count},{dtype},root{root}]", ok)
                got = {}
                for name, grp in (("bmlmpi", None), ("gloo", gloo)):
                    ins = [message(count, dtype, root, r, salt=3) for r in range(n)] \
                        if rank == root else None
                    out = torch.full((count,), -1, dtype=torch.int64).to(dtype)
                    work = dist.scatter(out, ins, src=root, group=grp, async_op=True)
                    work.wait()
                    got[name] = out
                check(f"scatter[{count},{dtype},root{root}]",
                      same(got["bmlmpi"], message(count, dtype, root, rank, salt=3))
                      and same(got["bmlmpi"], got["gloo"]))
    objs = [None] * n if rank == 0 else None
    dist.gather_object({"rank": rank, "sq": [rank] * rank}, objs, dst=0)
    if rank == 0:
        check("gather_object", objs == [{"rank": r, "sq": [r] * r} for r in range(n)])
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" * (r + 1) for r in range(n)] if rank == 0
                             else None, src=0)
    check("scatter_object_list", out == [f"to {rank}" * (rank + 1)])


def coalesced(rank: int, n: int, gloo, check: Callable) -> None:
    sizes = (3, 0, 1000)
    for dtype in (torch.int64, torch.float32):
        got = {}
        for name, grp in (("bmlmpi", None), ("gloo", gloo)):
            ins = [message(k, dtype, rank, i) for i, k in enumerate(sizes)]
            outs = [[torch.full((k,), -1, dtype=dtype) for k in sizes] for _ in range(n)]
            dist.all_gather_coalesced(outs, ins, group=grp)
            got[name] = outs
        ok = all(same(got["bmlmpi"][r][i], message(k, dtype, r, i))
                 and same(got["bmlmpi"][r][i], got["gloo"][r][i])
                 for r in range(n) for i, k in enumerate(sizes))
        check(f"all_gather_coalesced[{dtype}]", ok)
        got = {}
        for name, grp in (("bmlmpi", None), ("gloo", gloo)):
            ts = [message(k, dtype, rank, i, salt=2) for i, k in enumerate(sizes)]
            dist.all_reduce_coalesced(ts, group=grp)
            got[name] = ts
        check(f"all_reduce_coalesced[{dtype}]",
              all(same(a, b) for a, b in zip(got["bmlmpi"], got["gloo"], strict=True)))
    # torch's coalescing manager: recorded all_reduces (one allreduce_coalesced), without and
    # with a device (then _start_coalescing/_end_coalescing bracket the calls)
    want = [message(k, torch.float32, rank, i, salt=5) for i, k in enumerate(sizes)]
    for w in want:
        dist.all_reduce(w, group=gloo)
    for device in (None, torch.device("cpu")):
        ts = [message(k, torch.float32, rank, i, salt=5) for i, k in enumerate(sizes)]
        with dist.distributed_c10d._coalescing_manager(device=device, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        check(f"coalescing_manager[{device}]",
              all(same(a, b) for a, b in zip(ts, want, strict=True)))
    outs = [torch.full((2 * n,), -1.0) for _ in range(2)]
    with dist.distributed_c10d._coalescing_manager(async_ops=False):
        for k, o in enumerate(outs):
            dist.all_gather_into_tensor(o, message(2, torch.float32, rank, k))
    check("coalescing_manager_all_gather_into_tensor",
          all(same(o, torch.cat([message(2, torch.float32, r, k) for r in range(n)]))
              for k, o in enumerate(outs)))


def refusals(rank: int, n: int, check: Callable) -> None:
    def refused(name: str, call: Callable, error: type, says: str) -> None:
        try:
            call()
        except error as exc:
            check(name, says in str(exc), str(exc)[:160])
        else:
            check(name, False, "not refused")

    refused("refused_negative_tag", lambda: dist.isend(torch.zeros(1), (rank + 1) % n, tag=-1),
            UnsupportedCall, "tag -1")
    # torch 2.13 serves monitored_barrier for gloo only, before it reaches any other backend
    refused("monitored_barrier_is_torchs_gloo_only", lambda: dist.monitored_barrier(),
            ValueError, "only implemented for GLOO")
    # a message shorter than the tensor fails the receive, naming both sizes
    if rank == 1:
        dist.send(torch.ones(5), 0, tag=31)
    elif rank == 0:
        refused("recv_of_a_shorter_message",
                lambda: dist.recv(torch.empty(6), 1, tag=31), ValueError,
                "holds 20 bytes, the tensor 24")
    # a receive whose message never comes fails at the group's deadline, and is withdrawn
    quick = dist.new_group(backend="bmlmpi", pg_options=Options(timeout=1.0))
    if rank == 0:
        refused("recv_deadline", lambda: dist.recv(torch.empty(2), n - 1, group=quick, tag=77),
                bmlmpi.DeadlineExceeded, "no message within")
    dist.barrier()


def checks(rank: int, n: int, gloo, check: Callable) -> None:
    for part in (point_to_point, gather_scatter, coalesced):
        part(rank, n, gloo, check)
    refusals(rank, n, check)


if __name__ == "__main__":
    sys.exit(run_alone("TORCH-P2P", checks))
