"""``IOBinding`` and ``OrtValue`` runs, in the shape of onnxruntime's.

onnxruntime binds a run's inputs and outputs to memory ahead of the run
(``session.io_binding()``, ``run_with_iobinding``) and passes values as ``OrtValue``s
(``run_with_ort_values``). The values here are onnxruntime's own ``OrtValue`` class, on the CPU
(as in onnxruntime's CPU build, a device other than ``"cpu"`` cannot be bound): the session runs
on arrays, so binding reads the bound memory at the run, and an output bound to memory (a
pointer, or an ``OrtValue``) is written into it. Errors are onnxruntime's: an input name the
model lacks fails at binding, everything else in the run, as ``RuntimeError`` ("Error in
execution: ...", here :class:`~ep.errors.RuntimeException`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnxruntime import OrtValue

from ..errors import NotImplemented as OrtNotImplemented
from ..errors import OrtError, RuntimeException

if TYPE_CHECKING:
    from .graph import GraphView
    from .session import InferenceSession


def cpu_array(device_type: str, element_type: Any, shape: Sequence[int],
              buffer_ptr: int, what: str) -> np.ndarray:
    """The array over ``buffer_ptr`` (host memory the caller owns), for a ``"cpu"`` binding.
    What can be checked is: the device, the element type, the shape (non-negative integers)
    and the pointer (a positive integer); that it points at that many bytes is the caller's
    word, as in onnxruntime."""
    where = f"Error when binding {what}"
    if str(device_type).lower() != "cpu":
        raise RuntimeException(f"{where}: there's no data transfer registered for tensors on "
                               f"device {device_type!r}; only 'cpu' binds here")
    try:
        dtype = np.dtype(element_type)
    except TypeError:
        raise RuntimeException(f"{where}: element_type {element_type!r} is not a numpy "
                               "type") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise RuntimeException(f"{where}: element_type {dtype} has no fixed-size elements")
    if not isinstance(shape, Sequence) or isinstance(shape, str) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
            for d in shape):
        raise RuntimeException(f"{where}: shape {shape!r} must be a list of integers >= 0")
    if isinstance(buffer_ptr, bool) or not isinstance(buffer_ptr, (int, np.integer)) or \
            buffer_ptr <= 0:
        raise RuntimeException(f"{where}: buffer_ptr {buffer_ptr!r} must be the address of "
                               "host memory (an integer > 0, as array.ctypes.data)")
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    return np.frombuffer(raw, dtype).reshape(tuple(int(d) for d in shape))


def owned(value: Any, graph: GraphView, name: str) -> OrtValue:
    """Output ``name`` of a run, ``value``, as an ``OrtValue`` of memory its own, of the
    output's ONNX type, as onnxruntime's runs make them: ``numpy()`` of it is a view that keeps
    that memory alive. (``ortvalue_from_numpy``'s is not: it views ``value``, which only the
    Python ``OrtValue`` holds, so ``[v.numpy() for v in run_with_ort_values(...)]`` read freed
    memory.) onnxruntime's Python API makes no string ``OrtValue`` and no sequence or map:
    those are ``NotImplemented``."""
    if not isinstance(value, np.ndarray) or value.dtype.hasobject:
        raise _no_ortvalue(name, value)
    vi = graph.value_info(name)
    elem_type = vi.type.tensor_type.elem_type if vi is not None else 0
    out = OrtValue.ortvalue_from_shape_and_type(value.shape, elem_type or value.dtype)
    out.update_inplace(value)
    return out


def _no_ortvalue(name: str, value: Any) -> OrtNotImplemented:
    kind = "string tensor" if isinstance(value, np.ndarray) else type(value).__name__
    return OrtNotImplemented(f"output {name!r} is a {kind}: an OrtValue of it cannot be made "
                             "here (onnxruntime's Python API makes tensors of numbers only); "
                             "run() returns it")


def as_arrays(values: dict[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of a ``{name: OrtValue}`` feed (``run_with_ort_values``)."""
    arrays = {}
    for name, value in values.items():
        if not isinstance(value, OrtValue):
            raise TypeError(f"run_with_ort_values(): input {name!r} must be an OrtValue "
                            f"(onnxruntime.OrtValue.ortvalue_from_numpy), got "
                            f"{type(value).__name__}")
        arrays[name] = value.numpy()
    return arrays


class IOBinding:
    """onnxruntime's ``IOBinding`` for a session: inputs and outputs bound by name, then
    ``session.run_with_iobinding(binding)``; ``get_outputs`` / ``copy_outputs_to_cpu`` after."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._input_names = frozenset(i.name for i in session.get_inputs())
        self._inputs: dict[str, Any] = {}  # an array, or an OrtValue read at the run
        self._outputs: dict[str, np.ndarray | OrtValue | None] = {}  # None: allocated by the run
        self._results: list[OrtValue | np.ndarray] = []  # arrays: strings (owned)

    def _input_name(self, name: str) -> str:
        if name not in self._input_names:
            raise RuntimeException(f"Failed to find NodeArg with name: {name} in the def list")
        return name

    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        """Bind input ``name`` to a host array (read when the session runs)."""
        self._inputs[self._input_name(name)] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Sequence[int], buffer_ptr: int) -> None:
        """Bind input ``name`` to ``shape`` elements of ``element_type`` at ``buffer_ptr``."""
        self._inputs[self._input_name(name)] = cpu_array(device_type, element_type, shape,
                                                         buffer_ptr, "input")

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind input ``name`` to an ``OrtValue``."""
        self._inputs[self._input_name(name)] = ortvalue

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Sequence[int] | None = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind output ``name``: into ``buffer_ptr`` (with its element type and shape), or to
        memory the run allocates."""
        self._outputs[name] = None if buffer_ptr is None else \
            cpu_array(device_type, element_type, shape or (), buffer_ptr, "output")

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind output ``name`` to an ``OrtValue``, which the run writes."""
        self._outputs[name] = ortvalue

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound memory is the host's."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: bound memory is the host's."""

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, in the order they were bound."""
        for name, value in zip(self._outputs, self._results, strict=True):
            if not isinstance(value, OrtValue):
                raise _no_ortvalue(name, value)
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the outputs of the last run, as arrays (an ``OrtValue``'s ``numpy()`` is
        a view of its memory, which the next run's outputs replace)."""
        return [np.array(value.numpy() if isinstance(value, OrtValue) else value, copy=True)
                for value in self._results]

    def run(self, run_options: Any = None) -> None:
        """Run the session on the bound inputs, writing or allocating the bound outputs (what
        ``InferenceSession.run_with_iobinding`` calls)."""
        if not self._outputs:
            raise RuntimeException("Error in execution: At least one output should be "
                                   "requested.")
        feeds = {name: value.numpy() if isinstance(value, OrtValue) else value
                 for name, value in self._inputs.items()}
        names = list(self._outputs)
        try:
            values = self._session.run_bound(names, feeds, run_options)
        except (OrtError, ValueError) as exc:  # a missing input is run()'s ValueError
            raise RuntimeException(f"Error in execution: {getattr(exc, 'message', exc)}") \
                from exc
        results = []
        for name, value in zip(names, values, strict=True):
            target = self._outputs[name]
            if target is None:  # an array where an OrtValue cannot be made (owned)
                results.append(value if isinstance(value, np.ndarray) and value.dtype.hasobject
                               else owned(value, self._session._graph, name))
                continue
            bound = target.numpy() if isinstance(target, OrtValue) else target
            if bound.shape != value.shape or bound.dtype != value.dtype:
                raise RuntimeException(
                    f"Error in execution: output {name} is {value.dtype} {list(value.shape)}, "
                    f"bound to {bound.dtype} {list(bound.shape)}")
            if isinstance(target, OrtValue):
                target.update_inplace(np.ascontiguousarray(value))
                results.append(target)
            else:
                np.copyto(target, value)
                results.append(OrtValue.ortvalue_from_numpy(target))
        self._results = results
