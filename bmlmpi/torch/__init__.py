"""PyTorch on bmlmpi: the ``torch.distributed`` backend ``bmlmpi``, DDP comm hooks.

    import bmlmpi.torch                      # registers the backend "bmlmpi"
    bmlmpi.torch.init_process_group()        # rank and world size from MPI, no MASTER_ADDR
    # or: torch.distributed.init_process_group("bmlmpi", init_method="bmlmpi://")
    model = torch.nn.parallel.DistributedDataParallel(model)

Rendezvous. torch 2.13 makes every backend but its built-in ``mpi`` rendezvous through a store
(``init_method`` defaults to ``env://``, which reads RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT). The bmlmpi backend itself needs no store: rank and size come from MPI. So that
torch (and a gloo group made beside it with ``new_group(backend="gloo")``) still has a working
one, :func:`init_process_group` and the ``bmlmpi://`` init method make it from MPI: rank 0
starts a ``TCPStore`` on a free port (on 127.0.0.1 when every rank shares its node, else on
its host name) and broadcasts the address with MPI. The environment is read only to refuse a
worker that torchrun started on its own (:mod:`.launcher`: N one-rank MPI worlds, never one
job). ``dist.init_process_group("bmlmpi")`` with no ``init_method``/``store`` still goes
through torch's ``env://`` and needs those variables, which ``bmlmpi-run`` exports.

Modules: :mod:`.process_group` (the process group, its options and the fault-tolerance
contract), :mod:`.launcher` (torchrun's lone workers refused), :mod:`.work` (work objects,
the progress thread), :mod:`.tensors` (tensor views, op and dtype mapping), :mod:`.hooks`
(DDP comm hooks: bmlmpi's compressors and bucket plans).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.rendezvous import register_rendezvous_handler

from ..execute import timeout_from_env
from .launcher import SeparateWorlds, check_one_world
from .process_group import BACKEND, Options, ProcessGroupBmlmpi, create
from .tensors import UnsupportedCall
from .work import Work

STORE_SCHEME = "bmlmpi"


def store_from_mpi(comm: MPI.Comm = MPI.COMM_WORLD, timeout: float | None = None,
                   host: str | None = None) -> dist.Store:
    """A ``TCPStore`` shared by the ranks of ``comm``, found through MPI (no environment):
    rank 0 serves it on a port the system picks and broadcasts host and port.

    ``host``: the address rank 0 serves it on, which every rank must reach (default:
    127.0.0.1 when MPI puts every rank on rank 0's node, else rank 0's host name). Give it
    where ranks that MPI sees on one node do not share its network (a container or network
    namespace each: the emulated testbed of ``perf/testbed``).

    A worker that torchrun started on its own (an MPI world of one rank where ``WORLD_SIZE``
    says more) is refused with :class:`SeparateWorlds` (:func:`~.launcher.check_one_world`):
    its store would make it a one-rank job."""
    check_one_world()
    seconds = timeout_from_env(timeout)
    from ..execute import wait_request
    # Split_type blocks without a deadline: every rank meets first in a bounded barrier
    wait_request(comm.Ibarrier(), seconds,
                 "bmlmpi.torch: not every rank came to find the store")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == comm.Get_size()
    node.Free()
    size, rank = comm.Get_size(), comm.Get_rank()
    address = np.zeros(256, dtype=np.uint8)
    store = None
    if rank == 0:
        if host is None:
            host = "127.0.0.1" if one_node else socket.gethostname()
        store = dist.TCPStore(host, 0, size, True, timeout=timedelta(seconds=seconds),
                              wait_for_workers=False)
        text = f"{host} {store.port}".encode()
        address[:len(text)] = np.frombuffer(text, dtype=np.uint8)
    wait_request(comm.Ibcast(address, root=0), seconds,
                 "bmlmpi.torch: rank 0's store address did not arrive")
    if store is None:
        host, port = bytes(address).rstrip(b"\0").decode().split()
        store = dist.TCPStore(host, int(port), size, False, timeout=timedelta(seconds=seconds))
    return store


def _rendezvous_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any):
    """``init_method="bmlmpi://"``: rank and world size from MPI_COMM_WORLD, the store from
    :func:`store_from_mpi`. A rank or world size torch passes must agree with MPI's."""
    comm = MPI.COMM_WORLD
    query = dict(p.split("=", 1) for p in urlparse(url).query.split("&") if "=" in p)
    for key, mine in (("rank", comm.Get_rank()), ("world_size", comm.Get_size())):
        if key in query and int(query[key]) not in (-1, mine):
            raise ValueError(f"init_method bmlmpi://: {key}={query[key]} differs from MPI's "
                             f"{mine}")
    yield store_from_mpi(comm), comm.Get_rank(), comm.Get_size()
    raise RuntimeError("bmlmpi:// cannot rendezvous again")


def init_process_group(comm: MPI.Comm | None = None, options: Options | None = None,
                       store_host: str | None = None, **kwargs: Any) -> ProcessGroupBmlmpi:
    """``torch.distributed.init_process_group("bmlmpi", ...)`` with rank and world size from
    MPI and a store made through MPI (module docstring); returns the process group.

    ``comm``: the MPI communicator (default ``MPI.COMM_WORLD``); ``options``: the backend's
    :class:`Options` (``pg_options``); ``store_host``: the address rank 0 serves the store on
    (:func:`store_from_mpi`'s ``host``); the other keywords go to torch (``timeout``,
    ``device_id``, ...)."""
    options = options or Options()
    if comm is not None:
        options.comm = comm
    comm = options.comm or MPI.COMM_WORLD
    for key in ("backend", "rank", "world_size", "store", "init_method"):
        if key in kwargs:
            raise TypeError(f"bmlmpi.torch.init_process_group takes {key} from MPI")
    store = store_from_mpi(comm, options.timeout, host=store_host)
    dist.init_process_group(BACKEND, store=store, rank=comm.Get_rank(),
                            world_size=comm.Get_size(), pg_options=options, **kwargs)
    return dist.group.WORLD


def _register() -> None:
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, create, extended_api=True,
                                      devices=["cpu", "cuda"])
    try:
        register_rendezvous_handler(STORE_SCHEME, _rendezvous_handler)
    except RuntimeError:
        pass  # registered by an earlier import of this module (a reload)


_register()

__all__ = ["BACKEND", "Options", "ProcessGroupBmlmpi", "SeparateWorlds", "UnsupportedCall",
           "Work", "init_process_group", "store_from_mpi"]
