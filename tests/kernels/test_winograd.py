"""Winograd F(2x2, 3x3) convolution against onnxruntime, and the Conv kernel's dispatch to it.

The transform itself is checked on generated small shapes (any pads, groups, batch, odd output
sizes that crop the last tile), with inputs and weights in [-1, 1] as in test_conv.py. The
dispatch only takes layers of ResNet size (>= 32 channels per group, >= 14x14 outputs); there the
weights are He-scaled like a trained network's (std sqrt(2 / fan_in)): with weights uniform in
[-1, 1] a 576-term sum's rounding noise alone approaches the float32 tolerance whatever the
algorithm (the im2col path misses it from 256 channels on).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ortref import run_ort

from kernels import assert_matches, check_against_ort, random_array, run_kernel, seeds
from npu_sim.kernels import winograd
from npu_sim.kernels.conv import window


@st.composite
def small_case(draw: st.DrawFn) -> tuple[tuple, tuple, int, list[int]]:
    """(x shape, w shape, group, pads) of a 3x3 stride-1 conv with a non-empty output."""
    group = draw(st.integers(1, 3))
    cg, mg = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pads = draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))
    assume(h + pads[0] + pads[2] >= 3 and w + pads[1] + pads[3] >= 3)
    return (n, cg * group, h, w), (mg * group, cg, 3, 3), group, pads


@settings(max_examples=40, deadline=None)
@given(case=small_case(), seed=seeds)
def test_conv3x3_matches_ort(case, seed):
    x_shape, w_shape, group, pads = case
    x = random_array(seed, x_shape, np.float32, -1, 1)
    w = random_array(seed + 1, w_shape, np.float32, -1, 1)
    attrs = {"pads": pads, "group": group}
    win = window("Conv", x_shape[2:], w_shape[2:], attrs)
    got = winograd.conv3x3(x, w, group, win.pads_begin, win.out)
    assert_matches([got], run_ort("Conv", [x, w], attrs))


def _layer(seed: int, c: int, m: int, side: int, group: int = 1) -> tuple[np.ndarray, ...]:
    """Input in [-1, 1], He-scaled weights and a small bias for a ResNet-like 3x3 layer."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (1, c, side, side)).astype(np.float32)
    w = rng.normal(0, np.sqrt(2 / (9 * c // group)), (m, c // group, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, (m,)).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize(
    ("c", "m", "side", "group", "pads"),
    [(64, 64, 56, 1, [1, 1, 1, 1]), (128, 128, 28, 1, [1, 1, 1, 1]), (256, 256, 14, 1, [1] * 4),
     (64, 96, 15, 2, [0, 2, 1, 0])],
)
def test_dispatch_takes_winograd_and_matches_ort(c, m, side, group, pads):
    x, w, b = _layer(c + side, c, m, side, group)
    attrs = {"pads": pads, "group": group}
    winograd.reset_stats()
    check_against_ort("Conv", [x, w, b], attrs)
    assert winograd.stats()["winograd.calls"] == 1


def test_fused_relu_and_bias_on_winograd_path():
    x, w, b = _layer(3, 64, 64, 28)
    attrs = {"pads": [1, 1, 1, 1]}
    expected = np.maximum(run_ort("Conv", [x, w, b], attrs)[0], 0)
    winograd.reset_stats()
    got = run_kernel("Conv", [x, w, b], {**attrs, "activation": "Relu"})
    assert winograd.stats()["winograd.calls"] == 1
    assert_matches(got, [expected])


def test_half_input_on_winograd_path():
    x, w, b = (a.astype(np.float16) for a in _layer(4, 32, 32, 16))
    winograd.reset_stats()
    check_against_ort("Conv", [x, w, b], {"pads": [1, 1, 1, 1]})
    assert winograd.stats()["winograd.calls"] == 1


@pytest.mark.parametrize(
    ("c", "side", "attrs"),
    [(64, 56, {"strides": [2, 2], "pads": [1] * 4}), (64, 56, {"dilations": [2, 2]}),
     (512, 7, {"pads": [1] * 4}), (16, 56, {"pads": [1] * 4})],
)
def test_dispatch_keeps_direct_path(c, side, attrs):
    """Strided, dilated, 7x7 and few-channel layers stay on im2col + GEMM (slower here)."""
    x, w, _ = _layer(5, c, c, side)
    winograd.reset_stats()
    check_against_ort("Conv", [x, w], attrs)
    assert winograd.stats()["winograd.calls"] == 0


def test_filter_cache_reuses_and_never_serves_stale_weights():
    x, w, _ = _layer(6, 64, 64, 14)
    attrs = {"pads": [1, 1, 1, 1]}
    winograd.reset_stats()
    run_kernel("Conv", [x, w], attrs)
    run_kernel("Conv", [x, w.copy()], attrs)  # equal content elsewhere: a hit
    assert winograd.stats()["winograd.filter_transforms"] == 1
    w[5, 7, 1, 2] += 0.5  # changed in place, same address, same sampled fingerprint
    check_against_ort("Conv", [x, w], attrs)
    assert winograd.stats()["winograd.filter_transforms"] == 2
    assert winograd.stats()["winograd.calls"] == 3
