"""Random DAG models for the framework's property tests, drawn with the kit's strategy.

:func:`random_dags` is :func:`ep.testing.strategies.models` restricted to a few ops on float32
``(3, 3)`` inputs: unary ``Relu``/``Sigmoid``/``Neg``/``Tanh``, binary ``Add``/``Sub``/``Mul``
(with other tensors or broadcasting initializers), ``Transpose`` and ``Concat``/``Split``. Nodes
are stored in a drawn order and some are left unnamed, which the partitioner and graph tests
need. :func:`reference_eval` computes such a graph with numpy, independently of onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import numpy_helper

from ep.testing.strategies import models, random_inputs

SHAPE = (3, 3)
OPS = ("Relu", "Sigmoid", "Neg", "Tanh", "Add", "Sub", "Mul", "Transpose", "Concat", "Split")


def random_dags(max_nodes: int = 12) -> st.SearchStrategy[onnx.ModelProto]:
    """Random valid DAG models (opset 17, IR 8) over float32 tensors, 1-3 ``(3, 3)`` inputs."""
    return models("arbitrary", ops=OPS, cpu_ops=(), max_nodes=max_nodes, input_shape=SHAPE,
                  shuffle_nodes=True, unnamed_nodes=True)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard normal float32 inputs for a model from :func:`random_dags`."""
    return random_inputs(model, seed)


def _node_eval(node: onnx.NodeProto, args: list[np.ndarray]) -> list[np.ndarray]:
    op = node.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if op == "Relu":
        return [np.maximum(args[0], 0)]
    if op == "Sigmoid":
        return [(1 / (1 + np.exp(-args[0]))).astype(np.float32)]
    if op == "Neg":
        return [-args[0]]
    if op == "Tanh":
        return [np.tanh(args[0])]
    if op in ("Add", "Sub", "Mul"):
        return [{"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](*args)]
    if op == "Transpose":
        return [np.transpose(args[0], attrs["perm"]).copy()]
    if op == "Concat":
        return [np.concatenate(args, axis=attrs["axis"])]
    if op == "Split":
        return list(np.split(args[0], len(node.output), axis=attrs.get("axis", 0)))
    raise ValueError(f"reference_eval does not know {op}")


def reference_eval(
    graph: onnx.GraphProto, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None
) -> list[np.ndarray]:
    """Evaluate a graph of :func:`random_dags` ops with numpy (nodes in any order)."""
    env = dict(feeds)
    env.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
    pending = list(graph.node)
    while pending:
        ready = [n for n in pending if all(i in env for i in n.input)]
        if not ready:
            raise ValueError("graph has a cycle or a missing input")
        for node in ready:
            env.update(zip(node.output, _node_eval(node, [env[i] for i in node.input]),
                           strict=True))
            pending.remove(node)
    return [env[name] for name in (outputs or [o.name for o in graph.output])]
