"""Running a partitioned graph: partitions in plan order, tensors handed from one to the next.

The executor is ONNX Runtime's sequential executor one level up: instead of kernels it calls
the :class:`~ep.framework.provider.CompiledNode` of each partition, feeding it the partition's
inputs from an environment of live tensors (feeds, initializers on demand, earlier partitions'
outputs). A tensor is dropped from the environment as soon as the last partition that reads it
has run, unless it is a requested output, so peak host memory follows the plan, not the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from npu_sim import dtypes

from ..errors import EPFail, InvalidArgument
from .graph import GraphView
from .partitioner import PartitionPlan
from .provider import CompiledNode

_KNOWN = {dtypes.to_numpy(name) for name in dtypes.DTYPES}


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
        self._last_use: dict[str, int] = {}
        for k, part in enumerate(plan.partitions):
            for name in part.inputs:
                self._last_use[name] = k

    def run(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """Compute ``output_names`` (default: all graph outputs) from ``feeds``."""
        graph = self.graph
        wanted = list(graph.outputs if output_names is None else output_names)
        for name in wanted:
            if name not in graph.outputs:
                raise InvalidArgument(f"Invalid output name: {name}; outputs are {graph.outputs}")
        env = self._check_feeds(feeds)
        keep = set(wanted)
        for k, part in enumerate(self.plan.partitions):
            if not part.outputs:
                continue
            args = [self._value(env, name) for name in part.inputs]
            results = self.compiled[part.name].run(args)
            if len(results) != len(part.outputs):
                raise EPFail(
                    f"{part.provider} partition {part.name!r} returned {len(results)} outputs, "
                    f"expected {len(part.outputs)} {part.outputs}"
                )
            env.update(zip(part.outputs, results, strict=True))
            for name in part.inputs:
                if self._last_use[name] == k and name not in keep:
                    env.pop(name, None)
        return [self._value(env, name) for name in wanted]

    def _value(self, env: dict[str, np.ndarray], name: str) -> np.ndarray:
        if name in env:
            return env[name]
        value = self.graph.constant(name)
        if value is None:
            raise EPFail(f"tensor {name!r} was needed before any partition produced it")
        return value

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        graph = self.graph
        unknown = [n for n in feeds if n not in graph.inputs]
        if unknown:
            raise InvalidArgument(f"Invalid input name: {unknown[0]}; inputs are {graph.inputs}")
        missing = [n for n in graph.inputs if n not in feeds]
        if missing:
            raise InvalidArgument(f"Missing Input: {missing[0]}")
        env: dict[str, np.ndarray] = {}
        for name in graph.inputs:
            value = np.asarray(feeds[name])
            dtype, shape = graph.tensor_type(name)
            actual = dtypes.from_numpy(value.dtype) if value.dtype in _KNOWN else str(value.dtype)
            if dtype is not None and actual != dtype:
                raise InvalidArgument(
                    f"Unexpected input data type for {name!r}. Actual: ({actual}) , "
                    f"expected: ({dtype})"
                )
            if shape is not None and not _fits(value.shape, shape):
                raise InvalidArgument(
                    f"Got invalid dimensions for input: {name} for the following indices; "
                    f"got shape {value.shape}, expected {shape}"
                )
            env[name] = value
        return env



def _fits(actual: tuple[int, ...], declared: tuple[int | str | None, ...]) -> bool:
    """True if a concrete shape matches a declared one (symbolic/unknown dims match anything)."""
    if len(actual) != len(declared):
        return False
    return all(not isinstance(d, int) or d == a for a, d in zip(actual, declared, strict=True))
