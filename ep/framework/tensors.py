"""Checking a model's stored tensors before anything reads them.

A tensor's bytes must be what its type and shape say: ``raw_data`` of exactly ``count x
itemsize`` bytes, or a typed field (``float_data``, ``int64_data``...) with ``count`` values,
and a ``data_type`` ONNX defines. numpy and onnx's helpers raise ``ValueError``, ``KeyError``
or worse on anything else, deep inside whatever first touched the tensor; checking every
initializer and every ``Constant`` value once at load turns them into onnxruntime's ``Fail``,
with its wording.

The check reads each tensor's ``raw_data`` once, and hands the weights' values on
(:func:`check_model_tensors` returns them): protobuf copies the bytes on every read of the
field, so every later stage (partitioning, the NPU compiler) takes these read-only views
instead of decoding the tensor again.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper

from ..errors import Fail
from .shapes import WEIGHT_BYTES

_FIELD_ITEMS = {  # typed field -> values per element (complex types store two)
    "float_data": 1, "int32_data": 1, "string_data": 1, "int64_data": 1, "double_data": 1,
    "uint64_data": 1,
}


_PACKED = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4})
"""Types two elements share a value of a typed field (``int32_data``)."""
_BITS = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4,
         **{getattr(onnx.TensorProto, name): bits for name, bits in (
             ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6))
            if hasattr(onnx.TensorProto, name)}}
"""Types whose elements are packed in ``raw_data``, by bits per element (onnx's
``make_tensor``: 5 FLOAT6E2M3 values are 4 bytes)."""
_UNPACKED = frozenset(_BITS)
"""Types ``numpy_helper.to_array`` unpacks from ``raw_data`` (not a plain view of the bytes)."""
_VIEW_TYPES = frozenset(set(onnx.TensorProto.DataType.values()) - {
    onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING})


def viewable(data_type: int) -> bool:
    """Whether a tensor of ``data_type`` held in ``raw_data`` is a plain numpy view of those
    bytes on this host (what the load may take out of the protobuf, :mod:`.wire`)."""
    return (sys.byteorder == "little" and data_type not in _UNPACKED
            and data_type in _VIEW_TYPES)


def raw_size(data_type: int, count: int) -> int:
    """The bytes of ``raw_data`` holding ``count`` elements of ``data_type`` (a valid type
    other than ``STRING``), packed types rounded up to whole bytes."""
    bits = _BITS.get(data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    return count * helper.tensor_dtype_to_np_dtype(data_type).itemsize


def check_tensor(tensor: onnx.TensorProto, what: str,
                 raw: memoryview | None = None) -> np.ndarray | None:
    """Raise ``Fail`` if ``tensor``'s data does not match its ``data_type`` and ``dims``.

    Returns the tensor's value when it is a weight (:data:`~.shapes.WEIGHT_BYTES` or more)
    held in ``raw_data`` of a type numpy reads as is: a read-only view of the bytes the check
    read (what ``numpy_helper.to_array`` would return, without reading them again); None for
    anything else. ``raw``: the tensor's ``raw_data``, taken out of it at load
    (:mod:`.wire`); then it is the value's storage."""
    valid = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
    if tensor.data_type not in valid:
        raise Fail(f"{what} '{tensor.name}': data_type {tensor.data_type} is not a valid "
                   f"TensorProto data type (expected one of {sorted(valid)})")
    if any(d < 0 for d in tensor.dims):
        raise Fail(f"{what} '{tensor.name}': dims {list(tensor.dims)} has a negative dimension")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    count = math.prod(int(d) for d in tensor.dims)
    if raw is not None or tensor.HasField("raw_data"):
        if tensor.data_type == onnx.TensorProto.STRING:
            raise Fail(f"{what} '{tensor.name}': a string tensor cannot hold raw_data")
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        expected = raw_size(tensor.data_type, count)
        data = tensor.raw_data if raw is None else raw
        if len(data) != expected:
            raise Fail(f"{what} '{tensor.name}': raw_data size ({len(data)} bytes) "
                       f"does not match expected size from shape and data type ({expected} "
                       "bytes)")
        if raw is None and (expected < WEIGHT_BYTES or not viewable(tensor.data_type)
                            or tensor.HasField("segment")):
            return None
        return np.frombuffer(data, dtype=dtype).reshape(tuple(tensor.dims))
    field = helper.tensor_dtype_to_field(tensor.data_type)
    values = len(getattr(tensor, field))
    per = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64,
                                    onnx.TensorProto.COMPLEX128) else 1
    expected = -(-count // 2) if tensor.data_type in _PACKED else count * per
    if values != expected:
        raise Fail(f"{what} '{tensor.name}': data field count ({values}) does not match "
                   f"expected count from shape ({expected})")
    return None


def check_model_tensors(model: onnx.ModelProto,
                        raw: Mapping[str, memoryview] | None = None) -> dict[str, np.ndarray]:
    """Check every initializer and every ``Constant`` node's value of the main graph; returns
    the weights' values by initializer name (see :func:`check_tensor`). ``raw``: the
    ``raw_data`` the load took out of initializers, by name."""
    raw = raw or {}
    weights: dict[str, np.ndarray] = {}
    for tensor in model.graph.initializer:
        value = check_tensor(tensor, "Initializer", raw.get(tensor.name))
        if value is not None:
            weights[tensor.name] = value
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    check_tensor(attr.t, f"Constant node '{node.name}' value")
    return weights


def restore_raw_data(tensors: Iterable[onnx.TensorProto],
                     weights: Mapping[str, np.ndarray]) -> None:
    """Give back ``raw_data`` to the tensors the load took it from (those of ``weights`` that
    have none), for whoever needs the complete protobuf."""
    for tensor in tensors:
        value = weights.get(tensor.name)
        if value is not None and not tensor.HasField("raw_data") and \
                tensor.data_location != onnx.TensorProto.EXTERNAL:
            tensor.raw_data = value.tobytes()
