"""Typed attributes of ``SessionOptions`` and ``RunOptions``, checked when they are set.

onnxruntime's options are pybind11 classes: assigning ``intra_op_num_threads = "x"`` or
``graph_optimization_level = 1`` is a ``TypeError`` there and then, and what is stored is the
converted value (``True`` for an int is 1, ``0.0`` for a bool is False). :class:`Option` does
the same for each attribute, with a message that names the attribute, the value and what would
be valid; a bad value never reaches session creation (where it was a raw ``ValueError``).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

INT32 = range(-(2**31), 2**31)


def int32(value: Any) -> int:
    """An integer (``bool`` and numpy integers too) in the int32 range, as pybind11 converts."""
    if isinstance(value, (str, bytes, float)):
        raise TypeError("an integer")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("an integer") from None
    if number not in INT32:
        raise TypeError("an integer in the int32 range")
    return number


def boolean(value: Any) -> bool:
    """A truth value: ``None``, a bool or any number (pybind11 refuses strings)."""
    if value is None or isinstance(value, (bool, int, float, np.bool_, np.number)):
        return bool(value)
    raise TypeError("a bool")


def text(value: Any) -> str:
    """A ``str`` (``bytes`` are decoded as UTF-8, as pybind11 does; paths are refused)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError("a str")


def member(kind: type[enum.IntEnum]) -> Callable[[Any], enum.IntEnum]:
    """A member of ``kind``, or of onnxruntime's enum of that name (its value taken); a plain
    integer is refused, as onnxruntime refuses it."""
    def convert(value: Any) -> enum.IntEnum:
        if isinstance(value, kind):
            return value
        if type(value).__name__ == kind.__name__ and int(getattr(value, "value", -1)) in \
                {m.value for m in kind}:
            return kind(int(value.value))
        raise TypeError(f"a {kind.__name__} member ({', '.join(m.name for m in kind)})")
    return convert


class Option:
    """A data descriptor storing ``convert(value)`` under its name in the instance's
    ``_values`` dict (the owner's one slot for them); a value ``convert`` refuses is a
    ``TypeError`` naming the attribute, the value and what is expected. ``default`` is what a
    new :class:`TypedOptions` holds."""

    def __init__(self, convert: Callable[[Any], Any], default: Any) -> None:
        self.convert, self.default = convert, default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.owner = name, owner.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._values[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        try:
            converted = self.convert(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"{self.owner}.{self.name} = {value!r}: expected {exc}") from None
        obj._values[self.name] = converted


class TypedOptions:
    """A class of :class:`Option` attributes, each set to its default on creation."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        for option in _options(type(self)):
            option.__set__(self, option.default)


@functools.cache
def _options(cls: type) -> tuple[Option, ...]:
    """The :class:`Option` attributes of ``cls`` and its bases."""
    return tuple(value for klass in reversed(cls.__mro__) for value in vars(klass).values()
                 if isinstance(value, Option))
