"""Sigmoid, Tanh, Erf, Gelu and the SiLU gate give onnxruntime's bits (MLAS's functions),
saturation included, compared with the installed onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from ortref import run_ort

from npu_sim.kernels.activations import activation_params, apply_activation
from npu_sim.kernels.mlas import bias_silu32, silu32

# op, attributes, opset
FUNCTIONS = [("Sigmoid", {}, 17), ("Tanh", {}, 17), ("Erf", {}, 17), ("Gelu", {}, 20),
             ("Gelu", {"approximate": "tanh"}, 20)]
IDS = ["Sigmoid", "Tanh", "Erf", "Gelu", "Gelu-tanh"]


def _edges() -> np.ndarray:
    """Every float32 within 64 ulps of MLAS's clamps, its branch point and where its results
    reach 0 and +-1, the specials, and a wide normal sample."""
    near = []
    points = [-18, 18, 15.8, -9, 9, 8.04, -8.04, 0.921875, -0.921875, 3.92, -5.54, 0]
    for point in np.array(points, np.float32):
        for direction in (np.float32(np.inf), np.float32(-np.inf)):
            value = point
            for _ in range(64):
                value = np.nextafter(value, direction)
                near.append(value)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -75.70152, -1426.77,
                3.4e38, -3.4e38]
    sample = np.random.default_rng(0).standard_normal(100_000) * 10
    return np.concatenate([np.array(near + specials, np.float32), sample.astype(np.float32)])


def _ours(op: str, attrs: dict, x: np.ndarray) -> np.ndarray:
    return apply_activation(x, op, activation_params(op, attrs))


@pytest.mark.parametrize(("op", "attrs", "opset"), FUNCTIONS, ids=IDS)
def test_float32_functions_are_onnxruntimes_bits(op, attrs, opset):
    x = _edges()
    np.testing.assert_array_equal(_ours(op, attrs, x), run_ort(op, [x], attrs, opset=opset)[0])


@pytest.mark.parametrize(("op", "attrs", "opset"), FUNCTIONS, ids=IDS)
@settings(max_examples=25)
@given(x=hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(width=32)))
def test_any_float32_input_gives_onnxruntimes_bits(op, attrs, opset, x):
    np.testing.assert_array_equal(_ours(op, attrs, x), run_ort(op, [x], attrs, opset=opset)[0])


def test_float32_sigmoid_saturates_where_onnxruntime_does():
    """1 / (1 + exp(-x)) is 1.3e-33 at -75.7 and onnxruntime's 0: a Sign after it saw 1 vs 0."""
    x = np.array([-75.70152, -18.0, -17.7, 17.1, 18.0, 100.0], np.float32)
    got = apply_activation(x, "Sigmoid")
    np.testing.assert_array_equal(got, run_ort("Sigmoid", [x])[0])
    assert got[0] == 0.0 and got[-1] == 1.0


def test_float64_sigmoid_is_onnxruntimes_formula():
    x = _edges().astype(np.float64)
    x = np.concatenate([x, np.linspace(-800, 800, 20_001)])
    got, want = apply_activation(x, "Sigmoid"), run_ort("Sigmoid", [x])[0]
    np.testing.assert_array_equal(got == 0, want == 0)  # 1 - 1/(1+e) is exactly 0 below -36.74
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)  # exp: numpy's against Eigen's


def test_float64_tanh_is_numpys_within_1e15_of_onnxruntimes():
    x = np.concatenate([_edges().astype(np.float64), np.linspace(-30, 30, 20_001)])
    np.testing.assert_allclose(apply_activation(x, "Tanh"), run_ort("Tanh", [x])[0],
                               rtol=1e-15, atol=0)


def test_float64_sigmoid_in_place_reads_the_signs_first():
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float64)
    want = run_ort("Sigmoid", [x])[0]
    got = apply_activation(x, "Sigmoid", inplace=True)
    assert got is x
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def _silu_model(with_bias: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["y"])] if with_bias else []
    v = "y" if with_bias else "x"
    nodes += [helper.make_node("Sigmoid", [v], ["s"]), helper.make_node("Mul", [v, "s"], ["out"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 40])]
    if with_bias:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [6, 1]))
    graph = helper.make_graph(nodes, "silu", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort  # the installed reference, with its default optimizations

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_silu_gate_is_onnxruntimes_bits():
    """onnxruntime fuses x * Sigmoid(x) into QuickGelu(alpha=1): the same logistic, then the
    multiply; the fused epilogue gives its bits, with and without the bias folded in."""
    x = np.random.default_rng(1).standard_normal((2, 6, 40)).astype(np.float32) * 12
    b = np.random.default_rng(2).standard_normal((6, 1)).astype(np.float32)
    y = x.copy()
    silu32(y.reshape(-1))
    np.testing.assert_array_equal(y, _ort(_silu_model(False), {"x": x}))
    y = x.copy()
    bias_silu32(y, b.reshape(-1))
    np.testing.assert_array_equal(y, _ort(_silu_model(True), {"x": x, "b": b}))
