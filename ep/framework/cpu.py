"""The CPU fallback provider: whatever no other provider takes runs on onnxruntime's CPU EP.

Like ONNX Runtime's own ``CPUExecutionProvider`` it claims every node it is offered (the
partitioner always asks it last). Each CPU partition's fused subgraph becomes a small ONNX model
with the source model's opset imports, run by an ``onnxruntime.InferenceSession`` restricted to
``CPUExecutionProvider``. Threads: the provider option ``intra_op_num_threads`` if given, else the
session config entry ``session.intra_op.num_threads``, else onnxruntime's default.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .. import errors
from ..errors import EPFail, InvalidArgument
from .graph import GraphView
from .options import INTRA_OP_THREADS
from .provider import CompiledNode, ComputeCapability, ExecutionProvider, FusedNode
from .registry import register_provider

THREADS_OPTION = "intra_op_num_threads"
_MIN_IR_VERSION = 7  # initializers need not be graph inputs from IR 4; 7 is ORT's floor here


def fused_model(fused: FusedNode) -> onnx.ModelProto:
    """A standalone ONNX model of a fused node's subgraph, with the source opset imports."""
    opsets = list(fused.opset_imports)
    ir_version = max(_MIN_IR_VERSION, helper.find_min_ir_version_for(opsets, True))
    return helper.make_model(fused.graph, opset_imports=opsets, ir_version=ir_version)


def same_error(exc: Exception) -> type[errors.OrtError]:
    """The ``ep.errors`` class named like onnxruntime's exception (``InvalidGraph``,
    ``RuntimeException``...), so a refusal the CPU fallback passes on keeps onnxruntime's
    status; ``EPFail`` for anything else."""
    found = getattr(errors, type(exc).__name__, None)
    return found if isinstance(found, type) and issubclass(found, errors.OrtError) else EPFail


class OrtCompiledNode(CompiledNode):
    """A fused subgraph run by an onnxruntime CPU session."""

    def __init__(self, fused: FusedNode, options: ort.SessionOptions) -> None:
        self.name = fused.name
        self.inputs = list(fused.inputs)
        self.outputs = list(fused.outputs)
        self._session: ort.InferenceSession | None = None
        if self.outputs:  # a partition nothing reads is dead code: nothing to run
            try:
                self._session = ort.InferenceSession(
                    fused_model(fused).SerializeToString(),
                    sess_options=options,
                    providers=["CPUExecutionProvider"],
                )
            except Exception as exc:  # onnxruntime raises its own exception types
                raise same_error(exc)(
                    f"CPUExecutionProvider could not compile partition {fused.name!r}: {exc}"
                ) from None

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the subgraph on onnxruntime; outputs in ``FusedNode.outputs`` order."""
        if len(inputs) != len(self.inputs):
            raise InvalidArgument(
                f"partition {self.name!r} takes {len(self.inputs)} inputs {self.inputs}, "
                f"got {len(inputs)}"
            )
        if self._session is None:
            return []
        feeds = dict(zip(self.inputs, inputs, strict=True))
        try:
            return list(self._session.run(self.outputs, feeds))
        except Exception as exc:
            raise same_error(exc)(
                f"CPUExecutionProvider failed running {self.name!r}: {exc}") from None


class CPUExecutionProvider(ExecutionProvider):
    """Runs every node offered to it, on onnxruntime's CPU execution provider."""

    type = "CPUExecutionProvider"

    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        """All unassigned nodes as one group; the partitioner splits it into acyclic parts."""
        nodes = tuple(i for i in range(len(graph.nodes)) if i not in graph.assigned)
        return [ComputeCapability(nodes)] if nodes else []

    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        """One onnxruntime CPU session per fused node."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        threads = self._threads()
        if threads is not None:
            options.intra_op_num_threads = threads
        return [OrtCompiledNode(fused, options) for fused in fused_nodes]

    def _threads(self) -> int | None:
        for source, key in (
            (self.context.provider_options, THREADS_OPTION),
            (self.context.session_config, INTRA_OP_THREADS),
        ):
            value = source.get(key)
            if value is None or value == "":
                continue
            try:
                threads = int(value)
            except ValueError:
                threads = -1
            if threads < 0:
                raise InvalidArgument(
                    f"{key}={value!r} is invalid; expected an integer >= 0 (0 = default)"
                )
            return threads
        return None


register_provider(CPUExecutionProvider.type, CPUExecutionProvider, priority=0)
