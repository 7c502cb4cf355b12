"""A convolution unfolded and multiplied in bands of output rows (conv.bands, conv_bands): the
bands depend on the shape alone; a band's unfold is those rows of the whole unfold; a prepared
launch split by bands (over the cores, or one band after another) gives the bits of the
general path, which runs the same bands, and onnxruntime's values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, encode
from npu_sim.errors import KernelError
from npu_sim.kernels import blas, conv, conv_bands, unfold
from npu_sim.kernels.conv import bands, geometry, prepare_conv, unfolder
from tests.kernels import (
    assert_matches,
    ort_reference,
    random_array,
    seeds,
    unprepared_conv,
    with_specials,
)

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]
FUSED = [{}, {"activation": "Relu"}, encode([Step("Sigmoid", gate=True)])]


def window(x_shape, w_shape, **attrs):
    return geometry(x_shape, w_shape, {"kernel_shape": w_shape[2:], **attrs})[1]


@pytest.mark.parametrize("x_shape, w_shape, attrs, want", [
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": (1,) * 4}, [0, 28, 56]),
    ((1, 3, 224, 224), (64, 3, 7, 7), {"pads": (3,) * 4, "strides": (2, 2)}, [0, 56, 112]),
    ((1, 256, 15, 15), (256, 256, 3, 3), {"pads": (1,) * 4}, [0, 7, 15]),
    # a quarter as many pixels as channels: the weights are the larger operand
    ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": (1,) * 4}, [0, 7]),
    ((1, 8, 16, 16), (8, 8, 3, 3), {"pads": (1,) * 4}, [0, 16]),  # too little work
    ((1, 64, 800, 1), (64, 64, 3, 1), {"pads": (1, 0, 1, 0)}, [0, 400, 800]),
    ((1, 64, 1, 400), (64, 64, 1, 3), {"pads": (0, 1, 0, 1)}, [0, 1]),  # one output row
    ((1, 64, 400), (64, 64, 3), {"pads": (1, 1)}, [0, 1]),  # 1-D
    ((1, 16, 16, 32, 32), (16, 16, 3, 3, 3), {"pads": (1,) * 6}, [0, 32]),  # 3-D
])
def test_the_bands_depend_on_the_shape_alone(x_shape, w_shape, attrs, want):
    win = window(x_shape, w_shape, **attrs)
    assert bands(w_shape[0], int(np.prod(w_shape[1:])), win) == want


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 4), h=st.integers(1, 12), w_=st.integers(1, 70), k=st.integers(1, 4),
       s=st.integers(1, 3), d=st.integers(1, 2), pads=st.tuples(*[st.integers(0, 2)] * 4),
       numba=st.booleans(), data=st.data())
def test_a_band_of_the_unfold_is_those_rows_of_the_whole_unfold(c, h, w_, k, s, d, pads, numba,
                                                               data):
    """Both unfolds (numpy's strided copy from a padded image, and numba's from the phases)."""
    x = random_array(data.draw(seeds), (c, 1, h, w_), np.float32)
    attrs = {"strides": (s, s), "dilations": (d, d), "pads": pads}
    try:
        win = window((1, c, h, w_), (1, c, k, k), **attrs)
    except KernelError:  # a kernel larger than the padded input
        return
    oh, ow = win.out
    whole = np.full((c * k * k, oh * ow), np.nan, np.float32)
    r0 = data.draw(st.integers(0, oh))
    r1 = data.draw(st.integers(r0, oh))
    band = np.full((c * k * k, (r1 - r0) * ow), np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unfold, "fits", lambda *a: numba)
        fill = unfolder(x, win)
        fill(whole, 0, oh)
        fill(band, r0, r1)
    np.testing.assert_array_equal(band, whole.reshape(-1, oh, ow)[:, r0:r1].reshape(band.shape))


def launch(inputs, attrs, out_shape):
    """The launch prepared with the band plan, its output buffer, and whether it was planned."""
    out = np.full(out_shape, np.nan, np.float32)
    planned = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bands, "plan", lambda *a, p=conv_bands.plan:
                   planned.append(p(*a)) or planned[-1])
        run = prepare_conv(inputs, attrs, [out])
    return run, out, bool(planned) and planned[0] is not None


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 24), m=st.integers(1, 24), h=st.integers(4, 30),
       w_=st.integers(3, 30), k=st.sampled_from([2, 3, 5]), s=st.integers(1, 2),
       bias=st.booleans(), fused=st.sampled_from(FUSED), seed=seeds)
def test_a_banded_launch_gives_the_bits_of_the_general_path(n, c, m, h, w_, k, s, bias, fused,
                                                           seed):
    """Any work bands here, so small shapes take the bands. Each run is checked: the first two
    go over the cores and one band after another (:class:`.cores.Choice` times both ways),
    with new input contents each time, the last with NaN, infinities and signed zeros (which
    spread to most outputs of a small convolution)."""
    finite = random_array(seed, (n, c, h, w_), np.float32, -4, 4)
    x = finite.copy()
    w = random_array(seed + 1, (m, c, k, k), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32) if bias or fused else None
    attrs = {"group": 1, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **fused}
    try:
        win = window(x.shape, w.shape, **attrs)
    except KernelError:  # no output for this geometry
        return
    inputs = [x, w] + ([b] if b is not None else [])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "BAND_MACS", 0)
        run, got, planned = launch(inputs, attrs, (n, m, *win.out))
        assert planned == (len(bands(m, c * k * k, win)) > 2 and blas.kernel_split() is not None
                           and not conv.direct_fits(c, w.shape, win, x.dtype))
        for contents in (finite, -finite, with_specials(finite, seed, SPECIALS)):
            np.copyto(x, contents)
            got.fill(np.nan)
            with np.errstate(all="ignore"):
                run()
            np.testing.assert_array_equal(got, unprepared_conv(inputs, attrs))


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 64, 40, 40), (48, 64, 3, 3), {"pads": (1,) * 4, "activation": "Relu"}),
    ((1, 3, 96, 96), (32, 3, 7, 7), {"pads": (3,) * 4, "strides": (2, 2),
                                     "activation": "Relu"}),  # a stem: numba's unfold
    ((2, 32, 48, 48), (64, 32, 3, 3), {"pads": (1,) * 4, "strides": (2, 2)}),
])
def test_a_banded_launch_matches_onnxruntime(x_shape, w_shape, attrs):
    x = random_array(1, x_shape, np.float32)
    w = random_array(2, w_shape, np.float32, -0.2, 0.2)
    b = random_array(3, w_shape[:1], np.float32)
    win = window(x_shape, w_shape, **attrs)
    run, got, planned = launch([x, w, b], attrs, (x_shape[0], w_shape[0], *win.out))
    assert planned == (blas.kernel_split() is not None)
    ort_attrs = {key: value for key, value in attrs.items() if key != "activation"}
    want = ort_reference("Conv", [x, w, b], ort_attrs)[0]
    if "activation" in attrs:
        want = np.maximum(want, 0)
    for _ in range(2):
        assert_matches(run(), [want])


def test_what_the_band_plan_leaves_to_the_general_path(monkeypatch) -> None:
    """1x1 and grouped convolutions, an input scale, a stem run directly, float16, an epilogue
    step no fused loop does, no output buffer, too few pixels per channel, an unknown BLAS."""
    x, w, b = np.zeros((1, 32, 40, 40), np.float32), np.zeros((32, 32, 3, 3), np.float32), \
        np.zeros(32, np.float32)
    pads = {"pads": (1,) * 4}
    shape = (1, 32, 40, 40)
    monkeypatch.setattr(conv, "BAND_MACS", 0)
    if blas.kernel_split() is not None:
        assert launch([x, w, b], pads, shape)[2]
    assert not launch([x, np.zeros((32, 32, 1, 1), np.float32), b], {}, shape)[2]
    assert not launch([x, np.zeros((32, 16, 3, 3), np.float32), b], {**pads, "group": 2},
                      shape)[2]
    assert not launch([x, w, b, np.ones((1, 32, 1, 1), np.float32)],
                      {**pads, "input_scale": 3}, shape)[2]
    assert not launch([x[:, :3], w[:, :3], b], pads, shape)[2]  # the stem's direct loop
    assert not launch([x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)], pads,
                      shape)[2]
    assert not launch([x, w, b, np.zeros(shape, np.float32)],
                      {**pads, **encode([Step("Add", operand=3)])}, shape)[2]
    assert conv_bands.plan([x, w, b], pads, 1, window(x.shape, w.shape, **pads), None, None,
                           ()) is None
    assert not launch([x[:, :, :4, :4], np.zeros((128, 32, 3, 3), np.float32),
                       np.zeros(128, np.float32)], pads, (1, 128, 4, 4))[2]
    monkeypatch.setattr(blas, "kernel_split", lambda: None)
    assert not launch([x, w, b], pads, shape)[2]
