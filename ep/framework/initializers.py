"""Initializers the caller supplies: ``SessionOptions.add_initializer`` and
``add_external_initializers``, applied to the model as a session loads it.

onnxruntime uses such an ``OrtValue`` in place of the model's initializer of that name:

- ``add_external_initializers`` supplies the data of initializers the model stores in external
  files (the files need not exist). The name must be such an initializer of the main graph, and
  the value must have its type and dimensions; anything else is onnxruntime's ``Fail``, with its
  words (``ReplaceInitializedTensorImpl``).
- ``add_initializer`` replaces an initializer the model holds; a name it does not hold changes
  nothing. onnxruntime fails a value of another type when the session initializes, and one of
  other dimensions only when a kernel reads it (a ``Gemm``'s "Dimension mismatch"); the session
  refuses both when it is created, with ``Fail`` naming the initializer and both shapes.

The value's bytes are read when the session is created: a later change to the ``OrtValue``'s
memory does not reach that session (nor onnxruntime's, whose kernels prepack such weights).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ..errors import Fail, InvalidArgument, RuntimeException
from .external_data import uses_external_data


def check_value(name: Any, value: Any) -> str:
    """``name`` as a string, once ``value`` is an ``OrtValue`` (onnxruntime's own, which
    ``ep.OrtValue`` is), as ``add_initializer`` checks its arguments."""
    if not isinstance(value, ort.OrtValue):
        raise RuntimeException(f"The provided Python object must be an OrtValue; initializer "
                               f"{name!r} was given a {type(value).__module__}."
                               f"{type(value).__qualname__}")
    return str(name)


def add(table: dict[str, Any], name: str, value: Any) -> None:
    """Record ``value`` for ``name`` in ``table``, once (onnxruntime's check)."""
    if name in table:
        raise InvalidArgument(f"An OrtValue for this name has already been added: {name}")
    table[name] = value


def apply(model: onnx.ModelProto, raw: dict[str, memoryview], *,
          values: Mapping[str, Any], external: Mapping[str, Any]) -> None:
    """Put the caller's values into ``model``'s main-graph initializers: ``external`` (from
    ``add_external_initializers``) before the external data is read, ``values`` (from
    ``add_initializer``) over what the model holds. ``raw``: the ``raw_data`` the load took out
    of initializers (:mod:`.wire`), by name; a replaced initializer's entry goes."""
    if not values and not external:
        return
    by_name = {t.name: t for t in model.graph.initializer}
    for name, value in external.items():
        tensor = by_name.get(name)
        where = "ReplaceInitializedTensorImpl"
        if tensor is None:
            raise Fail(f"{where} Failed to find existing initializer with name {name}.")
        if not uses_external_data(tensor):
            raise Fail(f"{where} Trying to replace non-external initializer with external data "
                       f"({name!r})")
        array = _array(name, value)
        if tuple(tensor.dims) != array.shape:
            raise Fail(f"{where} Replacement tensor's dimensions do not match. ({name!r}: the "
                       f"model's {list(tensor.dims)}, the OrtValue's {list(array.shape)})")
        if tensor.data_type != _data_type(name, array):
            raise Fail(f"{where} Replacement tensor's data type does not match. ({name!r}: the "
                       f"model's {_type_name(tensor.data_type)}, the OrtValue's "
                       f"{_type_name(_data_type(name, array))})")
        _store(tensor, raw, array)
    for name, value in values.items():
        tensor = by_name.get(name)
        if tensor is None:
            continue
        array = _array(name, value)
        if tensor.data_type != _data_type(name, array) or tuple(tensor.dims) != array.shape:
            raise Fail(f"initializer {name!r} added with SessionOptions.add_initializer is "
                       f"{_type_name(_data_type(name, array))}{list(array.shape)}; the model's "
                       f"is {_type_name(tensor.data_type)}{list(tensor.dims)}")
        _store(tensor, raw, array)


def _array(name: str, value: Any) -> np.ndarray:
    """The values of a CPU tensor ``OrtValue``."""
    if not value.is_tensor() or value.device_name().lower() != "cpu":
        raise Fail(f"initializer {name!r}: the OrtValue must be a tensor on the CPU, got a "
                   f"{'tensor' if value.is_tensor() else 'non-tensor'} on "
                   f"{value.device_name()!r}")
    return np.ascontiguousarray(value.numpy())


def _data_type(name: str, array: np.ndarray) -> int:
    try:
        return helper.np_dtype_to_tensor_dtype(array.dtype)
    except (KeyError, ValueError, TypeError):
        raise Fail(f"initializer {name!r}: an OrtValue of numpy type {array.dtype} has no ONNX "
                   "tensor type") from None


def _type_name(data_type: int) -> str:
    return onnx.TensorProto.DataType.Name(data_type).lower()


def _store(tensor: onnx.TensorProto, raw: dict[str, memoryview], array: np.ndarray) -> None:
    """``tensor`` holding ``array``'s bytes in ``raw_data``, nothing else."""
    raw.pop(tensor.name, None)
    data_type, dims, name = tensor.data_type, list(tensor.dims), tensor.name
    tensor.Clear()
    tensor.name, tensor.data_type = name, data_type
    tensor.dims.extend(dims)
    if data_type == onnx.TensorProto.STRING:
        tensor.string_data.extend(v.encode() if isinstance(v, str) else bytes(v)
                                  for v in array.ravel())
    else:
        tensor.raw_data = array.tobytes()
