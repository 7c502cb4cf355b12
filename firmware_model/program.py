"""Compiled programs: what the EP compiler produces and the firmware's loader runs.

A :class:`Program` is one compiled graph (one EPContext partition). It holds

- ``tensors``: every tensor the program touches, each placed in a *region* at an offset: the
  activation ``ARENA`` (inputs, outputs and intermediates, reused by liveness) or the read-only
  ``WEIGHTS`` region;
- ``launches``: the kernel launches (op type, input/output tensor indices, attributes), which
  KERNEL commands refer to by index;
- ``commands``: the packed command stream (see :mod:`firmware_model.commands`), whose addresses
  are *relocatable*: a region number in the top byte and an offset below it, patched to real HBM
  addresses by the loader once the regions are allocated;
- ``weights``: the raw little-endian bytes of each weight tensor, by tensor index;
- ``inputs`` / ``outputs``: the tensor indices of the graph inputs and outputs, in order.

Attribute values are restricted to plain data (int, float, str, bytes and tuples of int, float
or str) so a program can be serialized without pickling and loaded without evaluating anything.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from npu_sim import dtypes

AttrValue = int | float | str | bytes | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]

REGION_SHIFT = 56
OFFSET_MASK = (1 << REGION_SHIFT) - 1


class Region(IntEnum):
    """Address spaces of a program. ``ABSOLUTE`` addresses are real HBM addresses."""

    ABSOLUTE = 0
    ARENA = 1
    WEIGHTS = 2
    HOST = 3


def reloc(region: Region, offset: int) -> int:
    """A relocatable address: ``region`` in the top byte, ``offset`` below."""
    if not 0 <= offset <= OFFSET_MASK:
        raise ValueError(f"offset {offset} outside [0, {OFFSET_MASK}]")
    return (int(region) << REGION_SHIFT) | offset


def split_reloc(address: int) -> tuple[int, int]:
    """``(region number, offset)`` of a relocatable address."""
    return address >> REGION_SHIFT, address & OFFSET_MASK


@dataclass(frozen=True)
class TensorDesc:
    """A tensor of a program: name, static shape, dtype and where it lives."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: Region
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtypes.itemsize(self.dtype)

    @property
    def spec(self) -> dtypes.TensorSpec:
        return dtypes.TensorSpec(self.shape, self.dtype)


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel invocation. ``inputs`` uses -1 for an omitted optional input."""

    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    node: str = ""


@dataclass(frozen=True)
class Program:
    """One compiled graph. See the module docstring for the meaning of each field."""

    name: str
    tensors: tuple[TensorDesc, ...]
    launches: tuple[KernelLaunch, ...]
    commands: bytes
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    weights: Mapping[int, bytes]
    arena_bytes: int
    hardware_architecture: str = ""

    @functools.cached_property  # a frozen program's tensors never change
    def weights_bytes(self) -> int:
        """Size of the WEIGHTS region: the end of its last tensor (computed once: the loader and
        the weight store each ask, a walk over every tensor each time)."""
        ends = [t.offset + t.nbytes for t in self.tensors if t.region == Region.WEIGHTS]
        return max(ends, default=0)

    def input_descs(self) -> list[TensorDesc]:
        return [self.tensors[i] for i in self.inputs]

    def output_descs(self) -> list[TensorDesc]:
        return [self.tensors[i] for i in self.outputs]
