"""The compiler's working graph: a small mutable copy of one partition's ONNX subgraph.

:class:`SubGraph` is what the rewrites (:mod:`.rewrite`) edit and what lowering (:mod:`.lower`)
turns into a :class:`~firmware_model.program.Program`. It is deliberately plain: a topologically
ordered list of :class:`Node` (op type, input/output tensor names, attributes as python values),
the constant tensors by name (initializers, and whatever constant folding produced), and the
static ``(dtype, shape)`` of every tensor.

Shapes are static by construction: :meth:`SubGraph.from_fused` applies the dimension overrides
and runs ONNX shape inference; a tensor whose shape is still symbolic (or unknown) raises
:class:`ep.errors.Fail` naming it, since the capability check should never have offered a node
that needs one.

:func:`evaluate` runs a SubGraph with the device's own kernels (:mod:`npu_sim.kernels`). Constant
folding uses it for single nodes, and the rewrite tests use it to check a rewritten graph against
onnxruntime on the original one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npu_sim import dtypes
from npu_sim import kernels as npu_kernels
from npu_sim.errors import KernelError
from npu_sim.kernels import activations as kernel_activations

from ... import errors
from ...framework.shapes import WEIGHT_BYTES, nbytes
from ...framework.wire import tensor_value_info
from ..ops import ops_where

TensorType = tuple[str, tuple[int, ...]]

# Ops whose result depends on the opset's definition, not only on attributes: their kernels take
# the opset as the ``_opset`` attribute.
OPSET_DEPENDENT = ops_where(opset_dependent=True)


@dataclass(eq=False)
class Node:
    """One node of a :class:`SubGraph`. ``""`` in ``inputs`` marks an omitted optional input.

    Nodes compare by identity, as graph nodes do: two nodes with the same fields are still two
    nodes (and ``graph.nodes.remove(node)`` compares no fields)."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""


@dataclass
class SubGraph:
    """A partition's graph, with static types and constant tensors, ready to rewrite."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    consts: dict[str, np.ndarray]
    types: dict[str, TensorType]
    opset: int

    @classmethod
    def from_fused(
        cls,
        graph: onnx.GraphProto,
        opset_imports: Sequence[onnx.OperatorSetIdProto],
        dim_overrides: Mapping[str, int] | None = None,
        *,
        initializers: Sequence[onnx.TensorProto] | None = None,
        values: Mapping[str, np.ndarray] | None = None,
    ) -> SubGraph:
        """Import a partition's standalone graph, resolving every shape to static values.

        ``initializers`` are the graph's (default: ``graph.initializer``; a
        :class:`~ep.framework.provider.FusedNode` keeps the session's outside its body);
        ``values`` are those of them already decoded, used as they are (read-only views)."""
        tensors = list(graph.initializer) if initializers is None else list(initializers)
        inferred = _infer(graph, tensors, opset_imports, dim_overrides or {})
        decoded = values or {}
        consts = {t.name: decoded[t.name] if t.name in decoded else numpy_helper.to_array(t)
                  for t in tensors}
        opset = next((o.version for o in opset_imports if o.domain in ("", "ai.onnx")), 1)
        types: dict[str, TensorType] = {}
        for name, arr in consts.items():
            types[name] = (dtypes.from_numpy(arr.dtype), tuple(arr.shape))
        for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
            if vi.name not in types:
                types[vi.name] = _static_type(vi)
        nodes = []
        protos = list(inferred.node)
        reads = [list(proto.input) for proto in protos]  # each protobuf field is read once
        read = {name for names in reads for name in names if name}
        read.update(vi.name for vi in inferred.output)
        for i, (proto, ins) in enumerate(zip(protos, reads, strict=True)):
            attrs = {a.name: attr_value(a) for a in proto.attribute}
            op, domain = proto.op_type, proto.domain
            if op in OPSET_DEPENDENT and domain in ("", "ai.onnx"):
                attrs["_opset"] = opset
            outs = list(proto.output)
            if (op == "Split" and "split" not in attrs and "num_outputs" not in attrs
                    and (len(ins) < 2 or not ins[1])):
                # The kernel cannot see how many outputs the node has: tell it.
                attrs["num_outputs"] = len(outs)
            node = Node(op, ins, _without_dead_tail(outs, read), attrs,
                        proto.name or f"{op}_{i}", domain)
            for out in node.outputs:
                if out and out not in types:
                    raise errors.Fail(f"NpuSim compiler: no shape could be inferred for tensor "
                                      f"{out!r} (output of node {node.name!r})")
            nodes.append(node)
        inputs = [vi.name for vi in inferred.input if vi.name not in consts]
        outputs = [vi.name for vi in inferred.output]
        available = set(inputs) | set(consts) | {o for n in nodes for o in n.outputs}
        missing = [o for o in outputs if o not in available]
        if missing:
            raise errors.InvalidGraph(f"NpuSim compiler: graph outputs {missing} are not "
                                      f"produced by any node, input or initializer")
        return cls(nodes, inputs, outputs, consts, types, opset)

    # -- queries ------------------------------------------------------------------------------

    def consumers(self, name: str) -> list[Node]:
        """Nodes reading tensor ``name``, in graph order."""
        return [n for n in self.nodes if name in n.inputs]

    def producer(self, name: str) -> Node | None:
        """The node writing tensor ``name`` (None for inputs and constants)."""
        return next((n for n in self.nodes if name in n.outputs), None)

    def only_consumer(self, name: str) -> Node | None:
        """The single node reading ``name`` if it has exactly one reader and is not an output."""
        if name in self.outputs:
            return None
        readers = self.consumers(name)
        if len(readers) != 1 or readers[0].inputs.count(name) != 1:
            return None
        return readers[0]

    def const(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a constant."""
        return self.consts.get(name) if name else None

    def add_const(self, name: str, value: np.ndarray) -> str:
        """Add a constant under a fresh name derived from ``name``; returns the name used."""
        unique, k = name, 0
        while unique in self.types:
            k += 1
            unique = f"{name}_{k}"
        value = contiguous(value)
        self.consts[unique] = value
        self.types[unique] = (dtypes.from_numpy(value.dtype), tuple(value.shape))
        return unique

    def remove_dead(self) -> int:
        """Drop nodes none of whose outputs are read or are graph outputs; drop unused consts."""
        removed = 0
        changed = True
        while changed:
            changed = False
            used = set(self.outputs)
            for n in self.nodes:
                used.update(n.inputs)
            keep = [n for n in self.nodes if any(o in used for o in n.outputs if o)]
            if len(keep) != len(self.nodes):
                removed += len(self.nodes) - len(keep)
                self.nodes = keep
                changed = True
        used = set(self.outputs)
        for n in self.nodes:
            used.update(n.inputs)
        for name in [c for c in self.consts if c not in used]:
            del self.consts[name]
        return removed


class Uses:
    """Who reads and who writes each tensor of a :class:`SubGraph`, indexed once; a rewrite
    that edits the graph keeps it current (:meth:`drop`, :meth:`read`, ``writer``). The
    graph's own :meth:`~SubGraph.producer` and :meth:`~SubGraph.consumers` scan every node:
    quadratic over a pass that asks for each of a few hundred nodes."""

    def __init__(self, graph: SubGraph) -> None:
        self.graph = graph
        self.outputs = set(graph.outputs)
        self.readers: dict[str, list[Node]] = {}
        self.writer: dict[str, Node] = {}
        """tensor -> the node writing it (the first, like :meth:`SubGraph.producer`)."""
        for node in graph.nodes:
            for name in node.inputs:
                self.readers.setdefault(name, []).append(node)
            for name in node.outputs:
                self.writer.setdefault(name, node)

    def of(self, name: str) -> list[Node]:
        """The nodes reading ``name``, once per input that reads it."""
        return self.readers.get(name, [])

    def only(self, name: str) -> Node | None:
        """The single reader of ``name`` (read once, not a graph output), like
        :meth:`SubGraph.only_consumer`."""
        readers = self.of(name)
        if name in self.outputs or len(readers) != 1 or readers[0].inputs.count(name) != 1:
            return None
        return readers[0]

    def drop(self, node: Node) -> None:
        """``node`` leaves the graph: it reads nothing any more."""
        for name in node.inputs:
            self.readers[name].remove(node)

    def read(self, node: Node, name: str) -> None:
        """``node`` now reads ``name`` as well."""
        self.readers.setdefault(name, []).append(node)


_BLOCK_COLUMNS = 256


def contiguous(value: np.ndarray) -> np.ndarray:
    """``value`` as a C-contiguous array (0-d stays 0-d). A large transposed matrix (a folded
    ``Transpose`` of a weight: GPT-2's 50257 x 768 output projection) is copied in blocks of
    columns, which reads the source in cache-sized runs: 2-3x faster than numpy's copy."""
    if (value.ndim == 2 and not value.flags.c_contiguous and value.T.flags.c_contiguous
            and value.nbytes >= 1 << 20):
        out = np.empty(value.shape, value.dtype)
        for start in range(0, value.shape[1], _BLOCK_COLUMNS):
            out[:, start:start + _BLOCK_COLUMNS] = value[:, start:start + _BLOCK_COLUMNS]
        return out
    return np.require(value, requirements="C")


def _without_dead_tail(outputs: Sequence[str], read: set[str]) -> list[str]:
    """``outputs`` without the trailing ones nothing reads (always keeping the first).

    Optional outputs nobody reads (Dropout's mask, MaxPool's Indices) are not materialized:
    the launch lists fewer outputs than the kernel returns and the device drops the rest. ONNX
    shape inference may not even type them (the mask of Dropout-7).
    """
    kept = list(outputs)
    while len(kept) > 1 and kept[-1] not in read:
        kept.pop()
    return kept


_A = onnx.AttributeProto
_SCALARS = {_A.INT: lambda a: a.i, _A.FLOAT: lambda a: a.f,
            _A.INTS: lambda a: tuple(a.ints), _A.FLOATS: lambda a: tuple(a.floats)}
"""The attribute kinds nodes mostly carry, read directly (what ``helper.get_attribute_value``
would return, lists as tuples)."""


def attr_value(attr: onnx.AttributeProto) -> Any:
    """An ONNX attribute as plain python: lists become tuples, strings str, tensors numpy."""
    read = _SCALARS.get(attr.type)
    if read is not None and not attr.ref_attr_name:
        return read(attr)
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
    return value


def _infer(
    graph: onnx.GraphProto,
    initializers: Sequence[onnx.TensorProto],
    opset_imports: Sequence[onnx.OperatorSetIdProto],
    overrides: Mapping[str, int],
) -> onnx.GraphProto:
    """A light copy of ``graph``: its nodes in topological order, inputs and outputs with
    overridden dims fixed, and every intermediate's type inferred. Weights are not copied: they
    become typed inputs of the copy (read their values from ``graph``); small initializers stay,
    so shape arithmetic on them still propagates."""
    model = onnx.ModelProto(ir_version=onnx.IR_VERSION)
    model.opset_import.extend(opset_imports)
    light = model.graph
    light.node.extend(_toposorted(graph, {t.name for t in initializers}))
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    for vi in [*light.input, *light.output] if overrides else ():
        if not vi.type.HasField("tensor_type"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in overrides:
                dim.dim_value = int(overrides[dim.dim_param])
    for tensor in initializers:
        if nbytes(tensor) < WEIGHT_BYTES:
            light.initializer.append(tensor)
        else:  # a typed input, built in the graph's arena (wire.tensor_value_info)
            light.input.add().MergeFromString(
                tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise errors.InvalidGraph(f"NpuSim compiler: shape inference failed: {exc}") from None
    return model.graph


def _toposorted(graph: onnx.GraphProto,
                initialized: set[str] | None = None) -> list[onnx.NodeProto]:
    """The nodes in a topological order (stable: keeps the given order where it is valid);
    ``initialized``: the initializers' names (default: ``graph.initializer``'s).

    Nodes come in waves: wave 0 reads only graph inputs and initializers, wave k + 1 reads
    something wave k produced; within a wave the given order is kept. The waves are found in
    one pass over the edges (Kahn's algorithm level by level), not by rescanning the nodes.
    """
    nodes = list(graph.node)
    if initialized is None:
        initialized = {t.name for t in graph.initializer}
    known = {vi.name for vi in graph.input} | initialized | {""}
    waiting: dict[str, list[int]] = {}  # tensor -> nodes that still wait for it
    unresolved = []
    for k, n in enumerate(nodes):
        needs = set(n.input) - known
        unresolved.append(len(needs))
        for name in needs:
            waiting.setdefault(name, []).append(k)
    wave = [k for k, count in enumerate(unresolved) if count == 0]
    ordered: list[onnx.NodeProto] = []
    while wave:
        ordered.extend(nodes[k] for k in wave)
        produced = {name for k in wave for name in nodes[k].output} - known
        known |= produced
        after = []
        for name in produced:
            for k in waiting.pop(name, ()):
                unresolved[k] -= 1
                if unresolved[k] == 0:
                    after.append(k)
        wave = sorted(after)
    if len(ordered) < len(nodes):
        missing = sorted({i for k, n in enumerate(nodes) if unresolved[k] for i in n.input
                          if i not in known})
        raise errors.InvalidGraph(f"NpuSim compiler: the subgraph has a cycle or reads "
                                  f"tensors nothing produces: {missing[:5]}")
    return ordered


def _static_type(vi: onnx.ValueInfoProto) -> TensorType:
    """``(dtype, shape)`` of a value info; a symbolic or unknown dim raises Fail."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        raise errors.Fail(f"NpuSim compiler: tensor {vi.name!r} has no static shape")
    shape = []
    for dim in tt.shape.dim:
        if not dim.HasField("dim_value"):
            what = dim.dim_param or "unknown"
            raise errors.Fail(
                f"NpuSim compiler: tensor {vi.name!r} has symbolic dimension {what!r}; "
                f"give it a value with a provider option {{{what!r}: '<int>'}}"
            )
        shape.append(dim.dim_value)
    try:
        dtype = dtypes.from_onnx(tt.elem_type)
    except Exception:
        raise errors.Fail(f"NpuSim compiler: tensor {vi.name!r} has element type "
                          f"{tt.elem_type}, which the device does not support") from None
    return dtype, tuple(shape)


def activation_params(graph: SubGraph, act: Node) -> tuple[float, ...] | None:
    """The fused-activation parameters of ``act``, as its kernel works them out
    (:func:`npu_sim.kernels.activations.activation_params`); None when they are not constant
    (a Clip bound that is not a scalar constant) or the kernel refuses them."""
    x = np.empty(0, dtypes.to_numpy(graph.types[act.inputs[0]][0]))  # its dtype: Clip's range
    inputs: list[np.ndarray | None] = [x]
    for name in act.inputs[1:3] if act.op == "Clip" else ():
        value = graph.const(name) if name else None
        if name and (value is None or value.size != 1):
            return None
        inputs.append(value)
    try:
        return kernel_activations.activation_params(act.op, act.attrs, inputs)
    except KernelError:  # run unfused: its own launch reports it
        return None


def run_node(node: Node, values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node on the device's kernel (values only, no timing)."""
    kernel = npu_kernels.lookup(node.op, node.name)
    return list(kernel.values(list(values), node.attrs))


def evaluate(graph: SubGraph, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``graph`` on the device's kernels; ``feeds`` in ``graph.inputs`` order."""
    env: dict[str, np.ndarray] = dict(graph.consts)
    env.update(zip(graph.inputs, feeds, strict=True))
    for node in graph.nodes:
        outs = run_node(node, [env[i] if i else None for i in node.inputs])
        env.update(zip(node.outputs, outs, strict=False))
    return [env[o] for o in graph.outputs]
