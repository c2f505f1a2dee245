"""``ProcessGroupBmlmpi``: a Python ``torch.distributed.ProcessGroup`` over a bmlmpi Communicator.

torch calls the methods below from Python (``dist.all_reduce`` → ``allreduce``,
``dist.all_gather_into_tensor`` → ``all_gather_single``, ...) and from C++ (DDP's reducer,
``_broadcast_coalesced``, ``_verify_params_across_processes``) through ProcessGroup's Python
trampoline. Each method checks its arguments, starts the collective (non-blocking), hands the
result to the progress :class:`~bmlmpi.torch.work.Driver` and returns a
:class:`~bmlmpi.torch.work.Work`. A call torch makes with ``async_op=False`` while nothing is
in flight runs blocking in the calling thread (bmlmpi's blocking fast path for all_reduce).

Which path each collective takes:

* ``all_reduce`` (and ``allreduce_coalesced``): bmlmpi's allreduce, ``Communicator.Iallreduce``
  (the configured algorithm, topology, compression; the fault-tolerant communicator when
  asked), CPU tensors as numpy views, CUDA tensors as cupy views (bmlmpi's device path).
* ``reduce_scatter_tensor`` and ``reduce_scatter`` (list form: its inputs concatenated),
  ``all_gather_into_tensor`` and ``all_gather`` (list form: gathered into one tensor, then
  copied out), ``broadcast``, ``reduce``: bmlmpi's collective family,
  ``Communicator.Ireduce_scatter_block``, ``Iallgather``, ``Ibcast``, ``Ireduce`` (argument
  agreement, deadlines, the fault-tolerant ledger; whichever algorithm the family serves for
  that collective, ``bmlmpi.algorithms(collective)``). CUDA tensors are staged through host
  memory on this path.
* ``all_to_all_single`` (equal or uneven split sizes) and ``all_to_all`` (list form):
  ``Communicator.Ialltoallv`` (:mod:`.all_to_all`; CUDA tensors staged through host memory).
* ``barrier``: ``MPI_Ibarrier`` on the communicator bmlmpi sends on (``Communicator.comm``:
  after a failure, the survivors'), waited on with the deadline.

Errors: an unsupported op or dtype raises :class:`~bmlmpi.torch.tensors.UnsupportedCall`
before anything is sent. For all_reduce, bmlmpi's argument check agrees across ranks first
(so a rank with a bad tensor makes every rank raise); on the other collectives the check is
local, which raises on every rank when they pass the same kind of tensor, and a rank whose
peers did not join fails at the deadline, never hangs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import config
from ..call_formats import ReproducibleRefused
from ..execute import timeout_from_env
from ..ops import AVG
from ..variants import Communicator
from . import all_to_all
from .launcher import check_one_world
from .point_to_point import ReceiveWork, duplicate, start_recv, start_send
from .tensors import (
    UnsupportedCall,
    check_reducible,
    reduce_op,
    same_layout,
    view,
)
from .work import Driver, Started, Work, wait_mpi

BACKEND = "bmlmpi"


@dataclass
class Options:
    """The bmlmpi backend's options (``pg_options=`` of ``init_process_group``/``new_group``).

    ``comm``: the MPI communicator the world group runs on (default ``MPI.COMM_WORLD``; a
    sub-group takes its ranks from it). ``algorithm``, ``topology``: as
    :class:`bmlmpi.Communicator` (default ``BMLMPI_ALGORITHM``/``auto``, ``BMLMPI_BCUBE``).
    ``compression``: a compressor spec or object for every all_reduce with SUM/AVG of
    floating-point tensors (``BMLMPI_COMPRESSION``; default none). ``fault_tolerant``: run on
    bmlmpi's fault-tolerant communicator (``BMLMPI_FAULT_TOLERANT``; needs ``bmlmpi-run
    --ft``). ``recovery``, ``hang_timeout``, ``on_failure``: passed to it. ``timeout``:
    seconds a collective may go without progress (default ``BMLMPI_TIMEOUT``, 120; torch's
    own ``timeout=`` is not used, its default is 30 minutes). ``reproducible``: the
    communicator's reproducible mode (``BMLMPI_REPRODUCIBLE``; default off), so all_reduce
    (DDP's), reduce_scatter_tensor (FSDP's) and reduce of floating-point tensors with SUM or
    AVG return bits that depend on the tensors alone, whatever the algorithm
    (docs/reproducible.md); compression is refused with it.
    """

    comm: Any = None
    algorithm: str = "auto"
    topology: Any = None
    compression: Any = None
    fault_tolerant: bool | None = None
    recovery: str = "auto"
    hang_timeout: float | None = None
    on_failure: Any = None
    timeout: float | None = None
    reproducible: bool | None = None
    extra: dict = field(default_factory=dict)

    def resolved(self) -> Options:
        """These options with the environment's values where none was given."""
        out = replace(self)
        if out.comm is None:
            out.comm = MPI.COMM_WORLD
        if out.compression is None:
            out.compression = config.get("BMLMPI_COMPRESSION")
        if out.fault_tolerant is None:
            out.fault_tolerant = config.get("BMLMPI_FAULT_TOLERANT")
        out.timeout = timeout_from_env(out.timeout)
        return out


def _check_thread_level() -> None:
    level = MPI.Query_thread()
    if level < MPI.THREAD_SERIALIZED:
        raise RuntimeError(
            f"the bmlmpi backend calls MPI from a progress thread (one call at a time) and "
            f"needs MPI_THREAD_SERIALIZED or more; MPI was initialised with level {level} "
            f"(mpi4py.rc.thread_level)")


class ProcessGroupBmlmpi(dist.ProcessGroup):
    """torch.distributed's ``bmlmpi`` backend: bmlmpi's collectives behind torch's process
    group interface (module docstring: which path each collective takes).

    Fault tolerance (``Options(fault_tolerant=True)`` or ``BMLMPI_FAULT_TOLERANT=1``, under
    ``bmlmpi-run --ft``). The contract, bmlmpi's own (:mod:`bmlmpi.ft`), seen through torch:

    * ``all_reduce`` survives the death of ranks. When ranks die before or during it, every
      survivor's call completes with the reduction over exactly the survivors' inputs, the
      same on every survivor; AVG divides by the number of survivors. A call commits on every
      survivor or on none, so a DDP step whose gradient all_reduce was in flight ends with the
      step's gradient averaged over the survivors and the parameters identical on all of them.
    * Afterwards ``size()``/``rank()`` (and ``dist.get_world_size()``/``dist.get_rank()``)
      describe the survivors, ``failed`` lists the original ranks lost and
      ``Options.on_failure(communicator, lost)`` has run on every survivor (for resharding
      the data); training goes on at N−x ranks in the same job.
    * DDP must average with bmlmpi's AVG: register :func:`bmlmpi.torch.hooks.allreduce_hook`
      (or another hook of :mod:`bmlmpi.torch.hooks`). DDP's built-in reduction divides by
      the world size it read at construction and would scale the survivors' gradient by
      (N−x)/N.
    * reduce_scatter_tensor, all_gather_into_tensor, broadcast and reduce are bmlmpi's family
      calls on the same fault-tolerant communicator, with the family's failure contracts
      (:mod:`bmlmpi.ft.family`: e.g. a broadcast or reduce whose root died raises
      ``RootFailed`` on every survivor, an allgather that lost contributions raises
      ``ContributionsLost``). ``barrier`` is ``MPI_Ibarrier`` on the survivors'
      communicator: a rank dying in it makes it raise (an MPI error or
      :class:`bmlmpi.DeadlineExceeded`), never hang. Compressed all_reduce follows bmlmpi's
      compressed contract: a failure during it raises :class:`bmlmpi.FaultToleranceError` on
      every survivor.
    """

    def __init__(self, rank: int, size: int, comm: MPI.Comm, options: Options):
        super().__init__(rank, size)
        _check_thread_level()
        self.options = options
        #: the MPI communicator this group runs over (the user's; bmlmpi sends on a duplicate)
        self.mpi_comm = comm
        self._group_name = ""
        self._group_desc = ""
        self._lock = threading.RLock()
        if options.compression is not None and (
                config.get("BMLMPI_REPRODUCIBLE") if options.reproducible is None
                else options.reproducible):
            raise ReproducibleRefused("Options(compression=) with the reproducible mode: a "
                                      "compressor rounds each rank's values, so no exact sum "
                                      "is left to reproduce")
        self.communicator = Communicator(comm, algorithm=options.algorithm,
                                         topology=options.topology,
                                         timeout=options.timeout,
                                         reproducible=options.reproducible,
                                         **self._ft_arguments())
        if (self.communicator.rank, self.communicator.size) != (rank, size):
            raise RuntimeError(
                f"torch's rank {rank} of {size} is MPI rank {self.communicator.rank} of "
                f"{self.communicator.size}: pass rank and world_size from MPI (bmlmpi.torch."
                f"init_process_group does) or none at all")
        self._compressor = None
        if options.compression is not None:
            from ..compression import parse
            self._compressor = parse(options.compression)
        self._driver = Driver(self._lock, options.timeout, f"bmlmpi rank {rank}")
        #: point-to-point's own communicator (point_to_point.py: no message of torch's can
        #: match one of bmlmpi's collectives)
        self._p2p_comm = duplicate(comm, options.timeout)
        #: the works started between torch's _start_coalescing and _end_coalescing, else None
        self._coalesced: list[Work] | None = None

    def _ft_arguments(self) -> dict:
        o = self.options
        if not o.fault_tolerant:
            return {}
        return {"fault_tolerant": True, "recovery": o.recovery, "hang_timeout": o.hang_timeout,
                "on_failure": o.on_failure}

    # -- what torch asks of every process group ----------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:  # type: ignore[override]
        return BACKEND

    def size(self) -> int:
        return self.communicator.size

    def rank(self) -> int:
        return self.communicator.rank

    @property
    def failed(self) -> tuple[int, ...]:
        """The original ranks lost (fault-tolerant communicator only; else empty)."""
        return tuple(self.communicator.failed)

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        self._name_recorded_group()

    @property
    def group_desc(self) -> str:  # type: ignore[override]
        return self._group_desc

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc
        self._name_recorded_group()

    def _name_recorded_group(self) -> None:
        """The flight recorder's process group named as torch names this group (its dumps in
        PyTorch's format, ``BMLMPI_TRACE_TORCH``, line up with torch's own)."""
        recorder = self.communicator.recorder
        if recorder is not None:
            recorder.name_group(self._group_name or None, self._group_desc or None)

    def __repr__(self) -> str:
        return f"ProcessGroupBmlmpi({self.communicator!r})"

    def shutdown(self) -> None:
        """Complete what is in flight (bounded by the timeout), stop the progress thread and
        free the communicator."""
        self._driver.close(self.options.timeout)
        with self._lock:
            if not self.communicator.failed:
                self.communicator.Free()
                self._p2p_comm.Free()

    def abort(self) -> None:
        self._driver.close(0.0)

    # -- starting collectives ------------------------------------------------------------------
    def _sync(self, opts: Any) -> bool:
        """Whether to run blocking now: torch asked for a synchronous call and nothing of this
        group is in flight (so the calling thread may drive MPI directly)."""
        return getattr(opts, "asyncOp", True) is False and not self._driver.busy

    def _track(self, started: Started) -> Work:
        with self._lock:
            self._driver.add(started)
        return self._record(Work(self._driver, started))

    def _record(self, work: Work) -> Work:
        """``work``, kept for torch's coalescing manager while it coalesces."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _done(self, what: str, result: Any, finish=None) -> Work:
        s = Started(what, lambda: True, lambda: None, finish, result)
        s.poll(self.options.timeout)
        return self._track(s)

    def _mpi(self, what: str, start, result: Any, finish=None) -> Work:
        """Start an MPI non-blocking collective (``start(comm)`` returns its request)."""
        timeout = self.options.timeout
        with self._lock:
            req = start(self.communicator.comm)
            s = Started(what, req.Test, lambda: wait_mpi(req, timeout, what), finish, result,
                        keep=start)
            self._driver.add(s)
        return self._record(Work(self._driver, s))

    # -- all_reduce ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = reduce_op(opts.reduceOp if hasattr(opts, "reduceOp") else opts
                       if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            check_reducible(t, "all_reduce's tensor")
        views = [view(t) for t in tensors]
        compressed = (self._compressor is not None and (op is AVG or op == MPI.SUM)
                      and all(t.is_floating_point() and t.dtype != torch.float16
                              for t in tensors))

        def finish() -> None:
            for v in views:
                if v.finish is not None:
                    v.finish()

        what = f"bmlmpi all_reduce of {[tuple(t.shape) for t in tensors]} (rank {self.rank()})"
        if compressed:
            views = [view(t, device_path=False) for t in tensors]
        if self._sync(opts) and not compressed:
            with self._lock:
                for v in views:
                    self.communicator.Allreduce(MPI.IN_PLACE, v.array, op)
            return self._done(what, tensors, finish)
        with self._lock:
            reqs = [self._start_allreduce(v.array, op, compressed) for v in views]

        def poll() -> bool:
            return all(r.Test() for r in reqs)

        def block() -> None:
            for r in reqs:
                r.Wait()

        def mark() -> Any:
            return tuple(getattr(getattr(r, "run", None), "progress", None) for r in reqs)

        return self._track(Started(what, poll, block, finish, tensors, mark, keep=views))

    def _start_allreduce(self, arr: Any, op: Any, compressed: bool) -> Any:
        if compressed:
            return self.communicator.Iallreduce(arr, arr, op, compression=self._compressor)
        return self.communicator.Iallreduce(MPI.IN_PLACE, arr, op)

    def compressed_allreduce(self, tensor: torch.Tensor, compressor: Any, key: Any) -> Work:
        """``tensor`` averaged over the ranks through bmlmpi's compressed allreduce, with the
        error-feedback memory of ``compressor`` kept under ``key`` (the DDP compression
        hook's call; host memory, a CUDA tensor is staged)."""
        if not tensor.is_floating_point() or tensor.dtype == torch.bfloat16:
            raise UnsupportedCall(f"compressed all_reduce takes float16/32/64 tensors, not "
                                  f"{tensor.dtype}")
        if self.communicator.reproducible:
            raise ReproducibleRefused("a compression hook on a reproducible process group: a "
                                      "compressor rounds each rank's values, so no exact sum "
                                      "is left to reproduce")
        v = view(tensor, device_path=False)
        with self._lock:
            req = self.communicator.compression.start(MPI.IN_PLACE, v.array, AVG, compressor,
                                                      key=key)
        what = f"bmlmpi compressed all_reduce ({compressor.name}, rank {self.rank()})"
        return self._track(Started(what, req.Test, req.Wait, v.finish, [tensor]))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the group's lock: no call into its communicator runs meanwhile."""
        with self._lock:
            yield

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    # -- the rest of the family: bmlmpi's Ibcast, Ireduce, Iallgather, Ireduce_scatter_block --
    def _family(self, what: str, start, result: Any, views: list[Any]) -> Work:
        """Start a call of bmlmpi's collective family (``start()`` returns its request)."""
        with self._lock:
            req = start()
        return self._track(Started(what, req.Test, req.Wait, _finisher(views), result,
                                   _progress(req), keep=views))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        root = opts.rootRank
        views = [view(t, copy_only=True, device_path=False) for t in tensors]
        what = f"bmlmpi broadcast from rank {root} (rank {self.rank()})"
        c = self.communicator
        return self._family(what, lambda: _Several([c.Ibcast(v.array, root) for v in views]),
                            tensors, views)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        op = reduce_op(opts.reduceOp)
        root = opts.rootRank
        for t in tensors:
            check_reducible(t, "reduce's tensor")
        views = [view(t, device_path=False) for t in tensors]
        what = f"bmlmpi reduce to rank {root} (rank {self.rank()})"
        c = self.communicator
        at_root = self.rank() == root

        def start() -> Any:
            return _Several([c.Ireduce(MPI.IN_PLACE if at_root else v.array,
                                       v.array if at_root else None, op, root)
                             for v in views])

        return self._family(what, start, tensors, views)

    # -- allgather ------------------------------------------------------------------------------
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Work:
        n = self.size()
        if output.numel() != n * input.numel():
            raise UnsupportedCall(f"all_gather_into_tensor: the output holds {output.numel()} "
                                  f"elements, not {n} x {input.numel()}")
        same_layout([output, input], "all_gather_into_tensor")
        src = view(input, copy_only=True, device_path=False)
        out = view(output, copy_only=True, device_path=False)
        what = f"bmlmpi all_gather_into_tensor (rank {self.rank()})"
        c = self.communicator
        return self._family(what, lambda: c.Iallgather(src.array, out.array), [output],
                            [out, src])

    all_gather_single = _allgather_base

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Work:
        n = self.size()
        flats: list[torch.Tensor] = []
        for outs, t in zip(outputs, inputs, strict=True):
            if len(outs) != n or any(o.numel() != t.numel() for o in outs):
                raise UnsupportedCall(f"all_gather: need {n} output tensors of {t.numel()} "
                                      f"elements each")
            same_layout([t, *outs], "all_gather")
            flats.append(torch.empty(n * t.numel(), dtype=t.dtype))
        srcs = [view(t, copy_only=True, device_path=False) for t in inputs]
        dsts = [view(f, copy_only=True) for f in flats]
        what = f"bmlmpi all_gather (rank {self.rank()})"
        c = self.communicator

        def scatter_back() -> None:
            with torch.no_grad():
                for outs, flat in zip(outputs, flats, strict=True):
                    for o, piece in zip(outs, flat.chunk(n), strict=True):
                        o.copy_(piece.view(o.shape))

        start = lambda: _Several([c.Iallgather(s.array, d.array)  # noqa: E731
                                  for s, d in zip(srcs, dsts, strict=True)])
        return self._family(what, start, outputs,
                            [*srcs, *dsts, _Then(scatter_back)])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _Joined(works, outputs, self)

    # -- reduce-scatter -------------------------------------------------------------------------
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Work:
        op = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        n = self.size()
        if input.numel() != n * output.numel():
            raise UnsupportedCall(f"reduce_scatter_tensor: the input holds {input.numel()} "
                                  f"elements, not {n} x {output.numel()}")
        same_layout([output, input], "reduce_scatter_tensor")
        check_reducible(input, "reduce_scatter_tensor's input")
        src = view(input, device_path=False)
        out = view(output, device_path=False)
        what = f"bmlmpi reduce_scatter_tensor (rank {self.rank()})"
        c = self.communicator
        return self._family(what, lambda: c.Ireduce_scatter_block(src.array, out.array, op),
                            [output], [out, src])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Work:
        works = []
        for out, ins in zip(outputs, inputs, strict=True):
            if len(ins) != self.size():
                raise UnsupportedCall(f"reduce_scatter: need {self.size()} input tensors")
            works.append(self._reduce_scatter_base(out, torch.cat([i.reshape(-1)
                                                                   for i in ins]), opts))
        return _Joined(works, outputs, self)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        works = [self._reduce_scatter_base(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return _Joined(works, outputs, self)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """torch's coalescing manager's name for :meth:`allgather_into_tensor_coalesced`."""
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """torch's coalescing manager's name for :meth:`reduce_scatter_tensor_coalesced`."""
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """``all_gather_coalesced``: ``outputs[r][i]`` receives rank r's ``inputs[i]``, the
        inputs gathered as one concatenated array by bmlmpi's allgather."""
        n = self.size()
        sizes = [t.numel() for t in inputs]
        if len(outputs) != n or any(len(outs) != len(inputs) or
                                    any(o.numel() != k for o, k in zip(outs, sizes, strict=True))
                                    for outs in outputs):
            raise UnsupportedCall(f"all_gather_coalesced: need {n} output lists of "
                                  f"{len(inputs)} tensors of {sizes} elements")
        same_layout([*inputs, *(o for outs in outputs for o in outs)], "all_gather_coalesced")
        dtype = inputs[0].dtype if inputs else torch.float32
        flat_in = torch.cat([t.detach().reshape(-1).cpu() for t in inputs]) if inputs \
            else torch.empty(0, dtype=dtype)
        total = flat_in.numel()
        flat_out = torch.empty(n * total, dtype=dtype)
        src, dst = view(flat_in, copy_only=True), view(flat_out, copy_only=True)
        what = f"bmlmpi all_gather_coalesced (rank {self.rank()})"
        c = self.communicator

        def copy_out() -> None:
            with torch.no_grad():
                for r, outs in enumerate(outputs):
                    at = r * total
                    for o in outs:
                        o.copy_(flat_out[at:at + o.numel()].view(o.shape))
                        at += o.numel()

        return self._family(what, lambda: c.Iallgather(src.array, dst.array), outputs,
                            [src, dst, _Then(copy_out)])

    # -- gather and scatter: MPI's, on the communicator bmlmpi sends on ------------------------
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> Work:
        """``gather``: ``MPI_Igather`` into one array at the root, copied out into its list."""
        root, n = opts.rootRank, self.size()
        if len(inputs) != 1:
            raise UnsupportedCall(f"gather takes one input tensor, not {len(inputs)}")
        t = inputs[0]
        at_root = self.rank() == root
        if at_root and (len(outputs) != 1 or len(outputs[0]) != n
                        or any(o.numel() != t.numel() for o in outputs[0])):
            raise UnsupportedCall(f"gather: the root needs {n} output tensors of {t.numel()} "
                                  f"elements")
        if at_root:
            same_layout([t, *outputs[0]], "gather")
        src = view(t, copy_only=True, device_path=False)
        flat = torch.empty(n * t.numel() if at_root else 0, dtype=t.dtype)
        dst = view(flat, copy_only=True)
        what = f"bmlmpi gather to rank {root} (rank {self.rank()})"

        def copy_out() -> None:
            if at_root:
                with torch.no_grad():
                    for o, piece in zip(outputs[0], flat.view(n, t.numel()), strict=True):
                        o.copy_(piece.view(o.shape))

        return self._mpi(what, lambda comm: comm.Igather(src.array, dst.array if at_root
                                                         else None, root),
                         outputs, copy_out)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> Work:
        """``scatter``: the root's list concatenated into one array, ``MPI_Iscatter``."""
        root, n = opts.rootRank, self.size()
        if len(outputs) != 1:
            raise UnsupportedCall(f"scatter takes one output tensor, not {len(outputs)}")
        t = outputs[0]
        at_root = self.rank() == root
        if at_root and (len(inputs) != 1 or len(inputs[0]) != n
                        or any(i.numel() != t.numel() for i in inputs[0])):
            raise UnsupportedCall(f"scatter: the root needs {n} input tensors of {t.numel()} "
                                  f"elements")
        if at_root:
            same_layout([t, *inputs[0]], "scatter")
            flat = torch.cat([i.detach().reshape(-1).cpu() for i in inputs[0]])
        else:
            flat = torch.empty(0, dtype=t.dtype)
        src = view(flat, copy_only=True)
        out = view(t, copy_only=True, device_path=False)
        what = f"bmlmpi scatter from rank {root} (rank {self.rank()})"
        return self._mpi(what, lambda comm: comm.Iscatter(src.array if at_root else None,
                                                          out.array, root),
                         outputs, out.finish)

    # -- all-to-all: bmlmpi's Ialltoallv (all_to_all.py) ---------------------------------------
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Work:
        with self._lock:
            ex = all_to_all.single(self.communicator, output, input, output_split_sizes,
                                   input_split_sizes)
        return self._family(f"bmlmpi all_to_all_single (rank {self.rank()})", ex.start,
                            [output], ex.views)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Work:
        with self._lock:
            ex = all_to_all.listed(self.communicator, outputs, inputs)
        return self._family(f"bmlmpi all_to_all (rank {self.rank()})", ex.start, outputs,
                            ex.views)

    # -- point-to-point (point_to_point.py) -----------------------------------------------------
    def _p2p(self, what: str) -> MPI.Comm:
        if self.communicator.failed:
            raise UnsupportedCall(f"{what} after a failure: the survivors' ranks were "
                                  f"renumbered, and point-to-point runs on the group as made")
        return self._p2p_comm

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        comm = self._p2p("send")
        with self._lock:
            s = start_send(comm, tensors, dst, tag, self.rank(), self.options.timeout)
            self._driver.add(s)
        return self._record(Work(self._driver, s))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        return self._receive(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        return self._receive(tensors, MPI.ANY_SOURCE, tag)

    def _receive(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        comm = self._p2p("recv")
        with self._lock:
            s, status = start_recv(comm, tensors, src, tag, self.rank(), self.options.timeout)
            self._driver.add(s)
        return self._record(ReceiveWork(self._driver, s, status))

    # -- torch's coalescing manager with a device: one work for the calls in between -----------
    def _start_coalescing(self, device: Any = None) -> None:
        if self._coalesced is not None:
            raise RuntimeError("bmlmpi: _start_coalescing while coalescing already")
        self._coalesced = []

    def _end_coalescing(self, device: Any = None) -> Work:
        works, self._coalesced = self._coalesced or [], None
        return _Joined(works, [], self)

    # -- barrier --------------------------------------------------------------------------------
    def barrier(self, opts: Any = None) -> Work:
        return self._mpi(f"bmlmpi barrier (rank {self.rank()})", lambda comm: comm.Ibarrier(),
                         [])


class _All:
    """Several MPI requests seen as one (Test: all complete)."""

    def __init__(self, reqs: list[Any]):
        self.reqs = reqs

    def Test(self) -> bool:
        return all(r.Test() for r in self.reqs)


class _Several:
    """Several bmlmpi requests seen as one (Test, Wait, the run's progress)."""

    def __init__(self, reqs: list[Any]):
        self.reqs = reqs

    def Test(self) -> bool:
        return all(r.Test() for r in self.reqs)

    def Wait(self) -> None:
        for r in self.reqs:
            r.Wait()

    @property
    def progress(self) -> Any:
        return tuple(_progress(r)() for r in self.reqs)


class _Then:
    """A step after a call completes, run with the views' write-backs (in order)."""

    def __init__(self, fn):
        self.finish = fn


def _progress(req: Any):
    """The progress mark of a bmlmpi request: its run's completed steps."""
    if isinstance(req, _Several):
        return lambda: req.progress
    return lambda: getattr(getattr(req, "run", None), "progress", None)


def _finisher(views: list[Any]):
    def finish() -> None:
        for v in views:
            if v.finish is not None:
                v.finish()
    return finish


class _Joined(Work):
    """Several collectives waited on as one Work (the coalesced and list forms)."""

    def __init__(self, works: list[Work], result: Any, pg: ProcessGroupBmlmpi):
        s = Started("bmlmpi coalesced collectives", lambda: all(w.is_completed() for w in works),
                    lambda: [w.wait() for w in works] and None, None, result)
        s.poll(pg.options.timeout)
        with pg._lock:
            pg._driver.add(s)
        super().__init__(pg._driver, s)
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait()
        return super().wait(timeout)


# -- creating the group (torch calls this through Backend.register_backend) --------------------
_world_options: Options | None = None


def create(dist_options: Any, pg_options: Options | None) -> ProcessGroupBmlmpi:
    """The creator torch calls for ``init_process_group``/``new_group`` with backend bmlmpi
    (the extended API: ``dist_options`` carries the group's global ranks)."""
    global _world_options
    check_one_world()
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options of the bmlmpi backend must be bmlmpi.torch.Options, got "
                        f"{type(pg_options).__name__}")
    options = (pg_options or _world_options or Options()).resolved()
    ranks = list(dist_options.global_ranks_in_group or [])
    parent = options.comm
    if not ranks:                       # the default group
        _world_options = options
        comm = parent
    elif ranks == list(range(parent.Get_size())):
        comm = parent
    else:                               # collective over the group's members only
        comm = parent.Create_group(parent.Get_group().Incl(ranks))
    return ProcessGroupBmlmpi(dist_options.group_rank, dist_options.group_size, comm, options)


__all__ = ["BACKEND", "Options", "ProcessGroupBmlmpi", "create"]
