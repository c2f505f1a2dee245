"""Rank program of the CUDA check of the torch backend: CUDA tensors through backend
``bmlmpi`` (all_reduce on bmlmpi's device path through cupy; the other collectives staged
through host memory) against the same reduction computed on the host, then DDP on a CUDA
model against DDP on a CPU copy of it. Run by ``tests/gpu/test_torch_cuda.py`` where a GPU,
torch with CUDA and cupy exist; prints ``CHECK <name> PASS|FAIL`` lines and ``CUDA-RANKS DONE``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import bmlmpi.torch

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        FAILED.append(name)
    print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}".rstrip(), flush=True)


def main() -> int:
    bmlmpi.torch.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    R = dist.ReduceOp
    ring = dist.new_group(backend="bmlmpi", pg_options=bmlmpi.torch.Options(algorithm="ring"))
    for count in (1, 1000, 1 << 20):
        for dt in (torch.float32, torch.float64, torch.int64):
            host = [((torch.arange(count) * 7 + r * 13) % 11 - 3).to(dt) for r in range(n)]
            for op, fold in ((R.SUM, lambda a, b: a + b), (R.MAX, torch.maximum),
                             (R.MIN, torch.minimum)):
                want = host[0].clone()
                for h in host[1:]:
                    want = fold(want, h)
                t = host[rank].to(dev)
                dist.all_reduce(t, op=op)
                check(f"cuda_all_reduce[{count},{dt},{op}]", torch.equal(t.cpu(), want))
            t = host[rank].to(dev)
            w = dist.all_reduce(t, async_op=True)
            w.wait()
            check(f"cuda_all_reduce_async[{count},{dt}]",
                  torch.equal(t.cpu(), sum(host[1:], host[0].clone())))
        # float16 on the ring: an MPI without float16 reductions (Open MPI 4) refuses it on
        # the native path that auto picks for small counts
        h = [((torch.arange(count) * 7 + r * 13) % 11 - 3).to(torch.float16) for r in range(n)]
        t = h[rank].to(dev)
        dist.all_reduce(t, group=ring)
        check(f"cuda_all_reduce_ring[{count},float16]", torch.equal(t.cpu(), sum(h[1:], h[0])))
        x = torch.arange(count, dtype=torch.float32, device=dev) + 100 * rank
        out = torch.empty(count * n, dtype=torch.float32, device=dev)
        dist.all_gather_into_tensor(out, x)
        want = torch.cat([torch.arange(count, dtype=torch.float32) + 100 * r for r in range(n)])
        check(f"cuda_all_gather[{count}]", torch.equal(out.cpu(), want))
        b = x.clone()
        dist.broadcast(b, src=n - 1)
        check(f"cuda_broadcast[{count}]", torch.equal(
            b.cpu(), torch.arange(count, dtype=torch.float32) + 100 * (n - 1)))
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4))
    gpu_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)).to(dev)
    gpu_model.load_state_dict(cpu_model.state_dict())
    results = []
    for model, where in ((cpu_model, "cpu"), (gpu_model, dev)):
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x.to(where)), y.to(where)).backward()
            opt.step()
        results.append(torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]))
    err = (results[0] - results[1]).abs().max().item()
    check("cuda_ddp_equals_cpu_ddp", torch.allclose(results[0], results[1], atol=1e-5),
          f"max |diff| {err:.3g}")
    dist.destroy_process_group()
    print(f"CUDA-RANKS DONE failed {len(FAILED)} {FAILED[:5]}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
