"""Checking a model's stored tensors before anything reads them.

A tensor's bytes must be what its type and shape say: ``raw_data`` of exactly ``count x
itemsize`` bytes, or a typed field (``float_data``, ``int64_data``...) with ``count`` values,
and a ``data_type`` ONNX defines. numpy and onnx's helpers raise ``ValueError``, ``KeyError``
or worse on anything else, deep inside whatever first touched the tensor; checking every
initializer and every ``Constant`` value once at load turns them into onnxruntime's ``Fail``,
with its wording.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from ..errors import Fail

_FIELD_ITEMS = {  # typed field -> values per element (complex types store two)
    "float_data": 1, "int32_data": 1, "string_data": 1, "int64_data": 1, "double_data": 1,
    "uint64_data": 1,
}


def check_tensor(tensor: onnx.TensorProto, what: str) -> None:
    """Raise ``Fail`` if ``tensor``'s data does not match its ``data_type`` and ``dims``."""
    valid = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
    if tensor.data_type not in valid:
        raise Fail(f"{what} '{tensor.name}': data_type {tensor.data_type} is not a valid "
                   f"TensorProto data type (expected one of {sorted(valid)})")
    if any(d < 0 for d in tensor.dims):
        raise Fail(f"{what} '{tensor.name}': dims {list(tensor.dims)} has a negative dimension")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return
    count = math.prod(int(d) for d in tensor.dims)
    if tensor.HasField("raw_data"):
        if tensor.data_type == onnx.TensorProto.STRING:
            raise Fail(f"{what} '{tensor.name}': a string tensor cannot hold raw_data")
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(tensor.data_type)
        expected = (count * bits + 7) // 8 if bits else count * itemsize
        if len(tensor.raw_data) != expected:
            raise Fail(f"{what} '{tensor.name}': raw_data size ({len(tensor.raw_data)} bytes) "
                       f"does not match expected size from shape and data type ({expected} "
                       "bytes)")
        return
    field = helper.tensor_dtype_to_field(tensor.data_type)
    values = len(getattr(tensor, field))
    per = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64,
                                    onnx.TensorProto.COMPLEX128) else 1
    packed = {onnx.TensorProto.INT4: 2, onnx.TensorProto.UINT4: 2}.get(tensor.data_type)
    expected = -(-count // packed) if packed else count * per
    if values != expected:
        raise Fail(f"{what} '{tensor.name}': data field count ({values}) does not match "
                   f"expected count from shape ({expected})")


def check_model_tensors(model: onnx.ModelProto) -> None:
    """Check every initializer and every ``Constant`` node's value of the main graph."""
    for tensor in model.graph.initializer:
        check_tensor(tensor, "Initializer")
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    check_tensor(attr.t, f"Constant node '{node.name}' value")
