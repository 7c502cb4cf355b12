"""Fused epilogues in the kernels: every step gives the standalone kernels' values (bit for bit
on float32, the fused loops included), the result matches onnxruntime's unfused ops, and a
malformed encoding is a typed error naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, decode, encode
from npu_sim.errors import KernelError
from npu_sim.kernels.epilogue import apply_epilogue
from tests.kernels import random_array, run_kernel, seeds, with_specials
from tests.ortref import run_ort

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 1e30, -1e30]
STEPS = [Step("Sigmoid", gate=True), Step("HardSigmoid", gate=True, params=(1 / 6, 0.5)),
         Step("HardSigmoid", gate=True, params=(0.2, 0.5)), Step("Relu"),
         Step("Clip", params=(0.0, 6.0)), Step("HardSwish"), Step("Add", operand=1),
         Step("Mul", operand=2)]


def _unfused(y: np.ndarray, step: Step, inputs: list) -> np.ndarray:
    """The step as the standalone kernels run it."""
    attrs = {"alpha": step.params[0], "beta": step.params[1]} if step.op == "HardSigmoid" \
        else {}
    if step.operand >= 0:
        return run_kernel(step.op, [y, inputs[step.operand]])[0]
    if step.op == "Clip":
        return run_kernel("Clip", [y, np.float32(step.params[0]), np.float32(step.params[1])])[0]
    g = run_kernel(step.op, [y], attrs)[0]
    return run_kernel("Mul", [y, g])[0] if step.gate else g


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=3),
       broadcast=st.booleans(), seed=seeds)
def test_steps_give_the_standalone_kernels_values(shape, steps, broadcast, seed):
    shape = tuple(shape)
    y = with_specials(random_array(seed, shape, np.float32, -8, 8), seed, SPECIALS)
    other = shape[-1:] if broadcast else shape  # a vector along the last axis, or the full shape
    inputs = [None, random_array(seed + 1, shape, np.float32), random_array(seed + 2, other,
                                                                            np.float32)]
    want = y.copy()
    for step in steps:
        want = _unfused(want, step, inputs)
    got = apply_epilogue("Conv", y.copy(), encode(steps), inputs)
    np.testing.assert_array_equal(got, want)


def test_hard_swish_gate_matches_onnxruntime_hard_sigmoid_times_x():
    x = random_array(3, (2, 16, 5, 5), np.float32, -8, 8)
    g = run_ort("HardSigmoid", [x], {"alpha": 1 / 6, "beta": 0.5})[0]
    want = run_ort("Mul", [x, g])[0]
    got = apply_epilogue("Conv", x.copy(), encode([STEPS[1]]), [])
    np.testing.assert_array_equal(got, want)  # the gate in float32, as the two kernels


def test_silu_gate_matches_onnxruntime_sigmoid_times_x():
    x = random_array(4, (1, 96, 12, 12), np.float32, -20, 20)
    want = run_ort("Mul", [x, run_ort("Sigmoid", [x])[0]])[0]
    got = apply_epilogue("Conv", x.copy(), encode([STEPS[0]]), [])
    np.testing.assert_array_equal(got, want)  # MLAS's logistic, then the multiply


def test_encoding_round_trips():
    steps = (STEPS[1], Step("Add", operand=3), Step("Clip", params=(0.0, 6.0)))
    assert decode("Conv", encode(steps)) == steps
    assert encode(()) == {} and decode("Conv", {}) == ()


@pytest.mark.parametrize("attrs, match", [
    ({"epilogue": ("Add",), "epilogue_args": ()}, "one per epilogue step"),
    ({"epilogue": ("Softmax",), "epilogue_args": (0,)}, "unknown"),
    ({"epilogue": ("Gate:Relu",), "epilogue_args": (0,)}, "unknown"),
    ({"epilogue": ("Add",), "epilogue_args": (-1,)}, "operand index -1"),
    ({"epilogue": ("Clip",), "epilogue_args": (2,), "epilogue_params": (0.0,)}, "takes 2 params"),
    ({"epilogue": ("Relu",), "epilogue_args": (0,), "epilogue_params": (1.0,)}, "take 0"),
])
def test_malformed_encoding_is_a_typed_error(attrs, match):
    with pytest.raises(KernelError, match=match):
        decode("Conv", attrs)


def test_bad_operand_is_a_typed_error():
    y = np.ones((2, 3), np.float32)
    with pytest.raises(KernelError, match="missing"):
        apply_epilogue("Gemm", y, encode([Step("Add", operand=3)]), [None, None, None])
    with pytest.raises(KernelError, match="broadcast to the output"):
        apply_epilogue("Gemm", y, encode([Step("Add", operand=0)]), [np.ones((4, 3), np.float32)])


@pytest.mark.parametrize("kernel, pads", [(1, 0), (3, 1)])
def test_input_scale_matches_onnxruntime_on_the_scaled_input(kernel, pads):
    x = random_array(5, (1, 12, 7, 7), np.float32, -2, 2)
    w = random_array(6, (5, 12, kernel, kernel), np.float32, -1, 1)
    s = random_array(7, (1, 12, 1, 1), np.float32, 0, 1)
    conv = {"pads": [pads] * 4}
    want = run_ort("Conv", [run_ort("Mul", [x, s])[0], w], conv)[0]
    got = run_kernel("Conv", [x, w, None, s], {**conv, "input_scale": 3})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scale, attrs, match", [
    (np.ones((1, 5, 1, 1), np.float32), {}, "per-channel scale of 12 channels"),
    (np.ones((2, 12, 1, 1), np.float32), {}, "per-channel scale of 12 channels"),
    (np.ones((1, 12, 1, 1), np.float32), {"input_scale": 7}, "per-channel scale"),
    (np.ones((1, 12, 1, 1), np.float32), {"input_scale": -1}, "input index >= 0"),
])
def test_bad_input_scale_is_a_typed_error(scale, attrs, match):
    x, w = np.ones((1, 12, 3, 3), np.float32), np.ones((4, 12, 1, 1), np.float32)
    with pytest.raises(KernelError, match=match):
        run_kernel("Conv", [x, w, None, scale], {"input_scale": 3, **attrs})


def test_the_silu_gate_of_a_strided_buffer_gives_the_contiguous_ones_bits():
    """The gate's general path (a strided or read-only buffer) is the fast path's loop on a
    copy: the QuickGelu clamp at 1 and NaNs kept as they are, as onnxruntime."""
    values = np.concatenate([np.linspace(17.4, 18.1, 4001, dtype=np.float32),
                             np.array([0x7F800001, 0xFF812345, 0x7FC00000], np.uint32)
                             .view(np.float32), np.float32([-3.0, 0.0, 2.5])])
    spaced = np.zeros(2 * values.size, np.float32)
    spaced[::2] = values
    steps = encode([STEPS[0]])
    whole = apply_epilogue("Conv", values.copy(), steps, [])
    strided = apply_epilogue("Conv", spaced[::2], steps, [])
    np.testing.assert_array_equal(np.ascontiguousarray(strided).view(np.uint32),
                                  whole.view(np.uint32))
