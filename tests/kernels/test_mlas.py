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

from npu_sim.kernels.activations import activation_params, apply_activation
from npu_sim.kernels.host import MLAS_AVX512F
from npu_sim.kernels.mlas import bias_sigmoid32, gelu32, sigmoid32, silu32
from tests.ortref import run_ort

# op, attributes, opset
FUNCTIONS = [("Sigmoid", {}, 17), ("Tanh", {}, 17), ("Erf", {}, 17), ("Gelu", {}, 20),
             ("Gelu", {"approximate": "tanh"}, 20)]
IDS = ["Sigmoid", "Tanh", "Erf", "Gelu", "Gelu-tanh"]


def _every_float32(lo: float, hi: float) -> np.ndarray:
    """Every float32 from ``lo`` up to ``hi`` (same sign)."""
    a, b = (np.array([lo, hi], np.float32).view(np.int32))
    step = 1 if a <= b else -1
    return np.arange(a, b, step, dtype=np.int32).view(np.float32)


def _edges() -> np.ndarray:
    """Every float32 where MLAS's results saturate ([15, 18] and [-18, -15] for the logistic,
    +-[7.5, 9] for tanh, [-6, -5] for Gelu's -0, [3.5, 4] for erf), every one within 64 ulps of
    erf's branch point, NaNs quiet and signalling, the other specials, a wide normal sample."""
    ranges = [(15, 18.5), (-15, -18.5), (7.5, 9.5), (-7.5, -9.5), (-5, -6), (3.5, 4),
              (0.9215, 0.9222), (-0.9215, -0.9222)]
    dense = [_every_float32(lo, hi) for lo, hi in ranges]
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FC12345, 0x7FA00000],
                    np.uint32).view(np.float32)
    specials = np.array([np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -75.70152,
                         -1426.77, 3.4e38, -3.4e38], np.float32)
    sample = (np.random.default_rng(0).standard_normal(100_000) * 10).astype(np.float32)
    return np.concatenate([*dense, nans, specials, sample])


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal as bit patterns (NaN payloads and the sign of zero included)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert not differ.any(), (f"{differ.sum()} differ, first at {np.argmax(differ)}: "
                              f"{got[differ][:3]} vs {want[differ][:3]}")


def _ours(op: str, attrs: dict, x: np.ndarray) -> np.ndarray:
    return apply_activation(x, op, activation_params(op, attrs))


@pytest.mark.parametrize(("op", "attrs", "opset"), FUNCTIONS, ids=IDS)
def test_float32_functions_are_onnxruntimes_bits(op, attrs, opset):
    x = _edges()
    _same_bits(_ours(op, attrs, x), run_ort(op, [x], attrs, opset=opset)[0])


@pytest.mark.parametrize(("op", "attrs", "opset"), FUNCTIONS, ids=IDS)
@settings(max_examples=25)
@given(x=hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(width=32)))
def test_any_float32_input_gives_onnxruntimes_bits(op, attrs, opset, x):
    _same_bits(_ours(op, attrs, x), run_ort(op, [x], attrs, opset=opset)[0])


def test_float32_sigmoid_saturates_where_onnxruntime_does():
    """1 / (1 + exp(-x)) is 1.3e-33 at -75.7 and onnxruntime's 0: a Sign after it saw 1 vs 0."""
    x = np.array([-75.70152, -18.0, -17.7, 17.1, 18.0, 100.0], np.float32)
    got = apply_activation(x, "Sigmoid")
    np.testing.assert_array_equal(got, run_ort("Sigmoid", [x])[0])
    assert got[0] == 0.0 and got[-1] == 1.0


def _edges64() -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet ones
        return np.concatenate([_edges().astype(np.float64), np.linspace(-800, 800, 20_001)])


def test_float64_sigmoid_is_onnxruntimes_formula():
    """Within 1e-12, or 2 ulps of 1 where 1 - 1/(1+e) cancels (x < 0): numpy's exp against
    Eigen's differ in the last bit, and the subtraction from 1 keeps that absolute error."""
    x = _edges64()
    got, want = apply_activation(x, "Sigmoid"), run_ort("Sigmoid", [x])[0]
    np.testing.assert_array_equal(got == 0, want == 0)  # 1 - 1/(1+e) is exactly 0 below -36.74
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=2 * np.finfo(np.float64).eps)


def test_float64_tanh_is_numpys_within_1e15_of_onnxruntimes():
    x = _edges64()
    np.testing.assert_allclose(apply_activation(x, "Tanh"), run_ort("Tanh", [x])[0],
                               rtol=1e-15, atol=0)


def test_float64_sigmoid_in_place_reads_the_signs_first():
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float64)
    want = run_ort("Sigmoid", [x])[0]
    got = apply_activation(x, "Sigmoid", inplace=True)
    assert got is x
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def _silu_model(with_bias: bool, shape: tuple[int, ...]) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["y"])] if with_bias else []
    v = "y" if with_bias else "x"
    nodes += [helper.make_node("Sigmoid", [v], ["s"]), helper.make_node("Mul", [v, "s"], ["out"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
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
    """onnxruntime fuses x * Sigmoid(x) into QuickGelu(alpha=1) at its default optimization
    level, on the host's MLAS kernel (AVX-512F or generic); the fused epilogue gives its bits,
    with and without the bias folded in, saturation and NaNs included."""
    edges = _edges()
    x = np.resize(edges, (2, 6, -(-edges.size // 12))).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((6, 1)).astype(np.float32)
    y = x.copy()
    silu32(y.reshape(-1), MLAS_AVX512F)
    _same_bits(y, _ort(_silu_model(False, x.shape), {"x": x}))
    y = x.copy()
    with np.errstate(all="ignore"):
        bias_sigmoid32(y, b.reshape(-1), True, MLAS_AVX512F)
    _same_bits(y, _ort(_silu_model(True, x.shape), {"x": x, "b": b}))


def test_each_hosts_silu_and_gelu_branch():
    """The branch the installed onnxruntime cannot check here, by what MLAS's kernel does:
    AVX-512F keeps a NaN's bits and clamps the logistic at 1; the generic kernel multiplies the
    unclamped logistic (1.0000001 on 20 inputs of [17.48, 18)) and quiets a NaN."""
    top = _every_float32(17.48, 18.0)
    nans = np.array([0x7F800001, 0xFFA00000], np.uint32).view(np.float32)
    lifted = np.zeros(top.size, np.float32)
    sigmoid32(top, lifted)
    assert (lifted > 1).sum() == 20  # MLAS's logistic passes 1 on 20 of these inputs
    for avx512 in (True, False):
        y = np.concatenate([top, nans])
        with np.errstate(invalid="ignore"):
            silu32(y, avx512)
        _same_bits(y[:top.size], top * (np.minimum(lifted, 1) if avx512 else lifted))
        g = np.empty_like(nans)
        gelu32(nans, g, avx512)
        for got in (y[top.size:], g):
            want = nans.view(np.uint32) | (0 if avx512 else 0x00400000)  # the quiet bit
            assert (got.view(np.uint32) == want).all(), [hex(v) for v in got.view(np.uint32)]
