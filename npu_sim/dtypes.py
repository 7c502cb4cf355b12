"""Tensor data types and shapes as the device sees them.

The device names a dtype by a short string (``"float32"``, ``"bfloat16"``, ``"int8"``...), the
same string everywhere: in kernel launches, in the cost model, in context binaries and in traces.
:class:`TensorSpec` is the config-independent description of a tensor (shape and dtype) that the
cost model and traces use without ever touching tensor data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from .errors import ConfigError

# name -> (numpy dtype, ONNX TensorProto enum). The order is the stable dtype code used by the
# binary format (index in this table), so append only.
_TABLE: tuple[tuple[str, np.dtype, int], ...] = (
    ("float32", np.dtype(np.float32), TensorProto.FLOAT),
    ("float16", np.dtype(np.float16), TensorProto.FLOAT16),
    ("bfloat16", np.dtype(ml_dtypes.bfloat16), TensorProto.BFLOAT16),
    ("int8", np.dtype(np.int8), TensorProto.INT8),
    ("uint8", np.dtype(np.uint8), TensorProto.UINT8),
    ("int32", np.dtype(np.int32), TensorProto.INT32),
    ("int64", np.dtype(np.int64), TensorProto.INT64),
    ("bool", np.dtype(np.bool_), TensorProto.BOOL),
    ("float64", np.dtype(np.float64), TensorProto.DOUBLE),
    ("int16", np.dtype(np.int16), TensorProto.INT16),
    ("uint16", np.dtype(np.uint16), TensorProto.UINT16),
    ("uint32", np.dtype(np.uint32), TensorProto.UINT32),
    ("uint64", np.dtype(np.uint64), TensorProto.UINT64),
)

DTYPES: tuple[str, ...] = tuple(name for name, _, _ in _TABLE)
_BY_NAME = {name: (np_dtype, onnx_type) for name, np_dtype, onnx_type in _TABLE}
_BY_NUMPY = {np_dtype: name for name, np_dtype, _ in _TABLE}
_BY_ONNX = {onnx_type: name for name, _, onnx_type in _TABLE}


def _unknown(value: object) -> ConfigError:
    return ConfigError("dtype", value, f"one of {list(DTYPES)}")


def to_numpy(name: str) -> np.dtype:
    """The numpy dtype for a device dtype name (bfloat16 comes from ml_dtypes)."""
    try:
        return _BY_NAME[name][0]
    except KeyError:
        raise _unknown(name) from None


def from_numpy(dtype: np.dtype | type) -> str:
    """The device dtype name of a numpy dtype."""
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise _unknown(str(dtype)) from None


def to_onnx(name: str) -> int:
    """The ONNX ``TensorProto`` element type for a device dtype name."""
    try:
        return _BY_NAME[name][1]
    except KeyError:
        raise _unknown(name) from None


def from_onnx(elem_type: int) -> str:
    """The device dtype name of an ONNX ``TensorProto`` element type."""
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        raise _unknown(elem_type) from None


def code(name: str) -> int:
    """Stable small-integer code of a dtype, used by binary formats."""
    if name not in _BY_NAME:
        raise _unknown(name)
    return DTYPES.index(name)


def from_code(value: int) -> str:
    """Inverse of :func:`code`."""
    if not 0 <= value < len(DTYPES):
        raise ConfigError("dtype code", value, f"an integer in [0, {len(DTYPES) - 1}]")
    return DTYPES[value]


def itemsize(name: str) -> int:
    """Bytes per element."""
    return to_numpy(name).itemsize


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor: the config-independent part the cost model works from."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ConfigError("shape", self.shape, "non-negative dimensions")
        to_numpy(self.dtype)

    @classmethod
    def of(cls, array: np.ndarray) -> TensorSpec:
        return cls(tuple(array.shape), from_numpy(array.dtype))

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)
