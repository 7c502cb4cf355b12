"""Small generated ONNX graphs for the NPU compiler tests, and ways to run them.

Each builder returns a ``ModelProto`` (opset 17 unless stated) with seeded random weights:
Conv-BN-Relu, MatMul-Add(-activation), a residual block, QDQ Conv and QDQ MatMul, plus
:func:`ort_run` (onnxruntime CPU, graph optimizations off, so it computes the original graph
literally) and :func:`as_fused` (the whole model as one fused node, what the partitioner hands
the compiler when the NPU takes every node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ep.framework.provider import FusedNode

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    """A checked model from nodes, ``(name, elem, shape)`` inputs/outputs and initializers."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def as_fused(m: onnx.ModelProto, name: str = "NpuSim_0") -> FusedNode:
    """The whole model as one fused node."""
    inits = {t.name for t in m.graph.initializer}
    return FusedNode(name, m.graph, [i.name for i in m.graph.input if i.name not in inits],
                     [o.name for o in m.graph.output], list(m.opset_import))


def ort_run(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``m`` on onnxruntime's CPU provider with graph optimizations disabled."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def conv_bn_relu(c_in: int = 3, c_out: int = 8, hw: int = 10, bias: bool = True,
                 act: str = "Relu", seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """x -> Conv 3x3 pad 1 -> BatchNormalization -> activation -> y."""
    r = rng(seed)
    inits = {
        "w": r.normal(0, 0.3, (c_out, c_in, 3, 3)).astype(np.float32),
        "scale": r.uniform(0.5, 1.5, c_out).astype(np.float32),
        "beta": r.normal(0, 0.2, c_out).astype(np.float32),
        "mean": r.normal(0, 0.2, c_out).astype(np.float32),
        "var": r.uniform(0.5, 2.0, c_out).astype(np.float32),
    }
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = r.normal(0, 0.1, c_out).astype(np.float32)
        conv_in.append("b")
    nodes = [
        helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["bn"],
                         epsilon=1e-3, name="bn"),
        helper.make_node(act, ["bn"], ["y"], name="act"),
    ]
    return model(nodes, [("x", F, (1, c_in, hw, hw))], [("y", F, (1, c_out, hw, hw))], inits,
                 opset)


def matmul_add(m: int = 4, k: int = 16, n: int = 8, act: str | None = None,
               bias_shape: Sequence[int] | None = None, seed: int = 1) -> onnx.ModelProto:
    """x (m, k) -> MatMul W (k, n) -> Add bias -> [activation] -> y."""
    r = rng(seed)
    inits = {"w": r.normal(0, 0.3, (k, n)).astype(np.float32),
             "bias": r.normal(0, 0.3, tuple(bias_shape or (n,))).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "bias"], ["y" if act is None else "z"], name="add")]
    if act is not None:
        nodes.append(helper.make_node(act, ["z"], ["y"], name="act"))
    return model(nodes, [("x", F, (m, k))], [("y", F, (m, n))], inits)


def residual_block(c: int = 8, hw: int = 8, seed: int = 2) -> onnx.ModelProto:
    """ResNet basic block: conv-bn-relu-conv-bn, + x, relu."""
    r = rng(seed)
    inits = {}
    nodes = []
    src = "x"
    for k in range(2):
        inits[f"w{k}"] = r.normal(0, 0.2, (c, c, 3, 3)).astype(np.float32)
        for p, lo in (("s", 0.5), ("v", 0.5)):
            inits[f"{p}{k}"] = r.uniform(lo, 1.5, c).astype(np.float32)
        inits[f"b{k}"] = r.normal(0, 0.1, c).astype(np.float32)
        inits[f"m{k}"] = r.normal(0, 0.1, c).astype(np.float32)
        nodes.append(helper.make_node("Conv", [src, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("BatchNormalization",
                                      [f"c{k}", f"s{k}", f"b{k}", f"m{k}", f"v{k}"], [f"n{k}"]))
        if k == 0:
            nodes.append(helper.make_node("Relu", ["n0"], ["r0"]))
            src = "r0"
    nodes.append(helper.make_node("Add", ["n1", "x"], ["sum"]))
    nodes.append(helper.make_node("Relu", ["sum"], ["y"]))
    shape = (1, c, hw, hw)
    return model(nodes, [("x", F, shape)], [("y", F, shape)], inits)


def qdq_conv(c_in: int = 4, c_out: int = 6, hw: int = 8, per_channel: bool = True,
             qtype: int = TensorProto.UINT8, seed: int = 3) -> onnx.ModelProto:
    """x_q -> DQ -> Conv(DQ(w int8), float bias) -> Q -> y_q (activations ``qtype``)."""
    r = rng(seed)
    np_q = np.uint8 if qtype == TensorProto.UINT8 else np.int8
    w_scale = (r.uniform(0.005, 0.02, c_out) if per_channel else np.array(0.01)).astype(np.float32)
    inits = {
        "x_scale": np.array(0.05, np.float32), "x_zp": np.array(128 if np_q is np.uint8 else 3,
                                                                 np_q),
        "w_q": r.integers(-100, 100, (c_out, c_in, 3, 3)).astype(np.int8),
        "w_scale": w_scale, "w_zp": np.zeros(w_scale.shape, np.int8),
        "b": r.normal(0, 0.5, c_out).astype(np.float32),
        "y_scale": np.array(0.1, np.float32), "y_zp": np.array(120 if np_q is np.uint8 else -5,
                                                               np_q),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], axis=0),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "y_scale", "y_zp"], ["y_q"]),
    ]
    return model(nodes, [("x_q", qtype, (1, c_in, hw, hw))], [("y_q", qtype, (1, c_out, hw, hw))],
                 inits)


def qdq_matmul(m: int = 5, k: int = 12, n: int = 7, seed: int = 4) -> onnx.ModelProto:
    """a_q (int8) -> DQ -> MatMul(DQ(b int8)) -> Q -> y_q, per-tensor scales."""
    r = rng(seed)
    inits = {
        "a_scale": np.array(0.04, np.float32), "a_zp": np.array(-2, np.int8),
        "b_q": r.integers(-120, 120, (k, n)).astype(np.int8),
        "b_scale": np.array(0.01, np.float32), "b_zp": np.array(0, np.int8),
        "y_scale": np.array(0.2, np.float32), "y_zp": np.array(4, np.int8),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["a_q", "a_scale", "a_zp"], ["a"]),
        helper.make_node("DequantizeLinear", ["b_q", "b_scale", "b_zp"], ["b"]),
        helper.make_node("MatMul", ["a", "b"], ["c"], name="mm"),
        helper.make_node("QuantizeLinear", ["c", "y_scale", "y_zp"], ["y_q"]),
    ]
    return model(nodes, [("a_q", TensorProto.INT8, (m, k))], [("y_q", TensorProto.INT8, (m, n))],
                 inits)


def random_feed(m: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """A random input for every graph input (floats N(0,1), integers over the full range)."""
    r = rng(seed)
    feeds = {}
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value for d in tt.shape.dim)
        np_type = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(np_type, np.integer):
            info = np.iinfo(np_type)
            feeds[vi.name] = r.integers(info.min, info.max, shape, endpoint=True).astype(np_type)
        else:
            feeds[vi.name] = r.normal(0, 1, shape).astype(np_type)
    return feeds
