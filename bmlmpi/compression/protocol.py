"""The compressor protocol: what a compressor is to the compressed allreduce, and the spec
names that build one from text.

A compressor is one class (a subclass of :class:`Compressor`). Per call on one registered
array (its ``key``) it decides which elements this rank drops (:meth:`Compressor.select`),
whether the kept ones travel in a 16-bit wire format (``wire``, a name registered in
:mod:`bmlmpi.kernels.wire_formats`), and it declares what every rank must agree on
(:meth:`Compressor.settings`: the compressed allreduce's one agreement compares a hash of the
class, the wire format, the exchange path, whether it can drop anything, and these settings,
and refuses a mismatch on every rank). The first four decide which exchange every rank
enters, so they are always agreed; a compressor adds the settings it takes to be one choice
for the whole job (top-k's k), not what may differ per rank (TDF's thresholds). The base
class holds what every compressor shares, in this order per call:

1. y = g + r: the new input plus what this array kept at the previous call (error feedback);
   ``t`` counts the calls on the array.
2. ``select(key, y, t)``: the dropped mask (None: nothing dropped).
3. The kept values rounded to the wire format with a scale every rank agrees on
   (:mod:`.wire`); sent = what the receivers decode (0 where dropped).
4. r ← y − sent: the dropped values and the rounded-away parts, added at the next call; y =
   sent + r holds exactly (the rounding error of a float32 rounded to 16 bits is itself a
   float32, and dropped elements keep y whole).

Spec strings (:func:`parse`): a class registered with :func:`register` under its
``spec_names`` builds itself from ``NAME[:ARG...]`` (:meth:`Compressor.from_spec`); any spec
may end with ``@sparse``, ``@dense`` or ``@auto`` to pin the exchange.

Cost: a few passes over the array per call (numpy); memory: one residual per registered
array. Source: error feedback as in PyTorch's PowerSGD hook, GRACE (Xu et al., "GRACE: A
Compressed Communication Framework for Distributed Machine Learning") and Horovod's
``Compression`` classes for the shape of a compressor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .wire import accumulation_dtype, check_wire, decode, encode, scale

PATHS = ("auto", "sparse", "dense")


@dataclass
class Step:
    """One call's outcome on one rank: y = sent + kept (float arrays of the accumulation dtype)."""

    t: int
    y: np.ndarray
    dropped: np.ndarray | None   # bool mask, None when nothing is dropped
    scale: float = 1.0
    sent: np.ndarray | None = None
    codes: np.ndarray | None = None   # the scaled values as 16-bit wire codes (uint16)


class Compressor:
    """A compressor and its error-feedback memory (one residual per registered array key).

    ``name``: how errors and statistics name it. ``wire``: a registered wire format
    (``"fp16"``, ``"bf16"``) or None (the array's dtype). ``path``: ``"auto"`` (sparse where
    the cost model prices it cheaper), ``"sparse"`` or ``"dense"``. ``record``: keep each
    call's (key, y, sent, kept) in ``history`` (for tests).
    """

    #: the spec names :func:`parse` knows this class by (none: not built from text)
    spec_names: ClassVar[tuple[str, ...]] = ()
    #: the specs' forms, for parse's error message
    spec_form: ClassVar[str] = ""

    def __init__(self, name: str, wire: str | None = None, path: str = "auto",
                 record: bool = False):
        self.name = name
        self.wire = check_wire(wire)
        if path not in PATHS:
            raise ValueError(f"path must be 'auto', 'sparse' or 'dense', got {path!r}")
        self.path = path
        self.record = record
        self.residuals: dict[Any, np.ndarray] = {}
        self.iterations: dict[Any, int] = {}
        self.history: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = []
        #: bytes this rank sent and calls made, per path ("plain", "dense", "wire", "sparse")
        self.bytes_sent: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        #: elements seen and dropped on this rank, over all calls
        self.elements = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # -- what a compressor declares --------------------------------------------------------
    @property
    def filters(self) -> bool:
        """Whether any element can ever be dropped (then the sparse exchange is an option)."""
        return False

    @property
    def identity(self) -> bool:
        """Nothing dropped and the array's own dtype on the wire: the plain allreduce."""
        return not self.filters and self.wire is None

    def select(self, key: Any, y: np.ndarray, t: int) -> np.ndarray | None:
        """The elements of ``y`` this rank drops at call ``t`` ≥ 1 on the array ``key`` (a
        bool mask), or None for none."""
        return None

    def settings(self) -> tuple:
        """What every rank must agree on besides the class, wire format, path and
        :attr:`filters` (numbers and strings)."""
        return ()

    def agreement(self) -> tuple:
        """Everything the ranks must agree on, as one tuple."""
        return (type(self).__name__, self.wire, self.path, self.filters, *self.settings())

    def agreement_code(self) -> int:
        """:meth:`agreement` as a 52-bit number (exact in a float64 agreement)."""
        digest = hashlib.blake2b(repr(self.agreement()).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 12

    @classmethod
    def from_spec(cls, name: str, args: list[str]) -> Compressor:
        """Build from a spec: its ``name`` (one of ``spec_names``) and arguments (the text
        after ``NAME:``, split at ``:``)."""
        raise ValueError(f"{cls.__name__} is not built from a spec")

    # -- the shared steps (module docstring) -----------------------------------------------
    def begin(self, key: Any, x: np.ndarray) -> Step:
        """Steps 1-2 for this call on the array ``key``: y and the dropped mask."""
        acc = accumulation_dtype(x.dtype)
        t = self.iterations.get(key, 0) + 1
        self.iterations[key] = t
        y = np.array(x, dtype=acc, copy=True).reshape(-1)
        r = self.residuals.get(key)
        if r is not None:
            if r.shape != y.shape:
                raise ValueError(f"compressed array {key!r} changed size from {r.size} to "
                                 f"{y.size} elements")
            y += r
        dropped = self.select(key, y, t)
        if dropped is not None:
            self.dropped += int(dropped.sum())
        self.elements += y.size
        return Step(t, y, dropped)

    def local_maxabs(self, step: Step) -> float:
        """max |y_j| over the kept elements (what the wire scale is agreed from)."""
        kept = step.y if step.dropped is None else step.y[~step.dropped]
        return float(np.max(np.abs(kept))) if kept.size else 0.0

    def finish(self, key: Any, step: Step, maxabs: float, size: int,
               kept_at: np.ndarray | None = None) -> np.ndarray:
        """Steps 3-4 given the agreed max |y| over all ranks: the scaled values to send
        (``sent·s``, zeros where dropped; with a wire format also kept as 16-bit codes in
        ``step.codes``); the residual is updated. ``kept_at``: the kept indices, when only
        they travel (the sparse exchange): ``step.codes`` then holds their codes alone (the
        same codes, elementwise, without scaling and coding the dropped zeros)."""
        v = step.y.copy()
        if step.dropped is not None:
            v[step.dropped] = 0
        s = 1.0
        if self.wire is not None:
            s = scale(self.wire, maxabs, size)
            if kept_at is None:
                v *= v.dtype.type(s)
                step.codes = encode(self.wire, v)
                v = decode(self.wire, step.codes, v.dtype)
            else:
                step.codes = encode(self.wire, v[kept_at] * v.dtype.type(s))
                v[kept_at] = decode(self.wire, step.codes, v.dtype)
        sent = v / v.dtype.type(s) if s != 1.0 else v.copy()
        step.scale, step.sent = s, sent
        kept = step.y - sent
        self.residuals[key] = kept
        if self.record:
            self.history.append((key, step.y.copy(), sent.copy(), kept.copy()))
        return v

    def count(self, path: str, nbytes: int) -> None:
        self.bytes_sent[path] = self.bytes_sent.get(path, 0) + int(nbytes)
        self.calls[path] = self.calls.get(path, 0) + 1

    def regroup(self, old: list[tuple[int, ...]], new: list[tuple[int, ...]],
                sizes: list[int]) -> None:
        """Move residuals kept per group of registered arrays (keys: tuples of array indices)
        to a new grouping: a bucket plan that changed keeps every array's residual."""
        pieces: dict[int, np.ndarray] = {}
        ts: dict[int, int] = {}
        for key in old:
            r = self.residuals.pop(key, None)
            t = self.iterations.pop(key, 0)
            off = 0
            for i in key:
                if r is not None:
                    pieces[i] = r[off:off + sizes[i]]
                ts[i] = t
                off += sizes[i]
        for key in new:
            if all(i in pieces for i in key):
                self.residuals[key] = np.concatenate([pieces[i] for i in key])
            self.iterations[key] = max((ts.get(i, 0) for i in key), default=0)


_SPECS: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Make ``cls`` known to :func:`parse` under its ``spec_names`` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Compressor)) or not cls.spec_names:
        raise TypeError("register takes a Compressor subclass with spec_names")
    for name in cls.spec_names:
        if name in _SPECS or name == "none":
            raise ValueError(f"compressor spec name {name!r} is taken")
    for name in cls.spec_names:
        _SPECS[name] = cls
    return cls


def parse(spec: str | Compressor | None) -> Compressor | None:
    """A compressor from a spec string ``NAME[:ARG...]`` (``none``: None; the registered
    names, e.g. ``fp16``, ``bf16``, ``threshold:PHI[:D]``, ``random:P[:SEED]``,
    ``tdf:PHI:D:P[:WIRE]``, ``topk:K[:WIRE]``), optionally followed by ``@sparse``, ``@dense``
    or ``@auto`` to pin the exchange (the default, ``auto``, asks the cost model); a
    :class:`Compressor` or None as it is."""
    if spec is None or isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"compression must be a string or a bmlmpi.compression.Compressor, got "
                        f"{type(spec).__name__}")
    if "@" in spec:
        # the exchange pinned: the cost model's choice overruled (a measurement, or its
        # α-β model, may misjudge a machine)
        base, path = spec.rsplit("@", 1)
        c = parse(base)
        if c is None or path not in PATHS:
            raise ValueError(f"bad compression spec {spec!r}: SPEC@PATH takes a compressor "
                             f"and a path auto, sparse or dense")
        c.path = path
        c.name = f"{c.name}@{path}"
        return c
    name, *args = spec.strip().split(":")
    if name == "none" and not args:
        return None
    cls = _SPECS.get(name)
    if cls is not None:
        try:
            return cls.from_spec(name, args)
        except ValueError as exc:
            raise ValueError(f"bad compression spec {spec!r}: {exc}") from None
    forms = ", ".join(["none", *dict.fromkeys(c.spec_form for c in _SPECS.values())])
    raise ValueError(f"bad compression spec {spec!r}; use one of {forms}, optionally followed "
                     f"by @sparse, @dense or @auto")


__all__ = ["PATHS", "Compressor", "Step", "parse", "register"]
