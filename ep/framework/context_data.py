"""An EP's context data through the user's functions instead of files (onnxruntime 1.32).

``ModelCompiler.set_ep_context_data_write_func(write_func)`` hands each context binary an EP
would write beside the model (``embed_mode=0``) to ``write_func(name, data)`` instead, and the
EPContext node keeps ``name``; ``SessionOptions.set_ep_context_data_read_func(read_func,
max_data_size)`` has the EP ask ``read_func(name, buffer)`` for it when the model is loaded, so
the binary may be stored anywhere, encrypted, or not at all. ``data`` is an
:class:`OrtEpContextData` (``size``; ``read(offset, length)``), ``buffer`` an
:class:`OrtEpContextDataBuffer` the function must ``allocate(size)`` once, at most
``max_data_size`` bytes, and fill with ``write(data, offset)``; both are valid only while the
function runs, as onnxruntime's. An exception the function raises fails the compilation or the
load with ``Fail`` carrying its message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Fail, InvalidArgument


@dataclass(frozen=True)
class ContextDataFunctions:
    """The user's functions a provider writes and reads its context data through (None: files,
    as by default); ``max_read_size`` bounds what ``read`` may allocate."""

    write: Callable[[str, Any], None] | None = None
    read: Callable[[str, Any], None] | None = None
    max_read_size: int = 0


def check_function(function: Any, method: str) -> None:
    if not callable(function):
        raise TypeError(f"{method}(): incompatible function arguments: the function must be "
                        f"callable, got {type(function).__name__}")


class OrtEpContextData:
    """A context binary offered to a write function: ``size`` bytes, ``read`` in chunks."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._data: memoryview | None = memoryview(data)
        self.size = len(self._data)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """A copy of ``length`` bytes from ``offset`` (to the end when None)."""
        data = self._valid()
        end = self.size if length is None else offset + length
        if offset < 0 or (length is not None and length < 0) or end > self.size:
            raise InvalidArgument(f"OrtEpContextData.read(offset={offset}, length={length}) is "
                                  f"out of range; the data holds {self.size} bytes")
        return bytes(data[offset:end])

    def _valid(self) -> memoryview:
        if self._data is None:
            raise InvalidArgument("OrtEpContextData is valid only while the write function runs")
        return self._data

    def _release(self) -> None:
        self._data = None


class OrtEpContextDataBuffer:
    """What a read function fills: :meth:`allocate` once (at most ``max_size`` bytes), then
    :meth:`write` chunks into it."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._data: bytearray | None = None
        self._open = True

    @property
    def is_allocated(self) -> bool:
        return self._data is not None

    @property
    def size(self) -> int:
        return 0 if self._data is None else len(self._data)

    def allocate(self, size: int) -> None:
        self._check_open()
        if self._data is not None:
            raise InvalidArgument("OrtEpContextDataBuffer.allocate() may be called once")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= self.max_size:
            raise InvalidArgument(f"OrtEpContextDataBuffer.allocate({size!r}): the size must be "
                                  f"an integer from 0 to max_data_size ({self.max_size})")
        self._data = bytearray(size)

    def write(self, data: Any, offset: int = 0) -> None:
        self._check_open()
        if self._data is None:
            raise InvalidArgument("OrtEpContextDataBuffer.write() before allocate()")
        chunk = memoryview(data).cast("B")
        if offset < 0 or offset + len(chunk) > len(self._data):
            raise InvalidArgument(f"OrtEpContextDataBuffer.write() of {len(chunk)} bytes at "
                                  f"offset {offset} overruns the {len(self._data)} allocated")
        self._data[offset:offset + len(chunk)] = chunk

    def _check_open(self) -> None:
        if not self._open:
            raise InvalidArgument("OrtEpContextDataBuffer is valid only while the read "
                                  "function runs")

    def _close(self) -> bytes:
        self._open = False
        return bytes(self._data or b"")


def write_through(functions: ContextDataFunctions, name: str, payload: bytes) -> None:
    """Hand context binary ``name`` to the write function."""
    assert functions.write is not None
    data = OrtEpContextData(payload)
    try:
        _call(functions.write, "write", name, data)
    finally:
        data._release()


def read_through(functions: ContextDataFunctions, name: str) -> bytes:
    """Context binary ``name``, from the read function."""
    assert functions.read is not None
    buffer = OrtEpContextDataBuffer(functions.max_read_size)
    try:
        _call(functions.read, "read", name, buffer)
    finally:
        data = buffer._close()
    if not buffer.is_allocated:
        raise Fail(f"the EPContext data read function for {name!r} returned without "
                   "allocating its buffer")
    return data


def _call(function: Callable[[str, Any], None], kind: str, name: str, view: Any) -> None:
    """``function(name, view)``; an exception it raises is ``Fail`` carrying its message."""
    try:
        function(name, view)
    except Exception as exc:
        raise Fail(f"the EPContext data {kind} function failed for {name!r}: "
                   f"{type(exc).__name__}: {exc}") from None
