"""The operator catalogue: one entry per op the NPU runs, from which every per-op table derives.

An entry says everything the EP knows about one ONNX op type:

- **support**: the opset range, the dtypes, the inputs that must be constant and an optional
  ``check`` for attribute and shape constraints (:class:`OpSupport`, read by
  :mod:`ep.npusim.capability`);
- **kernel**: the name of the :mod:`npu_sim.kernels` kernel a launch of it runs, which is also
  the name :func:`npu_sim.cost.op_cost` prices it under (``None`` for an op that never
  launches because the compiler always folds it);
- **lowering**: :class:`Lowering` -- one launch, a view of its input, or folded at compile time;
- **tiling**: :class:`Tiling` -- a GEMM, a convolution (as im2col, weights at ``weight_input``)
  or a run of elements on the vector unit;
- **fusion** and **opset dependence**: whether the compiler folds it into the array op that
  produces its input (:class:`Fusion`), and whether its kernel needs the model's opset.

An op is declared once, by a class registered explicitly in the module of its family under
``ep/npusim/ops/`` (mirroring ``npu_sim/kernels/``)::

    @register("LRN", since=1)
    class LRN(Op):
        @staticmethod
        def check(graph, i):
            ...

Class attributes override the defaults of :class:`Op`; one class may register several op
types that share every rule (``@register("Add", "Sub", "Mul", "Div", since=7)``). Registering
checks that the kernel exists in :mod:`npu_sim.kernels` and has a price (a cycles function of
its own or an :func:`npu_sim.cost.op_cost` model), so an entry without either fails at import.
The compiler's and capability's tables are views of :func:`entries`.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npu_sim import cost as npu_cost
from npu_sim import kernels as npu_kernels
from npu_sim.config import DeviceConfig
from npu_sim.dtypes import TensorSpec

if TYPE_CHECKING:
    from ep.framework.graph import GraphView

MAX_OPSET = 23
"""Newest default-domain opset the NPU's op implementations are validated against."""

FLOATS = ("float32", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
NUMERIC = FLOATS + INTS
BOOL = ("bool",)
ALL = NUMERIC + BOOL
"""Every dtype: what data movement (Reshape, Gather, Concat...) and Where/Cast accept."""

Check = Callable[["GraphView", int], "str | None"]


class CatalogueError(ValueError):
    """An entry contradicts itself or the device: no kernel, no price, registered twice."""


class Lowering(enum.Enum):
    """What the compiler makes of a node of the op."""

    LAUNCH = "launch"
    """One kernel launch, attributes passed as plain data."""
    VIEW = "view"
    """Same bytes as its input: the output aliases the input's storage, no launch."""
    FOLD = "fold"
    """Always constant: evaluated at compile time into a weight, never launched."""


class Tiling(enum.Enum):
    """How a launch of the op is tiled into SRAM (:mod:`ep.npusim.compiler.tiling`)."""

    GEMM = "gemm"
    """``(m, n, k)`` tiles of a matrix product: A's rows by B's columns over K."""
    CONV = "conv"
    """A convolution as im2col: a GEMM per group, weights at the entry's ``weight_input``."""
    VECTOR = "vector"
    """A run of elements through the vector unit, every operand double-buffered."""


class Fusion(enum.Enum):
    """The op's part in activation fusion (:func:`ep.npusim.compiler.rewrite.fuse_activations`)."""

    NONE = "none"
    HOST = "host"
    """An array op whose kernel applies a fused ``activation`` to its output."""
    ACTIVATION = "activation"
    """An activation the compiler folds into the host op producing its input."""


@dataclass(frozen=True)
class OpSupport:
    """What the NPU supports of one op.

    ``since_opset``..``until_opset`` bound the model's opset for ``domain``; ``dtypes`` are
    allowed for the inputs listed in ``typed_inputs`` and for output 0; ``const_inputs``
    (index, name) must be initializers or ``Constant`` outputs when present; ``check`` returns
    a reason for any further constraint it rejects.
    """

    since_opset: int
    until_opset: int = MAX_OPSET
    dtypes: tuple[str, ...] = FLOATS
    output_dtypes: tuple[str, ...] | None = None
    """Allowed dtypes of output 0 when they differ from the inputs' (a comparison's bool)."""
    check: Check | None = None
    typed_inputs: tuple[int, ...] = (0,)
    const_inputs: tuple[tuple[int, str], ...] = ()
    domain: str = ""


@dataclass(frozen=True)
class OpEntry:
    """One op of the catalogue (see the module docstring for each part)."""

    op_type: str
    support: OpSupport
    kernel: str | None
    lowering: Lowering
    tiling: Tiling
    weight_input: int
    fusion: Fusion
    opset_dependent: bool


class Op:
    """The defaults an op's class overrides: a float op launched as one vector-unit kernel."""

    until: int = MAX_OPSET
    dtypes: tuple[str, ...] = FLOATS
    output_dtypes: tuple[str, ...] | None = None
    typed_inputs: tuple[int, ...] = (0,)
    const_inputs: tuple[tuple[int, str], ...] = ()
    lowering: Lowering = Lowering.LAUNCH
    tiling: Tiling = Tiling.VECTOR
    weight_input: int = 1
    fusion: Fusion = Fusion.NONE
    opset_dependent: bool = False
    """The kernel's result depends on the opset's definition: it receives ``_opset``."""
    check: Check | None = None
    """``check(graph, i)``: a reason to decline node ``i``, or None (a static method, or a
    shared rule assigned as ``check = spatial``)."""


_CATALOGUE: dict[str, OpEntry] = {}
_EDITS = [0]
"""How many times the catalogue changed (entries are frozen: only :func:`add` and
:func:`remove` change it, under ``_EDITING``); an :class:`OpsWhere` recomputes its members when
this moves."""
_EDITING = threading.Lock()


def register(*op_types: str, since: int) -> Callable[[type[Op]], type[Op]]:
    """Class decorator: register ``op_types`` from opset ``since`` with the class's rules."""

    def wrap(cls: type[Op]) -> type[Op]:
        for op_type in op_types:
            add(_entry(op_type, since, cls))
        return cls

    return wrap


def _entry(op_type: str, since: int, cls: type[Op]) -> OpEntry:
    support = OpSupport(since, cls.until, cls.dtypes, cls.output_dtypes, cls.check,
                        cls.typed_inputs, cls.const_inputs)
    kernel = None if cls.lowering is Lowering.FOLD else op_type
    return OpEntry(op_type, support, kernel, cls.lowering, cls.tiling, cls.weight_input,
                   cls.fusion, cls.opset_dependent)


def add(entry: OpEntry) -> OpEntry:
    """Add ``entry`` after checking it against the device's kernels and cost model."""
    if entry.op_type in _CATALOGUE:
        raise CatalogueError(f"{entry.op_type}: already in the operator catalogue")
    if entry.kernel is None and entry.lowering is not Lowering.FOLD:
        raise CatalogueError(f"{entry.op_type}: no kernel; only a {Lowering.FOLD.value!r} op "
                             "may have none")
    if entry.kernel is not None:
        if entry.kernel not in npu_kernels.names():
            raise CatalogueError(f"{entry.op_type}: no kernel {entry.kernel!r} in npu_sim."
                                 "kernels; add one (docs/adding_an_op.md)")
        if not priced(entry.kernel):
            raise CatalogueError(f"{entry.op_type}: kernel {entry.kernel!r} has no price: no "
                                 "cycles function and no npu_sim.cost model")
    with _EDITING:
        _CATALOGUE[entry.op_type] = entry
        _EDITS[0] += 1
    return entry


def priced(kernel: str) -> bool:
    """Whether the device can price a launch of ``kernel`` (its own cycles or the cost model)."""
    return npu_kernels.lookup(kernel).cycles is not None or kernel in npu_cost.KNOWN_OPS


def price(
    config: DeviceConfig,
    kernel: str,
    in_specs: Sequence[TensorSpec | None],
    out_specs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
    cores: int,
) -> Any:
    """A launch of ``kernel`` on ``cores`` cores priced as the device prices it: with the
    kernel's own cycles function if it has one, else :func:`npu_sim.cost.op_cost`."""
    cycles = npu_kernels.lookup(kernel).cycles
    if cycles is not None:
        return cycles(config, in_specs, out_specs, attrs, cores=cores)
    return npu_cost.op_cost(config, kernel, in_specs, out_specs, attrs, cores)


def entry(op_type: str) -> OpEntry:
    """The entry of ``op_type``; an op outside the catalogue names the ones inside."""
    try:
        return _CATALOGUE[op_type]
    except KeyError:
        raise CatalogueError(f"{op_type}: not in the operator catalogue; catalogued: "
                             f"{', '.join(sorted(_CATALOGUE))}") from None


def remove(op_type: str) -> None:
    """Remove an entry (for tests that register temporary ones)."""
    with _EDITING:
        _CATALOGUE.pop(op_type, None)
        _EDITS[0] += 1


def entries() -> dict[str, OpEntry]:
    """Every entry by op type (a copy)."""
    return dict(_CATALOGUE)


class OpsWhere(Set[str]):
    """The op types whose entries have given field values, read live from the catalogue."""

    def __init__(self, fields: Mapping[str, object]) -> None:
        self._fields = dict(fields)
        self._members: tuple[int, frozenset[str]] = (-1, frozenset())

    def _matches(self, e: OpEntry) -> bool:
        return all(getattr(e, k) == v for k, v in self._fields.items())

    def _current(self) -> frozenset[str]:
        """The members, computed once per state of the catalogue (the compiler asks for every
        node several times)."""
        edits, members = self._members
        if edits != _EDITS[0]:
            edits = _EDITS[0]  # read first: an edit while computing makes the next call redo it
            members = frozenset(o for o, e in list(_CATALOGUE.items()) if self._matches(e))
            self._members = (edits, members)
        return members

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and op in self._current()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._current()))

    def __len__(self) -> int:
        return len(self._current())

    @classmethod
    def _from_iterable(cls, it: object) -> frozenset[str]:
        return frozenset(it)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"OpsWhere({sorted(self)})"


def ops_where(**fields: object) -> OpsWhere:
    """Op types whose entries have every given field value (``ops_where(tiling=Tiling.GEMM)``),
    as a live set: an entry registered later is in it."""
    return OpsWhere(fields)


class SupportTable(Mapping[str, OpSupport]):
    """op type -> :class:`OpSupport`, read live from the catalogue."""

    def __getitem__(self, op: str) -> OpSupport:
        try:
            return _CATALOGUE[op].support
        except KeyError:
            raise KeyError(op) from None

    def get(self, op: str, default: OpSupport | None = None) -> OpSupport | None:
        """``self[op]``, or ``default`` for an op outside the catalogue (without raising and
        catching a KeyError: the capability check asks this for every node)."""
        found = _CATALOGUE.get(op)
        return default if found is None else found.support

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(_CATALOGUE))

    def __len__(self) -> int:
        return len(_CATALOGUE)
