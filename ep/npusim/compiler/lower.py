"""Lowering: the optimized :class:`~.ir.SubGraph` as tensors and kernel launches.

Every remaining node becomes one launch (op type, input/output tensor indices, attributes as
plain data: tuples rather than lists, python scalars rather than numpy ones), in graph order,
which is topological; launch ``i`` runs at *step* ``i`` of the memory plan.

How a node lowers is its operator catalogue entry's :class:`~ep.npusim.ops.Lowering`. A node
whose op is not in the catalogue, or is an always-folded op whose inputs were not constant, is
refused with ``NotImplemented``.
Views do not launch anything. ``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``, ``Identity``
and ``Dropout`` (inference, mask unused) produce the same bytes as their input, so their output
tensor *aliases* its input: it gets the input's storage, and the storage lives until the last
reader of any alias. The memory plan therefore works on *buffers* (an activation and its views)
rather than on tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_sim import dtypes

from ... import errors
from ..ops import Lowering, entries, ops_where
from .ir import SubGraph

VIEW_OPS = ops_where(lowering=Lowering.VIEW)
"""Ops whose output aliases their input (when the dtypes agree and the input is not constant)."""


@dataclass(frozen=True)
class LoweredTensor:
    """A tensor of the lowered graph. ``buffer`` is its storage: itself unless it is a view."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_const: bool
    buffer: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (``TensorSpec(shape, dtype).nbytes``, without validating again
        what the import validated)."""
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)


@dataclass(frozen=True)
class Launch:
    """A kernel launch in tensor indices; ``-1`` marks an omitted optional input."""

    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict[str, Any]
    node: str


@dataclass
class Lowered:
    """Tensors (indexed), launches in execution order, graph inputs/outputs, constant values."""

    tensors: list[LoweredTensor]
    launches: list[Launch]
    inputs: list[int]
    outputs: list[int]
    consts: dict[int, np.ndarray]
    views: int = 0


def lower(graph: SubGraph) -> Lowered:
    """Turn ``graph`` into indexed tensors and launches, aliasing views to their input."""
    tensors: list[LoweredTensor] = []
    index: dict[str, int] = {}
    consts: dict[int, np.ndarray] = {}

    def tensor(name: str, buffer: int | None = None) -> int:
        if name in index:
            return index[name]
        dtype, shape = graph.types[name]
        i = len(tensors)
        tensors.append(LoweredTensor(name, dtype, shape, name in graph.consts,
                                     i if buffer is None else buffer))
        index[name] = i
        if name in graph.consts:
            consts[i] = graph.consts[name]
        return i

    for name in graph.inputs:
        tensor(name)
    launches: list[Launch] = []
    views = 0
    for node in graph.nodes:
        if _is_view(graph, node):
            src = tensor(node.inputs[0])
            tensor(node.outputs[0], buffer=tensors[src].buffer)
            views += 1
            continue
        ins = tuple(tensor(i) if i else -1 for i in node.inputs)
        if "" in node.outputs:  # the import dropped a dead tail: this one precedes a used output
            raise errors.NotImplemented(f"NpuSim compiler: node {node.name!r} ({node.op}) omits "
                                        f"output {node.outputs.index('')} but a later output is "
                                        f"used; a launch cannot skip an output")
        outs = tuple(tensor(o) for o in node.outputs)
        if node.domain not in ("", "ai.onnx"):
            raise errors.NotImplemented(f"NpuSim compiler: node {node.name!r} is {node.op} of "
                                        f"domain {node.domain!r}; only the ONNX domain lowers")
        _check_launchable(node)
        launches.append(Launch(node.op, ins, outs, plain_attrs(node.name, node.attrs), node.name))
    outputs = [tensor(o) for o in graph.outputs]
    return Lowered(tensors, launches, [index[n] for n in graph.inputs], outputs, consts, views)


def _check_launchable(node: Any) -> None:
    """Refuse a node whose op has no kernel launch in the operator catalogue."""
    entry = entries().get(node.op)
    if entry is None:
        raise errors.NotImplemented(f"NpuSim compiler: node {node.name!r} is {node.op}, which "
                                    f"is not in the operator catalogue (ep/npusim/ops)")
    if entry.lowering is Lowering.FOLD:
        raise errors.NotImplemented(f"NpuSim compiler: node {node.name!r} ({node.op}) is always "
                                    f"folded at compile time, but its inputs are not constant")


def _is_view(graph: SubGraph, node: Any) -> bool:
    """Whether ``node`` only reinterprets its (non-constant) input's bytes."""
    if node.op not in VIEW_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if node.inputs[0] in graph.consts or not node.outputs[0]:
        return False
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
        used = node.outputs[1] in graph.outputs or graph.consumers(node.outputs[1])
        if used:
            return False
    return graph.types[node.inputs[0]][0] == graph.types[node.outputs[0]][0]


def plain_attrs(node: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as plain data (int, float, str, bytes, tuples of those), sorted by name."""
    return {key: _plain(node, key, value) for key, value in sorted(attrs.items())}


_PLAIN = (int, float, str, bytes)  # by exact type: a bool is an int subclass, and becomes 0/1


def _plain(node: str, key: str, value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple and all(type(v) in _PLAIN for v in value):
        return value  # what the loop below builds: the same items, in a tuple
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, float, str, bytes)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return tuple(_plain(node, key, v) for v in value)
    raise errors.NotImplemented(
        f"NpuSim compiler: attribute {key!r} of node {node!r} is a {type(value).__name__}; "
        f"a launch takes int, float, str, bytes or tuples of them"
    )

