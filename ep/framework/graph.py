"""A read-only, indexed view of an ONNX graph: what partitioning and lowering work from.

ONNX stores a graph as lists of protobuf messages; everything the EP layer asks ("who produces
this tensor?", "what is its dtype and shape?", "is it a constant?") would be a linear scan. A
:class:`GraphView` answers those questions from indices built once:

* the model is copied (or, ``owned``, taken and edited in place: a session's own parsed model,
  whose weights are then never copied), symbolic input dimensions are fixed (``dim_overrides``,
  from ``SessionOptions.add_free_dimension_override_by_name`` as in ONNX Runtime), and ONNX shape
  inference fills in every intermediate type it can (data propagation on, so shapes computed
  from ``Shape``/``Concat`` chains become static);
* nodes are sorted topologically (stable: among ready nodes the one earlier in the file goes
  first) and ``graph.node`` of the copy is rewritten in that order, so ``view.nodes[i]`` is
  ``view.graph.node[i]``;
* every node gets a unique name (``"{op_type}_{index}"`` for unnamed ones), written into the
  copy too, so names survive into fused subgraphs and EPContext nodes.

Node indices (positions in ``nodes``) are what :class:`~ep.framework.provider.ComputeCapability`
groups hold. ``assigned`` is the set of nodes the partitioner has already given to a
higher-priority provider; an EP's ``get_capability`` must not offer them.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npu_sim import dtypes
from npu_sim.errors import ConfigError

from ..errors import InvalidGraph
from .shapes import INVENTED, infer_shapes

Shape = tuple[int | str | None, ...]


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _subgraph_references(graph: onnx.GraphProto) -> set[str]:
    """Names a (nested) subgraph reads from enclosing scopes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        defined.update(o for o in node.output if o)
    for node in graph.node:
        used.update(i for i in node.input if i)
        for attr in node.attribute:
            for sub in _attr_graphs(attr):
                used |= _subgraph_references(sub)
    used.update(o.name for o in graph.output)
    return used - defined


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads, each once: its inputs, then the outer-scope names its
    subgraphs (If, Loop, Scan bodies) read."""
    names = list(dict.fromkeys(i for i in node.input if i))
    for attr in node.attribute:
        for sub in _attr_graphs(attr):
            names.extend(n for n in sorted(_subgraph_references(sub)) if n not in names)
    return names


def _attr_graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _plain(value: Any) -> Any:
    """An attribute value as plain python (bytes -> str, lists -> tuples, tensors -> arrays)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, onnx.SparseTensorProto):
        return numpy_helper.to_array(value.values)
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def dims(shape: onnx.TensorShapeProto) -> tuple[int | str | None, ...]:
    """An ONNX shape as a tuple: ints for static dims, the name of a symbolic dim, None for an
    unknown one."""
    return tuple(
        int(d.dim_value) if d.HasField("dim_value")
        else d.dim_param if d.HasField("dim_param") else None
        for d in shape.dim
    )


class GraphView:
    """Indexed, shape-inferred, topologically sorted view of an ONNX model (build with
    :meth:`from_model`)."""

    model: onnx.ModelProto
    graph: onnx.GraphProto
    _named_unknowns: frozenset[str] = frozenset()
    nodes: list[onnx.NodeProto]
    names: list[str]
    initializers: dict[str, onnx.TensorProto]
    """The constant initializers (overridable ones excluded)."""
    overridable: dict[str, onnx.TensorProto]
    """Initializers the graph also lists as inputs, by name: a run may feed them."""
    inputs: list[str]
    outputs: list[str]
    assigned: frozenset[int]

    @classmethod
    def from_model(
        cls, model: onnx.ModelProto, *, dim_overrides: Mapping[str, int] | None = None,
        owned: bool = False, weights: Mapping[str, np.ndarray] | None = None,
    ) -> GraphView:
        """Copy ``model``, fix symbolic dims, infer shapes, sort topologically and index.

        With ``owned`` the view takes ``model`` itself and edits it (no copy of its weights):
        for a caller that made the model and keeps no other use of it. ``weights`` are
        initializer values already read (:func:`~.tensors.check_model_tensors`), which
        :meth:`constant` and :meth:`weight` return instead of decoding the tensor again.
        Raises :class:`~ep.errors.InvalidGraph` for a cycle, a node input nobody produces, a
        tensor produced twice, or a model shape inference rejects; the message names them.
        """
        if not owned:
            model = copy.deepcopy(model)
        overrides = dict(dim_overrides or {})
        for name, value in overrides.items():
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise InvalidGraph(
                    f"dim override {name!r}={value!r} is invalid; expected an integer >= 0"
                )
        if overrides:
            _apply_dim_overrides(model.graph, overrides)
        graph = model.graph
        available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        order, node_inputs = _toposort(graph, available)
        if order != list(range(len(order))):  # most files are in order already: no copies
            nodes = [copy.deepcopy(graph.node[k]) for k in order]
            del graph.node[:]
            graph.node.extend(nodes)  # sorted before inference, which walks nodes in file order
        view = cls()
        named = _named_unknowns(graph)  # before inference adds its own
        view._build(_infer_shapes(model), [node_inputs[k] for k in order], weights or {})
        view._named_unknowns = named
        return view

    def _build(self, model: onnx.ModelProto, node_inputs: list[list[str]],
               weights: Mapping[str, np.ndarray]) -> None:
        self.model = model
        self.graph = model.graph
        self.assigned = frozenset()
        initializers = {t.name: t for t in self.graph.initializer}
        # An initializer the graph also lists as an input is onnxruntime's overridable
        # initializer: a run may feed it, so it is an input with a default, never a constant.
        # Not in IR 3, which lists every initializer as an input and lets a run feed none.
        self.overridable = {i.name: initializers.pop(i.name) for i in self.graph.input
                            if i.name in initializers} if model.ir_version >= 4 else {}
        self.initializers = initializers
        self.inputs = [i.name for i in self.graph.input
                       if i.name not in initializers and i.name not in self.overridable]
        self.outputs = [o.name for o in self.graph.output]
        self._opsets = {_domain(o.domain): o.version for o in model.opset_import}
        self._node_inputs = node_inputs
        self.nodes = list(self.graph.node)
        self.names = _unique_names(self.nodes)
        for node, name in zip(self.nodes, self.names, strict=True):
            node.name = name
        self._producer: dict[str, int] = {}
        self._consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self._producer[out] = i
            for name in self._node_inputs[i]:
                users = self._consumers.setdefault(name, [])
                if not users or users[-1] != i:
                    users.append(i)
        self._value_info: dict[str, onnx.ValueInfoProto] = {}
        for vi in (*self.graph.input, *self.graph.output, *self.graph.value_info):
            self._value_info.setdefault(vi.name, vi)
        self._constants: dict[str, np.ndarray | None] = {}
        self._types: dict[str, tuple[str | None, Shape | None]] = {}
        # Only values that still match their initializer's type and shape (the optimizer may
        # have replaced a small one under the same name; weights it never sees).
        self._weights = {name: value for name, value in weights.items()
                         if name in self.initializers and _matches(self.initializers[name], value)}

    def with_assigned(self, assigned: Iterable[int]) -> GraphView:
        """A view sharing everything with this one except ``assigned`` (nodes already taken)."""
        view = object.__new__(type(self))  # copy.copy's result, without its reduce protocol
        view.__dict__.update(self.__dict__)
        view.assigned = frozenset(assigned)
        return view

    def invented(self, dim: int | str | None) -> bool:
        """Whether ``dim`` is a name ONNX shape inference gave an unknown dim (``unk__N``),
        not one the model uses itself."""
        return isinstance(dim, str) and dim.startswith(INVENTED) and dim not in self._named_unknowns

    def as_onnxruntime_holds(self, vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
        """``vi`` with every dim it has by an :meth:`invented` name unknown again, as
        onnxruntime's graph holds it (a copy when there is one)."""
        if not any(self.invented(d.dim_param) for d in vi.type.tensor_type.shape.dim):
            return vi
        held = onnx.ValueInfoProto()
        held.CopyFrom(vi)
        for d in held.type.tensor_type.shape.dim:
            if self.invented(d.dim_param):
                d.ClearField("dim_param")
        return held

    def opset(self, domain: str = "") -> int:
        """The model's opset version for ``domain`` (``"ai.onnx"`` is ``""``); 0 if not imported."""
        return self._opsets.get(_domain(domain), 0)

    def producer(self, tensor: str) -> int | None:
        """Index of the node producing ``tensor``; None for graph inputs and initializers."""
        return self._producer.get(tensor)

    def consumers(self, tensor: str) -> list[int]:
        """Indices (ascending) of the nodes reading ``tensor``, including from subgraphs."""
        return list(self._consumers.get(tensor, ()))

    def node_inputs(self, i: int) -> list[str]:
        """The tensors node ``i`` reads: its non-empty inputs, then names its subgraphs read
        from the outer scope (ONNX Runtime's implicit inputs); no duplicates."""
        return list(self._node_inputs[i])

    def value_info(self, tensor: str) -> onnx.ValueInfoProto | None:
        """The (possibly inferred) ValueInfoProto of a tensor, if the model has one."""
        vi = self._value_info.get(tensor)
        t = self._typed_by(tensor)
        if t is None or (vi is not None and tensor in self.initializers):
            return vi
        return helper.make_tensor_value_info(tensor, t.data_type, list(t.dims))

    def _typed_by(self, tensor: str) -> onnx.TensorProto | None:
        """The initializer whose type and dims are ``tensor``'s: a constant's own, or an
        overridable one's when its graph input is written without a shape."""
        init = self.initializers.get(tensor)
        if init is None and tensor in self.overridable:
            vi = self._value_info.get(tensor)
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                init = self.overridable[tensor]
        return init

    def tensor_type(self, tensor: str) -> tuple[str | None, Shape | None]:
        """Device dtype name (None if unknown or not a device dtype) and shape.

        Shape entries are ints for static dims, the dim_param string for symbolic ones and
        None for unknown ones; the shape is None when even the rank is unknown.
        """
        found = self._types.get(tensor)
        if found is None:  # the view is read-only: decode each tensor's type once
            found = self._types[tensor] = self._tensor_type(tensor)
        return found

    def _tensor_type(self, tensor: str) -> tuple[str | None, Shape | None]:
        init = self._typed_by(tensor)
        if init is not None:
            return _dtype_name(init.data_type), tuple(int(d) for d in init.dims)
        vi = self._value_info.get(tensor)
        if vi is None or not vi.type.HasField("tensor_type"):
            return None, None
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            return _dtype_name(tt.elem_type), None
        return _dtype_name(tt.elem_type), dims(tt.shape)

    def attrs(self, i: int) -> dict[str, Any]:
        """Node ``i``'s attributes as plain python values (graphs stay GraphProto)."""
        return {
            a.name: _plain(helper.get_attribute_value(a)) for a in self.nodes[i].attribute
        }

    def weight(self, tensor: str) -> np.ndarray | None:
        """The value of initializer ``tensor`` if it was read at load (a weight: a read-only
        view, no copy); None otherwise."""
        return self._weights.get(tensor)

    def constant(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or of a ``Constant`` node's output; None otherwise."""
        if tensor in self._constants:
            return self._constants[tensor]
        value: np.ndarray | None = None
        if tensor in self._weights:
            value = self._weights[tensor]
        elif tensor in self.initializers:
            value = numpy_helper.to_array(self.initializers[tensor])
        else:
            p = self.producer(tensor)
            if p is not None and self.nodes[p].op_type == "Constant" and _domain(
                self.nodes[p].domain
            ) == "":
                value = _constant_value(self.attrs(p))
        self._constants[tensor] = value
        return value

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return (
            f"GraphView({self.graph.name!r}: {len(self.nodes)} nodes, inputs={self.inputs}, "
            f"outputs={self.outputs})"
        )


def _matches(tensor: onnx.TensorProto, value: np.ndarray) -> bool:
    """Whether ``value`` has ``tensor``'s shape and element type (``tensor`` is an initializer
    of the optimized model: its type is one onnx knows)."""
    return value.shape == tuple(tensor.dims) and \
        value.dtype == helper.tensor_dtype_to_np_dtype(tensor.data_type)


def _dtype_name(elem_type: int) -> str | None:
    try:
        return dtypes.from_onnx(elem_type)
    except ConfigError:
        return None


def _constant_value(attrs: Mapping[str, Any]) -> np.ndarray | None:
    """The value a Constant node holds, from whichever ``value*`` attribute it sets."""
    for key, dtype in (
        ("value", None),
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    return None


def _apply_dim_overrides(graph: onnx.GraphProto, overrides: Mapping[str, int]) -> None:
    """Replace dim_param names in inputs, outputs and value_info by their fixed values."""
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if not vi.type.HasField("tensor_type"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in overrides:
                dim.dim_value = int(overrides[dim.dim_param])


def _named_unknowns(graph: onnx.GraphProto) -> frozenset[str]:
    """The dim names of the graph's declared types that look like ONNX's invented ones."""
    return frozenset(
        d.dim_param for vi in (*graph.input, *graph.output, *graph.value_info)
        for d in vi.type.tensor_type.shape.dim if d.dim_param.startswith(INVENTED))


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return infer_shapes(model)
    except onnx.shape_inference.InferenceError as exc:
        raise InvalidGraph(f"shape inference failed: {exc}") from None
    except (ValueError, onnx.checker.ValidationError):
        # Models over 2 GiB or with parts the inferencer cannot read: keep declared types.
        return model


def _toposort(
    graph: onnx.GraphProto, available: set[str]
) -> tuple[list[int], list[list[str]]]:
    """Kahn's algorithm, stable by file position. Returns the order and each node's inputs."""
    producer: dict[str, int] = {}
    for k, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in available:
                other = (
                    f"node {graph.node[producer[out]].name!r}"
                    if out in producer
                    else "a graph input or initializer"
                )
                raise InvalidGraph(
                    f"tensor {out!r} is produced by node {node.name!r} ({node.op_type}) and "
                    f"also by {other}; every tensor must have one producer"
                )
            producer[out] = k
    node_inputs: list[list[str]] = []
    pending = [0] * len(graph.node)
    users: list[list[int]] = [[] for _ in graph.node]
    for k, node in enumerate(graph.node):
        names = node_reads(node)
        node_inputs.append(names)
        for name in names:
            if name in producer:
                pending[k] += 1
                users[producer[name]].append(k)
            elif name not in available:
                raise InvalidGraph(
                    f"node {node.name!r} ({node.op_type}) reads {name!r}, which is not a graph "
                    "input, an initializer or the output of any node"
                )
    ready = [k for k, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for user in users[k]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(graph.node):
        stuck = [graph.node[k].name or f"#{k} {graph.node[k].op_type}" for k, n in
                 enumerate(pending) if n > 0]
        raise InvalidGraph(f"the graph has a cycle through nodes {stuck}")
    return order, node_inputs


def _unique_names(nodes: list[onnx.NodeProto]) -> list[str]:
    """Node names, unique: an empty or repeated name becomes ``"{op_type}_{index}"``."""
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    names = []
    for i, node in enumerate(nodes):
        name = node.name
        if not name or name in seen:
            base = name or node.op_type
            name = f"{base}_{i}"
            suffix = 0
            while name in taken or name in seen:
                suffix += 1
                name = f"{base}_{i}_{suffix}"
        seen.add(name)
        names.append(name)
    return names
