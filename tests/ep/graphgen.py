"""Hypothesis strategies for random ONNX DAGs, reusable by any EP-level property test.

:func:`random_dags` draws small float32 models: 1-3 graph inputs of one shape (3, 3), then nodes
that each read earlier tensors chosen at random (so fan-in and fan-out are random): unary
``Relu``/``Sigmoid``/``Neg``/``Tanh``, binary ``Add``/``Sub``/``Mul``, ``Add`` of a shared
initializer, ``Transpose`` (square, so shapes stay put) and a ``Concat`` -> ``Split`` pair (two
nodes: a (6, 3) tensor in between, two (3, 3) outputs). Graph outputs are a random non-empty
subset of the node outputs. Some nodes are left unnamed. :func:`reference_eval` computes such a
graph with numpy, independently of onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

SHAPE = (3, 3)
OPSET = 17
UNARY = ("Relu", "Sigmoid", "Neg", "Tanh")
BINARY = ("Add", "Sub", "Mul")
KINDS = UNARY + BINARY + ("AddConst", "Transpose", "ConcatSplit")
WEIGHT = "W"


@st.composite
def random_dags(draw: st.DrawFn, max_nodes: int = 12) -> onnx.ModelProto:
    """A random valid DAG model (opset 17, ir_version 8) over float32 (3, 3) tensors."""
    n_inputs = draw(st.integers(1, 3))
    tensors = [f"x{k}" for k in range(n_inputs)]
    produced: list[str] = []
    nodes: list[onnx.NodeProto] = []
    uses_weight = False
    n_steps = draw(st.integers(1, max_nodes))

    def pick() -> str:
        return tensors[draw(st.integers(0, len(tensors) - 1))]

    def name() -> str:
        return "" if draw(st.booleans()) and draw(st.booleans()) else f"n{len(nodes)}"

    for step in range(n_steps):
        kind = draw(st.sampled_from(KINDS))
        out = f"t{step}"
        if kind in UNARY:
            nodes.append(helper.make_node(kind, [pick()], [out], name=name()))
        elif kind in BINARY:
            nodes.append(helper.make_node(kind, [pick(), pick()], [out], name=name()))
        elif kind == "AddConst":
            uses_weight = True
            nodes.append(helper.make_node("Add", [pick(), WEIGHT], [out], name=name()))
        elif kind == "Transpose":
            nodes.append(helper.make_node("Transpose", [pick()], [out], perm=[1, 0], name=name()))
        else:
            cat = f"{out}_cat"
            nodes.append(helper.make_node("Concat", [pick(), pick()], [cat], axis=0, name=name()))
            halves = [f"{out}_a", f"{out}_b"]
            nodes.append(
                helper.make_node("Split", [cat], halves, axis=0, name=name())
            )
            produced.append(cat)
            produced.extend(halves)
            tensors.extend(halves)
            continue
        produced.append(out)
        tensors.append(out)

    chosen = draw(
        st.lists(st.sampled_from(produced), min_size=1, max_size=min(4, len(produced)),
                 unique=True)
    )
    order = draw(st.permutations(nodes)) if draw(st.booleans()) else nodes
    inits = []
    if uses_weight:
        weight = np.arange(9, dtype=np.float32).reshape(SHAPE) / 4 - 1
        inits.append(numpy_helper.from_array(weight, WEIGHT))
    graph = helper.make_graph(
        list(order),
        "random_dag",
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, SHAPE) for t in tensors[:n_inputs]],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in chosen],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 inputs for a model from :func:`random_dags`."""
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal(SHAPE).astype(np.float32)
        for i in model.graph.input
        if i.name not in {t.name for t in model.graph.initializer}
    }


def _node_eval(node: onnx.NodeProto, args: list[np.ndarray]) -> list[np.ndarray]:
    op = node.op_type
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
        return [args[0].T.copy()]
    if op == "Concat":
        return [np.concatenate(args, axis=0)]
    if op == "Split":
        return list(np.split(args[0], len(node.output), axis=0))
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
