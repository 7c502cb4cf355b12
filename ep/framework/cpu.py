"""The CPU fallback provider: whatever no other provider takes runs on onnxruntime's CPU EP.

Like ONNX Runtime's own ``CPUExecutionProvider`` it claims every node it is offered (the
partitioner always asks it last). Each CPU partition's fused subgraph becomes a small ONNX model
with the source model's opset imports, run by an ``onnxruntime.InferenceSession`` restricted to
``CPUExecutionProvider``. Threads: the provider option ``intra_op_num_threads`` if given, else the
session config entry ``session.intra_op.num_threads``, else onnxruntime's default.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .. import errors
from ..errors import EPFail, InvalidArgument
from .graph import GraphView, node_reads
from .options import INTRA_OP_THREADS
from .provider import CompiledNode, ComputeCapability, ExecutionProvider, FusedNode
from .registry import register_provider

THREADS_OPTION = "intra_op_num_threads"
_MIN_IR_VERSION = 7  # initializers need not be graph inputs from IR 4; 7 is ORT's floor here


def fused_model(fused: FusedNode) -> onnx.ModelProto:
    """A standalone ONNX model of a fused node's subgraph, with the source opset imports (a
    new one each call: the fused node does not keep its weights' copy)."""
    opsets = list(fused.opset_imports)
    ir_version = max(_MIN_IR_VERSION, helper.find_min_ir_version_for(opsets, True))
    return helper.make_model(fused.standalone_graph(), opset_imports=opsets,
                             ir_version=ir_version)


def same_error(exc: Exception) -> type[errors.OrtError]:
    """The ``ep.errors`` class named like onnxruntime's exception (``InvalidGraph``,
    ``RuntimeException``...), so a refusal the CPU fallback passes on keeps onnxruntime's
    status; a plain ``RuntimeError`` of its Python binding (a bfloat16 output, which numpy
    cannot hold) is ``RuntimeException``, a ``RuntimeError`` too, not an EP's fault the
    fallback would retry; ``EPFail`` for anything else."""
    if type(exc) is RuntimeError:
        return errors.RuntimeException
    found = getattr(errors, type(exc).__name__, None)
    return found if isinstance(found, type) and issubclass(found, errors.OrtError) else EPFail


class OrtCompiledNode(CompiledNode):
    """A fused subgraph run by an onnxruntime CPU session."""

    def __init__(self, fused: FusedNode, options: ort.SessionOptions) -> None:
        self.name = fused.name
        self.inputs = list(fused.inputs)
        self.outputs = list(fused.outputs)
        self._options = options
        self._fused = fused  # its weights are the session's views: a partial run's model
        self._session: ort.InferenceSession | None = None
        # Partial runs: per set of wanted outputs, a session of only the nodes they need
        # (onnxruntime itself runs every node of a session whatever outputs are fetched).
        self._partial: dict[tuple[bool, ...],
                            tuple[ort.InferenceSession, list[str], list[str]]] = {}
        self._lock = threading.Lock()
        if self.outputs:  # a partition nothing reads is dead code: nothing to run
            self._session = self._open(fused_model(fused))

    def _open(self, model: onnx.ModelProto) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(model.SerializeToString(), sess_options=self._options,
                                        providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise same_error(exc)(
                f"CPUExecutionProvider could not compile partition {self.name!r}: {exc}"
            ) from None

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the subgraph on onnxruntime; outputs in ``FusedNode.outputs`` order."""
        self._check(inputs)
        if self._session is None:
            return []
        return self._fetch(self._session, self.inputs, self.outputs, inputs)

    def run_partial(self, inputs: Sequence[np.ndarray], wanted: Sequence[bool]) -> list[Any]:
        """Run only the nodes the ``wanted`` outputs need (None for the others)."""
        self._check(inputs)
        if self._session is None or all(wanted):
            return self.run(inputs)
        key = tuple(bool(w) for w in wanted)
        with self._lock:
            if key not in self._partial:
                names = [n for n, w in zip(self.outputs, key, strict=True) if w]
                pruned = needed_subgraph(fused_model(self._fused), names)
                self._partial[key] = (self._open(pruned), [i.name for i in pruned.graph.input],
                                      names)
            session, feeds_names, names = self._partial[key]
        given = dict(zip(self.inputs, inputs, strict=True))
        values = iter(self._fetch(session, feeds_names, names, [given[n] for n in feeds_names]))
        return [next(values) if w else None for w in key]

    def _check(self, inputs: Sequence[np.ndarray]) -> None:
        if len(inputs) != len(self.inputs):
            raise InvalidArgument(
                f"partition {self.name!r} takes {len(self.inputs)} inputs {self.inputs}, "
                f"got {len(inputs)}"
            )

    def _fetch(self, session: ort.InferenceSession, names: Sequence[str],
               outputs: Sequence[str], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            return list(session.run(list(outputs), dict(zip(names, inputs, strict=True))))
        except Exception as exc:
            raise same_error(exc)(
                f"CPUExecutionProvider failed running {self.name!r}: {exc}") from None


def needed_subgraph(model: onnx.ModelProto, outputs: Sequence[str]) -> onnx.ModelProto:
    """``model`` with only ``outputs`` and the nodes, inputs and initializers they need."""
    graph = model.graph
    need = set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):  # a fused subgraph is in topological order
        if need.intersection(node.output):
            kept.append(node)
            need.update(node_reads(node))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(reversed(kept))
    for field, keep in ((out.graph.input, lambda v: v.name in need),
                        (out.graph.output, lambda v: v.name in set(outputs)),
                        (out.graph.initializer, lambda v: v.name in need)):
        values = [v for v in field if keep(v)]
        del field[:]
        field.extend(values)
    return out


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
