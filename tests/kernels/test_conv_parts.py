"""A prepared Conv split by output channels over the cores (conv_parts): the bits of the launch
run whole, for 1x1 and depthwise convolutions with every fused epilogue it takes, and
onnxruntime's values. The work thresholds are forced to 0 so small shapes take the split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, decode, encode
from npu_sim.kernels import blas, conv_parts
from npu_sim.kernels.conv import as5d, pointwise, pointwise_columns, prepare_conv
from tests.kernels import (
    non_finite_depthwise_case,
    random_array,
    resnet_block_end,
    seeds,
    unprepared_conv,
    with_specials,
)
from tests.ortref import run_ort

#: Whether this host's BLAS kernel lets a GEMM split keep the bits (else 1x1 launches run whole).
GEMMS_SPLIT = blas.kernel_split() is not None
EPILOGUES = [{}, {"activation": "Relu"}, encode([Step("Sigmoid", gate=True)]),
             encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))])]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]


@pytest.fixture
def split_always(monkeypatch):
    monkeypatch.setattr(conv_parts, "SPLIT_WORK", 0)
    monkeypatch.setattr(conv_parts, "DEPTHWISE_WORK", 0)
    monkeypatch.setattr(conv_parts, "NATIVE_WORK", 0)
    monkeypatch.setattr(conv_parts, "NATIVE_DEPTHWISE_WORK", 0)


def launches(x, w, b, attrs, out_shape, extra=()):
    """The launch prepared whole (thresholds out of reach) and split (thresholds 0), each with
    its own output buffer; the split one is checked to be planned."""
    outs = [np.full(out_shape, np.nan, np.float32) for _ in range(2)]
    inputs = [x, w, b, *extra] if extra else [x, w] + ([] if b is None else [b])
    prepared = []
    for work in (1 << 62, 0):
        planned = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_parts, "SPLIT_WORK", work)
            mp.setattr(conv_parts, "DEPTHWISE_WORK", work)
            mp.setattr(conv_parts, "NATIVE_WORK", work)
            mp.setattr(conv_parts, "NATIVE_DEPTHWISE_WORK", work)
            mp.setattr(conv_parts, "plan", lambda *a, p=conv_parts.plan, log=planned:
                       log.append(p(*a)) or log[-1])
            prepared.append(prepare_conv(inputs, attrs, [outs[len(prepared)]]))
        assert planned[0] is None or work == 0
    return prepared[0], prepared[1], outs, planned[0] is not None


def assert_split_equals_whole(x, w, b, attrs, out_shape, extra=(), *, planned=True):
    """The split launch gives the whole one's bits; it must have been planned, or (GEMMs, whose
    parts must stay off OpenBLAS's small-matrix kernel) only the drawn shapes that allow it
    count. With a BLAS kernel :func:`.blas.kernel_split` does not know, a GEMM is never split."""
    whole, split, (want, got), was = launches(x, w, b, attrs, out_shape, extra)
    if planned:
        assert was
    elif GEMMS_SPLIT:
        assume(was)
    else:
        assert not was
        return
    with np.errstate(all="ignore"):
        whole()
        result = split()[0]
    assert result is got
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(16, 48), m=st.integers(32, 96), h=st.integers(40, 80),
       w_=st.integers(40, 80), bias=st.booleans(), epilogue=st.sampled_from(EPILOGUES),
       seed=seeds)
def test_a_split_1x1_conv_gives_the_bits_of_the_whole_launch(n, c, m, h, w_, bias, epilogue,
                                                            seed):
    x = with_specials(random_array(seed, (n, c, h, w_), np.float32, -4, 4), seed, SPECIALS)
    w = random_array(seed + 1, (m, c, 1, 1), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32) if bias or epilogue else None
    attrs = {"group": 1, "kernel_shape": (1, 1), **epilogue}
    assert_split_equals_whole(x, w, b, attrs, (n, m, h, w_), planned=False)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(200, 600), m=st.integers(32, 80),
       pixels=st.integers(150, 400), bias=st.booleans(), residual=st.booleans(), seed=seeds)
def test_a_split_squeeze_excite_projection_gives_the_bits_of_the_whole_launch(
        n, c, m, pixels, bias, residual, seed):
    """A 1x1 convolution reading the squeeze-excite scale (its weights scaled per input channel,
    each part its own rows) and adding the residual."""
    x = random_array(seed, (n, c, pixels, 1), np.float32, -4, 4)
    w = random_array(seed + 1, (m, c, 1, 1), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32) if bias else None
    scale = random_array(seed + 3, (1, c, 1, 1), np.float32, 0, 1)
    r = with_specials(random_array(seed + 4, (n, m, pixels, 1), np.float32), seed, SPECIALS)
    attrs = {"group": 1, "kernel_shape": (1, 1), "input_scale": 3,
             **(encode([Step("Add", operand=4)]) if residual else {})}
    assert_split_equals_whole(x, w, b, attrs, (n, m, pixels, 1), (scale, r), planned=False)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(2, 300), k=st.sampled_from([1, 3, 5]),
       s=st.integers(1, 2), size=st.integers(1, 13), bias=st.booleans(),
       epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_a_split_channels_last_depthwise_conv_gives_the_bits_of_the_whole_launch(
        n, c, k, s, size, bias, epilogue, seed):
    """Output planes below 14x14 run channels-last: each native part transposes its own
    channels in and out; padding is skipped there, so infinite weights take it too."""
    x = with_specials(random_array(seed, (n, c, size * s, size * s), np.float32, -4, 4), seed,
                      SPECIALS)
    w = with_specials(random_array(seed + 1, (c, 1, k, k), np.float32, -1, 1), seed + 1,
                      [np.inf, -np.inf, np.nan])
    b = random_array(seed + 2, (c,), np.float32) if bias or epilogue else None
    attrs = {"group": c, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **epilogue}
    out = (size * s + 2 * (k // 2) - k) // s + 1
    assert_split_equals_whole(x, w, b, attrs, (n, c, out, out), planned=b is not None)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(2, 20), mult=st.integers(1, 2),
       k=st.sampled_from([3, 5]), s=st.integers(1, 2), size=st.integers(0, 12), bias=st.booleans(),
       epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_a_split_depthwise_conv_gives_the_bits_of_the_whole_launch(n, c, mult, k, s, size, bias,
                                                                  epilogue, seed):
    """Output planes of 14x14 and more (28x28 at stride 2) run on phase-split planes."""
    size += 14 * s
    x = with_specials(random_array(seed, (n, c, size * s, size * s), np.float32, -4, 4), seed,
                      SPECIALS)
    w = random_array(seed + 1, (c * mult, 1, k, k), np.float32, -1, 1)
    b = random_array(seed + 2, (c * mult,), np.float32) if bias or epilogue else None
    attrs = {"group": c, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **epilogue}
    out = (size * s + 2 * (k // 2) - k) // s + 1
    assert_split_equals_whole(x, w, b, attrs, (n, c * mult, out, out), planned=c * mult > 1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 4), m=st.integers(1, 40), k=st.sampled_from([3, 5]),
       s=st.integers(1, 2), size=st.integers(5, 40), bias=st.booleans(),
       epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_a_split_image_stem_gives_the_bits_of_the_whole_launch(n, c, m, k, s, size, bias,
                                                              epilogue, seed):
    """A direct convolution of 1 to 4 input channels (an image stem), split by output channels
    in groups of four as :func:`npu_sim.kernels.taps.direct` sums them."""
    x = with_specials(random_array(seed, (n, c, size, size), np.float32, -4, 4), seed, SPECIALS)
    w = random_array(seed + 1, (m, c, k, k), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32) if bias or epilogue else None
    attrs = {"group": 1, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **epilogue}
    out = (size + 2 * (k // 2) - k) // s + 1
    # one group of four channels or fewer is not split
    assert_split_equals_whole(x, w, b, attrs, (n, m, out, out), planned=m > conv_parts.DIRECT_ALIGN)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), m=st.integers(1, 12), k=st.sampled_from([3, 5]),
       s=st.integers(1, 3), h=st.integers(1, 40), w_=st.integers(1, 24),
       pads=st.tuples(*[st.integers(0, 4)] * 4), epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_an_image_stem_split_by_output_rows_gives_the_bits_of_the_whole_launch(
        n, c, m, k, s, h, w_, pads, epilogue, seed):
    """With a bias and a native epilogue loop an image stem's parts are bands of output rows,
    each splitting the input rows it reads into phases of its own: unequal bands (odd heights),
    bands that read only padding, strides 1 to 3, uneven pads, several images (the buffers
    reused), down to one output channel."""
    out_h = (h + pads[0] + pads[2] - k) // s + 1
    out_w = (w_ + pads[1] + pads[3] - k) // s + 1
    assume(out_h >= 2 and out_w >= 1)
    x = with_specials(random_array(seed, (n, c, h, w_), np.float32, -4, 4), seed, SPECIALS)
    w = random_array(seed + 1, (m, c, k, k), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32)
    attrs = {"group": 1, "kernel_shape": (k, k), "strides": (s, s), "pads": pads, **epilogue}
    banded = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_parts.taps, "direct_record", lambda *a, f=conv_parts.taps.direct_record:
                   banded.append(f(*a)) or banded[-1])
        assert_split_equals_whole(x, w, b, attrs, (n, m, out_h, out_w))
    assert banded and banded[0] is not None


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(16, 48), m=st.integers(32, 96), h=st.integers(40, 80),
       stride=st.integers(1, 2), relu=st.booleans(), seed=seeds)
def test_a_split_resnet_block_end_gives_the_bits_of_the_unprepared_conv(n, c, m, h, stride, relu,
                                                                         seed):
    """A ResNet block's last 1x1 convolution (strided or not: its pixels gathered into a buffer
    of the launch's own) with its bias, the residual Add and the Relu, split: what the general
    path's pieces give one after another."""
    inputs, attrs, out = resnet_block_end(seed, n, c, m, h, stride, relu, SPECIALS)
    x = inputs[0]
    _, split, (_, got), was = launches(*inputs[:3], attrs, out, inputs[3:])
    if GEMMS_SPLIT:
        assume(was)
    else:
        assert not was
    for _ in range(2):  # the second run gathers the pixels again
        got.fill(np.nan)
        with np.errstate(all="ignore"):
            split()
        np.testing.assert_array_equal(got, unprepared_conv(inputs, attrs))
        x[:, :, ::stride] *= 2  # new contents, the same arrays


def test_the_split_is_planned_for_the_mobile_nets_launches(split_always) -> None:
    """1x1 over views of the input (or a buffer of gathered pixels) and depthwise on
    phase-split planes split; what they do not take (a 1x1 whose columns come as no views, a
    broadcast residual, a step no fused loop does, no output buffer, GEMM parts small enough
    for OpenBLAS's small-matrix kernel) does not."""
    x = np.zeros((1, 64, 64, 64), np.float32)
    w1, wd, b = np.zeros((32, 64, 1, 1), np.float32), np.zeros((64, 1, 3, 3), np.float32), \
        np.zeros(64, np.float32)
    one, dw = {"group": 1, "kernel_shape": (1, 1)}, {"group": 64, "pads": (1, 1, 1, 1)}
    residual = {**one, **encode([Step("Add", operand=3)])}

    def planned(inputs, attrs, *, into=True):
        """A plan call as prepare_conv's: the decoded steps, a 1x1's pixel columns (None for a
        strided 1x1 here: prepare_conv gathers those into a buffer of its own)."""
        group, win, out = _window(inputs[0], inputs[1], attrs)
        columns = pointwise_columns(as5d(inputs[0]), win) if pointwise(group, win) else None
        if columns is not None and not all(np.shares_memory(c, inputs[0]) for c in columns):
            columns = None
        return conv_parts.plan(inputs, attrs, group, win, out if into else None, None,
                               decode("Conv", attrs), columns)

    assert (planned([x, w1, b[:32]], one) is not None) == GEMMS_SPLIT
    assert planned([x, wd, b], dw) is not None
    assert (planned([x, w1, b[:32], np.zeros((1, 32, 64, 64), np.float32)], residual)
            is not None) == GEMMS_SPLIT
    assert planned([x, w1, b[:32], np.zeros((1, 32, 1, 1), np.float32)], residual) is None
    # a part of 12 or 16 rows x 64 channels x 900 pixels would run on the small-matrix kernel
    small = np.zeros((1, 64, 30, 30), np.float32)
    assert planned([small, w1, b[:32]], one) is None
    assert planned([x, w1, b[:32]], {**one, "strides": (2, 2)}) is None
    assert planned([x, w1, b[:32]], {**one, **encode([Step("Sigmoid", gate=True)])}) is None
    assert planned([x, w1, b[:32]], one, into=False) is None


def _window(x, w, attrs):
    from npu_sim.kernels.conv import geometry

    group, win = geometry(x.shape, w.shape, attrs)
    return group, win, np.empty((x.shape[0], w.shape[0], *win.out), np.float32)


def test_non_finite_depthwise_weights_run_the_launch_whole() -> None:
    """Phase-split planes multiply the padding by the weights; an inf weight there would make
    NaN where the loop skipping padded taps makes inf: that run goes whole."""
    inputs, attrs, shape = non_finite_depthwise_case()
    w = inputs[1]
    whole, split, (want, got), _ = launches(*inputs, attrs, shape)
    w[2, 0, 0, 0] = np.inf  # a value of this run, after planning
    with np.errstate(all="ignore"):
        whole()
        split()
    np.testing.assert_array_equal(got, want)
    assert np.isinf(got[0, 2]).any()


@pytest.mark.parametrize("shape, weight, group", [
    ((1, 16, 56, 56), (96, 16, 1, 1), 1), ((2, 24, 20, 20), (24, 1, 5, 5), 24)])
def test_a_split_conv_with_silu_matches_onnxruntime(split_always, monkeypatch, shape, weight,
                                                   group):
    planned = []
    monkeypatch.setattr(conv_parts, "plan", lambda *a, p=conv_parts.plan:
                        planned.append(p(*a)) or planned[-1])
    x = random_array(1, shape, np.float32)
    w = random_array(2, weight, np.float32, -1, 1)
    b = random_array(3, weight[:1], np.float32)
    conv = {"group": group, "kernel_shape": weight[2:], "pads": (weight[2] // 2,) * 4}
    out = np.empty((shape[0], weight[0], *shape[2:]), np.float32)
    got = prepare_conv([x, w, b], {**conv, **encode([Step("Sigmoid", gate=True)])}, [out])()[0]
    y = run_ort("Conv", [x, w, b], conv)[0]
    want = run_ort("Mul", [y, run_ort("Sigmoid", [y])[0]])[0]
    # the launch was split (a 1x1 one: where the BLAS kernel keeps the bits)
    assert planned and (planned[0] is not None) == (group > 1 or GEMMS_SPLIT)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
