"""The model builder the fuzzer's op catalogue writes through, and inputs for any model.

A :class:`Builder` holds a growing graph: the tensors made so far with their dtype and static
shape (a pool the next node picks its inputs from), the nodes, the initializers. Every node is
typed by ONNX's own shape inference (strict, with data propagation) on a one-node model of it,
so the catalogue only proposes plausible attributes; a node inference rejects, or whose output
shape it cannot make static, is rolled back (:class:`Invalid`) and the generator proposes
another. Nothing here knows about the compiler under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

FLOAT = ("float32", "float16")
INT = ("int32", "int64", "int8", "uint8")
SIGNED = ("int32", "int64", "int8")
NUMERIC = FLOAT + INT
WINDOWED = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LRN"})
"""Ops whose empty output means a window that does not fit (onnxruntime refuses them)."""


class Invalid(Exception):
    """The proposed node is not valid here (ONNX shape inference refused it, or no input fits)."""


@dataclass(frozen=True)
class Tensor:
    """A tensor in the pool: its name, numpy dtype name and static shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(t: Tensor) -> onnx.ValueInfoProto:
    """The ``ValueInfoProto`` declaring ``t``."""
    return helper.make_tensor_value_info(t.name, _elem(t.dtype), list(t.shape))


@dataclass
class Builder:
    """A graph under construction at one opset (see the module doc)."""

    rng: np.random.Generator
    opset: int
    inputs: list[Tensor] = field(default_factory=list)
    pool: list[Tensor] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, Tensor] = field(default_factory=dict)
    _count: int = 0

    def fresh(self, prefix: str) -> str:
        """A new tensor or node name."""
        self._count += 1
        return f"{prefix}{self._count}"

    def add_input(self, dtype: str, shape: Sequence[int]) -> Tensor:
        """A new graph input, put in the pool."""
        t = Tensor(f"in{len(self.inputs)}", dtype, tuple(int(d) for d in shape))
        self.inputs.append(t)
        self.pool.append(t)
        self.types[t.name] = t
        return t

    def const(self, value: np.ndarray | Sequence, dtype: str | None = None,
              node: bool | None = None) -> str:
        """A constant: an initializer, or (at random unless ``node`` says) a ``Constant`` node
        placed first in the graph, as exporters place them. Not put in the pool."""
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh("c")
        use_node = bool(self.rng.random() < 0.3) if node is None else node
        tensor = numpy_helper.from_array(arr, name)
        if use_node:
            self.nodes.insert(0, helper.make_node("Constant", [], [name], value=tensor,
                                                  name=self.fresh("n")))
        else:
            self.initializers.append(tensor)
        self.constants[name] = arr
        self.types[name] = Tensor(name, arr.dtype.name, arr.shape)
        return name

    def add(self, op: str, inputs: Sequence[str], n_out: int = 1, pool: bool = True,
            **attrs) -> list[Tensor]:
        """Append node ``op`` and return its typed outputs (put in the pool unless ``pool`` is
        False); raise :class:`Invalid` if ONNX shape inference refuses it."""
        outputs = [self.fresh("t") for _ in range(n_out)]
        node = helper.make_node(op, list(inputs), outputs, name=self.fresh("n"), **attrs)
        typed = self._infer(node)
        self.nodes.append(node)
        for t in typed:
            self.types[t.name] = t
        if pool:
            self.pool.extend(typed)
        return typed

    def _infer(self, node: onnx.NodeProto) -> list[Tensor]:
        ins = [i for i in dict.fromkeys(node.input) if i]
        consts = [numpy_helper.from_array(self.constants[i], i) for i in ins
                  if i in self.constants]
        graph = helper.make_graph(
            [node], "probe", [value_info(self.types[i]) for i in ins if i not in self.constants],
            [onnx.ValueInfoProto(name=o) for o in node.output], consts)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True,
                                                         data_prop=True)
            onnx.checker.check_model(inferred, full_check=True)  # type constraints per opset
        except Exception as exc:  # noqa: BLE001 - any inference failure means "not valid here"
            raise Invalid(f"{node.op_type}: {exc}") from exc
        out = []
        for v in inferred.graph.output:
            tt = v.type.tensor_type
            if not tt.elem_type or not tt.HasField("shape"):
                raise Invalid(f"{node.op_type}: no static type for {v.name}")
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if None in dims:
                raise Invalid(f"{node.op_type}: dynamic shape for {v.name}")
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
            out.append(Tensor(v.name, dtype, tuple(dims)))
        if any(t.size > 20000 or min(t.shape, default=0) < 0 for t in out):
            raise Invalid(f"{node.op_type}: output too large or of a negative dimension")
        if node.op_type in WINDOWED and any(t.size == 0 for t in out):
            raise Invalid(f"{node.op_type}: a window wider than its padded input")
        return out

    def pick(self, dtypes: Sequence[str] = FLOAT, min_rank: int = 0, max_rank: int = 8,
             where=None) -> Tensor:
        """A pool tensor of one of ``dtypes`` and rank in range, recent ones more likely."""
        fits = [t for t in self.pool if t.dtype in dtypes and min_rank <= t.rank <= max_rank
                and (where is None or where(t))]
        if not fits:
            raise Invalid(f"no tensor of {dtypes} rank {min_rank}..{max_rank}")
        weights = np.arange(1, len(fits) + 1, dtype=np.float64) ** 2
        return fits[int(self.rng.choice(len(fits), p=weights / weights.sum()))]

    def snapshot(self) -> tuple[int, int, int, dict]:
        """State to :meth:`rollback` to when a multi-node proposal fails halfway."""
        return (len(self.nodes), len(self.initializers), len(self.pool), dict(self.constants))

    def rollback(self, state: tuple[int, int, int, dict]) -> None:
        n_nodes, n_inits, n_pool, constants = state
        kept = {t.name for t in self.initializers[:n_inits]} | set(constants)
        self.nodes = [n for n in self.nodes if n.op_type != "Constant"
                      or n.output[0] in kept][:n_nodes]
        del self.initializers[n_inits:]
        del self.pool[n_pool:]
        self.constants = constants

    def model(self, outputs: Sequence[Tensor]) -> onnx.ModelProto:
        """The finished model with ``outputs`` as its graph outputs."""
        graph = helper.make_graph(self.nodes, "fuzz", [value_info(t) for t in self.inputs],
                                  [value_info(t) for t in outputs], self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=8 if self.opset <= 18 else 10)


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Deterministic finite inputs for ``model``: floats ~ N(0, 1) times a scale of 1, 4 or
    100 (or all zeros), integers in [-6, 6] ([0, 12] unsigned), booleans at random."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if dtype == np.bool_:
            arr = rng.random(shape) < 0.5
        elif dtype.kind == "f":
            arr = rng.standard_normal(shape) * rng.choice([1.0, 1.0, 4.0, 100.0, 0.0])
        elif dtype.kind == "u":
            arr = rng.integers(0, 13, shape)
        else:
            arr = rng.integers(-6, 7, shape)
        out[v.name] = np.asarray(arr).astype(dtype)
    return out
