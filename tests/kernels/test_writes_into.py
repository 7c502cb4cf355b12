"""Conv, Gemm and MatMul compute into a given ``out=`` array (schedule replay passes the
output's arena bytes): the same bits as without it, within tolerance of onnxruntime, and the
array itself is returned; an unusable array (wrong dtype or shape) is left alone."""

from __future__ import annotations

import numpy as np
import pytest

from npu_sim.kernels.registry import lookup
from tests.kernels import assert_matches, random_array, run_kernel
from tests.ortref import run_ort

CASES = {
    "conv_3x3_s2_hard_swish": ("Conv", (1, 3, 16, 16), (8, 3, 3, 3), (8,),
                               {"strides": [2, 2], "pads": [1, 1, 1, 1]},
                               {"epilogue": ["Gate:HardSigmoid"], "epilogue_args": [0]}),
    "conv_1x1_relu": ("Conv", (1, 8, 7, 7), (16, 8, 1, 1), (16,), {}, {"activation": "Relu"}),
    "conv_depthwise": ("Conv", (1, 8, 9, 9), (8, 1, 3, 3), (8,),
                       {"group": 8, "pads": [1, 1, 1, 1]}, {}),
    "gemm": ("Gemm", (4, 32), (32, 16), (16,), {"transB": 0}, {}),
    "matmul": ("MatMul", (2, 5, 32), (32, 48), None, {}, {}),
}


def _inputs(case):
    return [random_array(seed, shape, "float32") for seed, shape in enumerate(case[1:4])
            if shape is not None]


@pytest.mark.parametrize("name", sorted(CASES))
def test_out_is_filled_and_returned_with_the_same_bits(name: str) -> None:
    op, _, _, _, attrs, fused = CASES[name]
    inputs = _inputs(CASES[name])
    want = run_kernel(op, inputs, {**attrs, **fused})
    out = np.full(want[0].shape, np.nan, np.float32)
    got = lookup(op).values(inputs, {**attrs, **fused}, out=[out])
    assert got[0] is out
    assert out.tobytes() == want[0].tobytes()
    if not fused:
        assert_matches(got, run_ort(op, inputs, attrs))


@pytest.mark.parametrize("bad", [np.float64, "shape"])
def test_an_unusable_out_is_not_written(bad) -> None:
    op, _, _, _, attrs, _ = CASES["conv_1x1_relu"]
    inputs = _inputs(CASES["conv_1x1_relu"])
    (want,) = run_kernel(op, inputs, attrs)
    out = np.zeros(want.shape, bad) if bad != "shape" else np.zeros(want.size, np.float32)
    (got,) = lookup(op).values(inputs, attrs, out=[out])
    assert got is not out and not out.any()
    assert got.tobytes() == want.tobytes()
