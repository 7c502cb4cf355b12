"""Graph inputs and outputs as onnxruntime's Python binding describes them: ``NodeArg``.

onnxruntime's ``NodeArg.type`` is ONNX's ``DataTypeUtils::ToString`` of the value's type:
``tensor(float)``, ``seq(tensor(int64))``, ``map(string,tensor(float))``,
``optional(tensor(float))``, ``seq(map(int64,tensor(float)))`` (a scikit-learn classifier's
``ZipMap``), ``sparse_tensor(float)``, ``opaque(domain,name)``. Its ``shape`` is
``NodeArg::Shape()``: the dims of a tensor, a sparse tensor or an optional tensor that has a
shape (an int for a known dim, the name of a symbolic one, None for an unknown one), and ``[]``
for everything else, a value without a shape and a scalar alike.

onnxruntime's own type inference names no unknown dim; ONNX's, which the session runs, calls
each one it cannot work out ``unk__N``. Those names are the session's, not the model's: a dim
named so that the model does not name itself is reported as None, as onnxruntime reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from .graph import GraphView, dims


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as onnxruntime describes it: name, ``"tensor(float)"``-style
    type, and shape (ints, dim_param strings, None for unknown dims)."""

    name: str
    type: str
    shape: list[int | str | None]

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def node_arg(graph: GraphView, name: str) -> NodeArg:
    """The :class:`NodeArg` of tensor ``name`` of ``graph``."""
    vi = graph.value_info(name)
    if vi is None or vi.type.WhichOneof("value") is None:
        return NodeArg(name, "tensor(undefined)", [])
    return NodeArg(name, type_string(vi.type),
                   [None if graph.invented(d) else d for d in shape(vi.type)])


def elem_type_string(elem_type: int) -> str:
    """ONNX's name of a tensor element type: ``"float"``, ``"float8e4m3fn"``."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return "undefined"


def type_string(type_proto: onnx.TypeProto) -> str:
    """ONNX's ``DataTypeUtils::ToString`` of ``type_proto``: ``"seq(tensor(float))"``."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({elem_type_string(type_proto.tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_string(type_proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_string(type_proto.optional_type.elem_type)})"
    if kind == "map_type":
        m = type_proto.map_type
        return f"map({elem_type_string(m.key_type)},{type_string(m.value_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({elem_type_string(type_proto.sparse_tensor_type.elem_type)})"
    if kind == "opaque_type":
        o = type_proto.opaque_type
        return f"opaque({o.domain + ',' if o.domain else ''}{o.name})"
    return "tensor(undefined)"


def shape(type_proto: onnx.TypeProto) -> list[int | str | None]:
    """onnxruntime's ``NodeArg::Shape()`` as its binding lists it (see the module docstring)."""
    kind = type_proto.WhichOneof("value")
    if kind == "optional_type":
        inner = type_proto.optional_type.elem_type
        if inner.WhichOneof("value") != "tensor_type":
            return []
        type_proto, kind = inner, "tensor_type"
    if kind == "tensor_type":
        return list(dims(type_proto.tensor_type.shape))
    if kind == "sparse_tensor_type":
        return list(dims(type_proto.sparse_tensor_type.shape))
    return []
