"""Each compiler rewrite fires where it should and keeps the graph's values (vs onnxruntime).

The rewritten graph runs on the device's kernels (``ir.evaluate``); the reference is
onnxruntime on the ORIGINAL graph with its own graph optimizations off.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ep.npusim.compiler import rewrite
from ep.npusim.compiler.ir import SubGraph, contiguous, evaluate
from tests.ep.npusim_graphs import (
    as_fused,
    conv_bn_relu,
    matmul_add,
    model,
    ort_run,
    qdq_conv,
    qdq_matmul,
    random_feed,
    residual_block,
)

F = TensorProto.FLOAT


def imported(m):
    fused = as_fused(m)
    return SubGraph.from_fused(fused.graph, fused.opset_imports)


def check_equivalent(m, graph, rtol=1e-4, atol=1e-5, seed=0):
    feeds = random_feed(m, seed)
    expected = ort_run(m, feeds)
    got = evaluate(graph, [feeds[n] for n in graph.inputs])
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def ops(graph):
    return [n.op for n in graph.nodes]


def test_fold_constants_evaluates_constant_subexpressions():
    c = helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0])
    nodes = [
        c,
        helper.make_node("Mul", ["c", "k"], ["ck"]),
        helper.make_node("Exp", ["ck"], ["e"]),
        helper.make_node("Add", ["x", "e"], ["y"]),
    ]
    m = model(nodes, [("x", F, (2, 3))], [("y", F, (2, 3))],
              {"k": np.array([0.5, -1.0, 0.25], np.float32)})
    g = imported(m)
    assert rewrite.fold_constants(g) == 3
    assert ops(g) == ["Add"]
    check_equivalent(m, g)


def test_fold_constants_takes_shape_of_a_static_tensor():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=F),
             helper.make_node("Sum", ["x", "sf"], ["y"])]
    m = model(nodes, [("x", F, (2, 3, 3))], [("y", F, (2, 3, 3))], opset=13)
    g = imported(m)
    assert rewrite.fold_constants(g) == 2
    assert ops(g) == ["Sum"]
    check_equivalent(m, g)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_batchnorm_into_conv(bias):
    m = conv_bn_relu(bias=bias, act="Relu")
    g = imported(m)
    assert rewrite.fold_batchnorm(g) == 1
    assert ops(g) == ["Conv", "Relu"]
    check_equivalent(m, g)


def test_fold_batchnorm_skips_conv_with_another_reader():
    m = conv_bn_relu()
    m.graph.node.append(helper.make_node("Relu", ["c"], ["c_relu"]))
    m.graph.output.append(helper.make_tensor_value_info("c_relu", F, (1, 8, 10, 10)))
    g = imported(m)
    assert rewrite.fold_batchnorm(g) == 0
    assert "BatchNormalization" in ops(g)


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid",
                                 "HardSwish", "Tanh", "Gelu"])
def test_fuse_activation_into_conv(act):
    m = conv_bn_relu(act=act, opset=20 if act == "Gelu" else 17)
    node = m.graph.node[2]
    if act == "LeakyRelu":
        node.attribute.append(helper.make_attribute("alpha", 0.2))
    if act == "HardSigmoid":
        node.attribute.extend([helper.make_attribute("alpha", 0.3),
                               helper.make_attribute("beta", 0.4)])
    if act == "Clip":
        node.input.extend(["lo", "hi"])
        m.graph.initializer.extend([helper.make_tensor("lo", F, (), [-0.5]),
                                    helper.make_tensor("hi", F, (), [0.7])])
    if act == "Gelu":
        node.attribute.append(helper.make_attribute("approximate", "tanh"))
    g = imported(m)
    rewrite.fold_batchnorm(g)
    assert rewrite.fuse_activations(g) == 1
    (conv,) = g.nodes
    assert conv.attrs["activation"] == act
    check_equivalent(m, g)


def test_fuse_activation_keeps_clip_with_runtime_bounds():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Clip", ["mm", "lo"], ["y"])]
    m = model(nodes, [("x", F, (2, 4)), ("lo", F, ())], [("y", F, (2, 3))],
              {"w": np.ones((4, 3), np.float32)})
    g = imported(m)
    assert rewrite.fuse_activations(g) == 0


@pytest.mark.parametrize("act", [None, "Relu", "Tanh"])
@pytest.mark.parametrize("bias_shape", [(8,), (1, 8), (4, 8)])
def test_matmul_add_becomes_gemm(act, bias_shape):
    m = matmul_add(act=act, bias_shape=bias_shape)
    g = imported(m)
    assert rewrite.matmul_add_to_gemm(g) == 1
    rewrite.fuse_activations(g)
    assert ops(g) == ["Gemm"]
    check_equivalent(m, g)


def test_matmul_add_stays_for_3d_input():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    m = model(nodes, [("x", F, (2, 3, 4))], [("y", F, (2, 3, 5))],
              {"w": np.ones((4, 5), np.float32), "b": np.ones(5, np.float32)})
    g = imported(m)
    assert rewrite.matmul_add_to_gemm(g) == 0


def test_optimize_residual_block():
    m = residual_block()
    g = imported(m)
    counts = rewrite.optimize(g)
    assert counts["fold_batchnorm"] == 2 and counts["fuse_activations"] == 1
    assert counts["fuse_epilogues"] == 2  # the residual Add and its Relu join the second Conv
    assert ops(g) == ["Conv", "Conv"]
    assert [n.attrs.get("epilogue") for n in g.nodes] == [None, ("Add", "Relu")]
    check_equivalent(m, g)


def _lsb_check(m, g, seeds=(0, 1, 2)):
    """Quantized outputs equal ORT's within 1 LSB; most of them exactly.

    QLinearConv/QLinearMatMul accumulate in exact int32 and requantize once; the reference
    DQ -> float Conv -> Q rounds a float32 sum, so a value within float error of a .5 rounding
    boundary can land on the neighbouring integer.
    """
    for seed in seeds:
        feeds = random_feed(m, seed)
        (expected,) = ort_run(m, feeds)
        (got,) = evaluate(g, [feeds[n] for n in g.inputs])
        assert got.dtype == expected.dtype and got.shape == expected.shape
        diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
        assert diff.max() <= 1
        assert np.mean(diff == 0) >= 0.98


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("qtype", [TensorProto.UINT8, TensorProto.INT8])
def test_fold_qdq_conv(per_channel, qtype):
    m = qdq_conv(per_channel=per_channel, qtype=qtype)
    g = imported(m)
    counts = rewrite.optimize(g)
    assert counts["fold_qdq"] == 1
    assert ops(g) == ["QLinearConv"]
    _lsb_check(m, g)


def test_fold_qdq_matmul():
    m = qdq_matmul()
    g = imported(m)
    rewrite.optimize(g)
    assert ops(g) == ["QLinearMatMul"]
    _lsb_check(m, g)


def test_unfused_dequantize_of_a_weight_is_folded():
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "s"], ["w"]),
             helper.make_node("Add", ["x", "w"], ["y"])]
    m = model(nodes, [("x", F, (3,))], [("y", F, (3,))],
              {"w_q": np.array([1, -2, 3], np.int8), "s": np.array(0.5, np.float32)})
    g = imported(m)
    rewrite.optimize(g)
    assert ops(g) == ["Add"]
    check_equivalent(m, g)


@pytest.mark.parametrize("shape", [(2000, 300), (7, 5), (1, 1 << 19)])
def test_contiguous_copies_a_transposed_matrix_exactly(shape):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = contiguous(w.T)
    assert got.flags.c_contiguous and got.dtype == w.dtype
    assert np.array_equal(got, np.ascontiguousarray(w.T))
    assert contiguous(np.float32(3.0)).shape == ()
    strided = w[::2, ::3]
    assert np.array_equal(contiguous(strided), np.ascontiguousarray(strided))
