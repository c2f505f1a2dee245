"""DTensor on a 1-D CPU mesh and FSDP2 (``fully_shard``) on backend ``bmlmpi``, each against the
same on backend ``gloo`` and against the one-process result.

:func:`checks` runs inside ``tests/frameworks/torch_ranks.py`` (one launch per N = 2, 3, 4 of
``tests/test_torch_backend.py``); run alone (``bmlmpi-run -n N python
tests/frameworks/torch_dtensor_ranks.py``) it makes its own groups and prints the same
``CHECK`` lines.

DTensor: one mesh over the default group (``init_device_mesh("cpu", (N,))``: bmlmpi's) and one
over the gloo group beside it. Every rank passes its own tensor to ``distribute_tensor``, rank
0's the global one and the others' shifted by the rank: torch takes rank 0's data (a scatter
for ``Shard``, a broadcast for ``Replicate``), so a rank that kept its own data, or a shard at
the wrong place, fails. Shapes do not divide by N (uneven shards, an empty one at N = 4).
Each placement's local shard is compared with gloo's and with the one-process chunk, each
``redistribute`` (and the collective torch ran for it, counted by ``CommDebugMode``) with
gloo's and the one-process layout, ``full_tensor()`` with the global tensor, and two sharded
matmuls (a column-sharded weight times a replicated input; a row-sharded weight times a
column-sharded input, whose Partial result becomes Replicate by an all_reduce) with gloo's
and the one-process product. The values are small integers, so every float sum is exact in
any order and every comparison is bitwise.

FSDP2: the same model, seeds and data, ``fully_shard`` per layer and on the root, trained a
few steps on the default group and on a mesh over the gloo group. Gradients are averaged by a
reduce-scatter (torch's AVG for float32); at N = 2 a sum of two is the same in either order,
so the parameters must be bitwise equal; at N = 3 and 4 the two backends may add the ranks'
gradients in another order, so there they must agree within float32 rounding (rtol 1e-5,
atol 1e-6, the largest difference printed).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from alone import run_alone
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode


def small_integers(rows: int, cols: int, salt: int) -> torch.Tensor:
    """A float32 matrix of small integers that depend on row, column and ``salt``."""
    i = torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols)
    return ((i * 7 + salt * 3) % 11 - 5).to(torch.float32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def one_process(x: torch.Tensor, placement, rank: int, n: int) -> torch.Tensor:
    """The local part of ``x`` a rank holds under ``placement`` (torch.chunk's split, as
    DTensor's Shard; an empty part where chunk gives fewer pieces than ranks)."""
    if isinstance(placement, Replicate):
        return x
    pieces = torch.chunk(x, n, dim=placement.dim)
    if rank < len(pieces):
        return pieces[rank]
    shape = list(x.shape)
    shape[placement.dim] = 0
    return x.new_empty(shape)


def collectives_run(mode: CommDebugMode) -> str:
    counts = mode.get_comm_counts()
    return ",".join(sorted(f"{getattr(op, '__name__', str(op))}:{k}"
                           for op, k in counts.items())) or "none"


def dtensor(rank: int, n: int, gloo, check: Callable) -> None:
    meshes = {"bmlmpi": init_device_mesh("cpu", (n,)), "gloo": DeviceMesh.from_group(gloo, "cpu")}
    rows, cols = 2 * n + 1, 3 * n - 1
    x = small_integers(rows, cols, 1)
    mine = x if rank == 0 else x + 100 * rank   # torch must take rank 0's
    placements = {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}
    made = {}
    for pname, p in placements.items():
        local = {}
        for backend, mesh in meshes.items():
            made[backend, pname] = distribute_tensor(mine.clone(), mesh, [p])
            local[backend] = made[backend, pname].to_local()
        check(f"dtensor_distribute[{pname}]",
              same(local["bmlmpi"], one_process(x, p, rank, n))
              and same(local["bmlmpi"], local["gloo"]),
              f"local {tuple(local['bmlmpi'].shape)}")
        full = made["bmlmpi", pname].full_tensor()
        check(f"dtensor_full_tensor[{pname}]", same(full, x))
    for src, dst in (("shard0", "replicate"), ("replicate", "shard0"), ("replicate", "shard1"),
                     ("shard0", "shard1"), ("shard1", "shard0"), ("shard1", "replicate")):
        local, ran = {}, {}
        for backend in meshes:
            with CommDebugMode() as mode:
                moved = made[backend, src].redistribute(placements=[placements[dst]])
                local[backend] = moved.to_local()
            ran[backend] = collectives_run(mode)
        check(f"dtensor_redistribute[{src}->{dst}]",
              same(local["bmlmpi"], one_process(x, placements[dst], rank, n))
              and same(local["bmlmpi"], local["gloo"]) and ran["bmlmpi"] == ran["gloo"],
              f"collectives {ran['bmlmpi']}")
    # Partial -> Replicate (all_reduce) and Partial -> Shard(0) (reduce_scatter): each rank's
    # addend differs, the sum is the one-process sum over ranks
    addends = [small_integers(rows, cols, 5 + r) for r in range(n)]
    for dst in ("replicate", "shard0"):
        local, ran = {}, {}
        for backend, mesh in meshes.items():
            part = DTensor.from_local(addends[rank].clone(), mesh, [Partial()])
            with CommDebugMode() as mode:
                local[backend] = part.redistribute(placements=[placements[dst]]).to_local()
            ran[backend] = collectives_run(mode)
        want = one_process(sum(addends), placements[dst], rank, n)
        check(f"dtensor_redistribute[partial->{dst}]",
              same(local["bmlmpi"], want) and same(local["bmlmpi"], local["gloo"]),
              f"collectives {ran['bmlmpi']}")
    # sharded matmuls: y = inp @ w
    inp, w = small_integers(5, rows, 2), small_integers(rows, cols, 3)
    for name, inp_p, w_p in (("colwise", Replicate(), Shard(1)), ("rowwise", Shard(1), Shard(0))):
        out, full, ran = {}, {}, {}
        for backend, mesh in meshes.items():
            di = distribute_tensor(inp, mesh, [inp_p])
            dw = distribute_tensor(w, mesh, [w_p])
            with CommDebugMode() as mode:
                y = torch.matmul(di, dw)
                if name == "rowwise":
                    partial = isinstance(y.placements[0], Partial)
                    y = y.redistribute(placements=[Replicate()])
                full[backend] = y.full_tensor()
                out[backend] = y.to_local()
            ran[backend] = collectives_run(mode)
        ok = same(full["bmlmpi"], inp @ w) and same(out["bmlmpi"], out["gloo"]) \
            and same(full["bmlmpi"], full["gloo"])
        if name == "rowwise":
            ok = ok and partial
        check(f"dtensor_matmul[{name}]", ok, f"collectives {ran['bmlmpi']}")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 10)
        self.fc2 = torch.nn.Linear(10, 7)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def fsdp2_trained(rank: int, mesh: DeviceMesh | None, steps: int) -> torch.Tensor:
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net()
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 7, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])


def fsdp2(rank: int, n: int, gloo, check: Callable) -> None:
    steps = 3
    bml = fsdp2_trained(rank, None, steps)
    ref = fsdp2_trained(rank, DeviceMesh.from_group(gloo, "cpu"), steps)
    untrained = fsdp2_trained(rank, None, 0)
    err = (bml - ref).abs().max().item()
    ok = same(bml, ref) if n == 2 else bool(torch.allclose(bml, ref, rtol=1e-5, atol=1e-6))
    check("fsdp2_equals_gloo", ok and not same(bml, untrained),
          f"{'bitwise' if n == 2 else 'rtol 1e-5'}; max |diff| {err:.3g}; "
          f"moved {(bml - untrained).abs().max().item():.3g}")


def checks(rank: int, n: int, gloo, check: Callable) -> None:
    dtensor(rank, n, gloo, check)
    fsdp2(rank, n, gloo, check)


if __name__ == "__main__":
    sys.exit(run_alone("TORCH-DTENSOR", checks))
