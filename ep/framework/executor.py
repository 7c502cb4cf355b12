"""Running a partitioned graph: partitions in plan order, tensors handed from one to the next.

The executor is ONNX Runtime's sequential executor one level up: instead of kernels it calls
the :class:`~ep.framework.provider.CompiledNode` of each partition, feeding it the partition's
inputs from an environment of live tensors (feeds, initializers on demand, earlier partitions'
outputs). A tensor is dropped from the environment as soon as the last partition that reads it
has run, unless it is a requested output, so peak host memory follows the plan, not the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime import OrtValue

from ..errors import EPFail, InvalidArgument, RuntimeException
from .graph import GraphView
from .node_args import elem_type_string
from .partitioner import PartitionPlan
from .provider import CompiledNode


class PlanExecutor:
    """Runs a :class:`PartitionPlan` with one compiled node per partition (keyed by name)."""

    def __init__(
        self, graph: GraphView, plan: PartitionPlan, compiled: Mapping[str, CompiledNode]
    ) -> None:
        missing = [p.name for p in plan.partitions if p.name not in compiled]
        if missing:
            raise InvalidArgument(
                f"no compiled node for partitions {missing}; have {sorted(compiled)}"
            )
        self.graph = graph
        self.plan = plan
        self.compiled = dict(compiled)
        self._producer: dict[str, int] = {}
        for k, part in enumerate(plan.partitions):
            for name in part.outputs:
                self._producer[name] = k
        self._plans: dict[tuple[str, ...], tuple[list[int], dict[str, int],
                                                 dict[int, tuple[bool, ...]]]] = {}
        self.last_ran: list[str] = []
        """Names of the partitions the latest run executed, in order."""
        self._defaults: dict[str, np.ndarray] = {}  # overridable initializers' values, decoded

    def _schedule(self, wanted: tuple[str, ...]
                  ) -> tuple[list[int], dict[str, int], dict[int, tuple[bool, ...]]]:
        """The partitions ``wanted`` needs (every one that produces, directly or through others,
        a wanted output), in plan order, where each tensor is last read among them, and for a
        partition some of whose outputs nothing needs, which ones are (what
        :meth:`CompiledNode.run_partial` gets). Partial runs (``run(output_names=[...])``)
        execute only these, as PPLNN's partial execution does; cached per output set."""
        cached = self._plans.get(wanted)
        if cached is not None:
            return cached
        needed: set[int] = set()
        pending = [self._producer[n] for n in wanted if n in self._producer]
        while pending:
            k = pending.pop()
            if k in needed:
                continue
            needed.add(k)
            pending.extend(self._producer[n] for n in self.plan.partitions[k].inputs
                           if n in self._producer)
        order = sorted(needed)
        last_use: dict[str, int] = {}
        for k in order:
            for name in self.plan.partitions[k].inputs:
                last_use[name] = k
        used = set(wanted) | set(last_use)
        subsets: dict[int, tuple[bool, ...]] = {}
        for k in order:
            mask = tuple(name in used for name in self.plan.partitions[k].outputs)
            if not all(mask):
                subsets[k] = mask
        self._plans[wanted] = (order, last_use, subsets)
        return order, last_use, subsets

    def run(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """Compute ``output_names`` (default: all graph outputs) from ``feeds``."""
        graph = self.graph
        wanted = list(graph.outputs if output_names is None else output_names)
        for name in wanted:
            if name not in graph.outputs:
                raise InvalidArgument(f"Invalid output name:{name}")
        env = check_feeds(graph, feeds)
        keep = set(wanted)
        order, last_use, subsets = self._schedule(tuple(wanted))
        self.last_ran = []
        for k in order:
            part = self.plan.partitions[k]
            if not part.outputs:
                continue
            self.last_ran.append(part.name)
            args = [self._value(env, name) for name in part.inputs]
            mask = subsets.get(k)
            node = self.compiled[part.name]
            results = node.run(args) if mask is None else node.run_partial(args, mask)
            if len(results) != len(part.outputs):
                raise EPFail(
                    f"{part.provider} partition {part.name!r} returned {len(results)} outputs, "
                    f"expected {len(part.outputs)} {part.outputs}"
                )
            env.update((name, value) for name, value, use in
                       zip(part.outputs, results, mask or (True,) * len(results), strict=True)
                       if use)
            for name in part.inputs:
                if last_use[name] == k and name not in keep:
                    env.pop(name, None)
        return [self._value(env, name) for name in wanted]

    def _value(self, env: dict[str, np.ndarray], name: str) -> np.ndarray:
        if name in env:
            return env[name]
        if name in self.graph.overridable:  # not fed: the initializer's value
            value = self._defaults.get(name)
            if value is None:
                value = self._defaults[name] = numpy_helper.to_array(
                    self.graph.overridable[name])
            return value
        value = self.graph.constant(name)
        if value is None:
            raise EPFail(f"tensor {name!r} was needed before any partition produced it")
        return value


def type_string(elem_type: int) -> str:
    """ONNX Runtime's type string of an ONNX element type: ``"tensor(float)"``."""
    return f"tensor({elem_type_string(elem_type)})"


def tensor_feed(name: str, raw: Any, elem_type: int) -> np.ndarray:
    """A feed of a tensor input as onnxruntime's Python binding takes it: a numpy array as it
    is; a list made an array of the input's type (``[1.5, 2.7]`` for int64 is ``[1, 2]``; a
    string input takes ``str`` of each element); anything else is its ``RuntimeError``
    (:class:`~ep.errors.RuntimeException`): a scalar, numpy's included, or a tuple, string or
    buffer. onnxruntime's own ``OrtValue`` of a tensor is taken as its array."""
    if isinstance(raw, np.ndarray):
        return raw
    if isinstance(raw, OrtValue) and raw.is_tensor():
        return raw.numpy()
    if isinstance(raw, list):
        try:
            if elem_type == onnx.TensorProto.STRING:
                items = np.array(raw, dtype=object)
                return np.vectorize(str, otypes=[object])(items) if items.size else items
            return np.array(raw, dtype=helper.tensor_dtype_to_np_dtype(elem_type))
        except (ValueError, TypeError, OverflowError, KeyError):
            raise RuntimeException("Could not create tensor from given input list") from None
    if isinstance(raw, (bool, int, float, complex, np.generic)):
        raise RuntimeException(f"Unable to handle object of type {type(raw)}")
    raise RuntimeException(f"Input must be a list of dictionaries or a single numpy array for "
                           f"input '{name}'.")


def _optional(graph: GraphView, name: str) -> bool:
    vi = graph.value_info(name)
    return vi is not None and vi.type.HasField("optional_type")


def check_present(graph: GraphView, feeds: Mapping[str, Any]) -> None:
    """The ``ValueError`` of onnxruntime's Python layer if a required input is not fed."""
    missing = [n for n in graph.inputs if n not in feeds and not _optional(graph, n)]
    if missing:
        raise ValueError(f"Required inputs ({missing}) are missing from input feed "
                         f"({list(feeds)}).")


def check_feeds(graph: GraphView, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``feeds`` against the graph inputs with onnxruntime's messages and classes: a
    missing input is the ``ValueError`` of its Python layer, the rest its ``InvalidArgument``.
    Inputs of an optional type may be left out: they are None, as onnxruntime takes them."""
    check_present(graph, feeds)
    out: dict[str, Any] = {n: None for n in graph.inputs if n not in feeds}
    for name, raw in feeds.items():
        if name not in graph.inputs and name not in graph.overridable:
            raise InvalidArgument(f"Invalid input name: {name}")
        vi = graph.value_info(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            # Sequences (lists of arrays) and optionals go to onnxruntime as given: numpy would
            # turn a list of equal-shape arrays into one tensor and fail on unequal ones.
            out[name] = raw
            continue
        tt = vi.type.tensor_type
        value = tensor_feed(name, raw, tt.elem_type)
        try:
            actual = helper.np_dtype_to_tensor_dtype(value.dtype)
        except (KeyError, ValueError, TypeError):
            actual = onnx.TensorProto.UNDEFINED
        if actual != tt.elem_type:
            shown = type_string(actual) if actual else f"numpy {value.dtype}"
            raise InvalidArgument(f"Unexpected input data type. Actual: ({shown}) , expected: "
                                  f"({type_string(tt.elem_type)})")
        if tt.shape.dim:  # onnxruntime checks no shape declared with no dims (a scalar)
            dims = list(tt.shape.dim)
            if len(dims) != value.ndim:
                raise InvalidArgument(
                    f"Invalid rank for input: {name} Got: {value.ndim} Expected: {len(dims)} "
                    "Please fix either the inputs/outputs or the model.")
            bad = [f" index: {k} Got: {value.shape[k]} Expected: {d.dim_value}"
                   for k, d in enumerate(dims)
                   if d.HasField("dim_value") and d.dim_value != value.shape[k]]
            if bad:
                raise InvalidArgument(
                    f"Got invalid dimensions for input: {name} for the following indices\n"
                    + "\n".join(bad) + "\n Please fix either the inputs/outputs or the model.")
        out[name] = value
    return out
