"""Conv and ConvTranspose kernels against onnxruntime, over generated shapes and attributes.

Inputs are drawn from [-1, 1] so an output of K = C/group * prod(kernel) <= 81 terms stays well
inside float32's tolerance (1e-4 relative, 1e-5 absolute) whatever order the two
implementations sum in: the sums' rounding error is about sqrt(K) * 2**-24 * |sum| < 1e-6 here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import FLOATS, assert_matches, check_against_ort, random_array, run_kernel, seeds
from tests.ortref import run_ort


@st.composite
def conv_case(draw: st.DrawFn, depthwise: bool = False) -> tuple[list, dict]:
    """(x, w, b?) shapes and Conv attributes whose output is non-empty."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.integers(1, 3))
    cg = 1 if depthwise else draw(st.integers(1, 3))
    mg = draw(st.integers(1, 2 if depthwise else 3))
    side = 6 if rank < 3 else 4
    spatial = draw(st.lists(st.integers(1, side), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    attrs: dict = {"group": group}
    if draw(st.booleans()):
        attrs["strides"] = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if draw(st.booleans()) and not auto_pad.startswith("SAME"):  # onnxruntime: not with SAME
        attrs["dilations"] = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    if auto_pad == "NOTSET":
        attrs["pads"] = draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
    else:
        attrs["auto_pad"] = auto_pad
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    dil = attrs.get("dilations", [1] * rank)
    pads = attrs.get("pads", [0] * 2 * rank)
    for i in range(rank):
        span = (kernel[i] - 1) * dil[i] + 1
        if auto_pad in ("NOTSET", "VALID"):
            assume(span <= spatial[i] + pads[i] + pads[i + rank])
    n = draw(st.integers(1, 2))
    shapes = [(n, cg * group, *spatial), (mg * group, cg, *kernel)]
    if draw(st.booleans()):
        shapes.append((mg * group,))
    return shapes, attrs


def _inputs(shapes: list, seed: int, dtype: np.dtype) -> list[np.ndarray]:
    return [random_array(seed + i, s, dtype, -1, 1) for i, s in enumerate(shapes)]


@settings(max_examples=40, deadline=None)
@given(case=conv_case(), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_conv_matches_ort(case, seed, dtype):
    shapes, attrs = case
    check_against_ort("Conv", _inputs(shapes, seed, dtype), attrs)


@settings(max_examples=25, deadline=None)
@given(case=conv_case(depthwise=True), seed=seeds)
def test_depthwise_conv_matches_ort(case, seed):
    shapes, attrs = case
    check_against_ort("Conv", _inputs(shapes, seed, np.float32), attrs)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 8), m=st.integers(1, 8), h=st.integers(1, 9),
       w=st.integers(1, 9), stride=st.integers(1, 3), seed=seeds)
def test_pointwise_conv_matches_ort(n, c, m, h, w, stride, seed):
    """The 1x1 path (a GEMM over a strided view) agrees with onnxruntime."""
    x, wt = _inputs([(n, c, h, w), (m, c, 1, 1)], seed, np.float32)
    check_against_ort("Conv", [x, wt], {"strides": [stride, stride]})


@st.composite
def conv_transpose_case(draw: st.DrawFn) -> tuple[list, dict]:
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.integers(1, 2))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    side = 5 if rank < 3 else 3
    spatial = draw(st.lists(st.integers(1, side), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dil = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    attrs: dict = {"group": group, "strides": strides, "dilations": dil}
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, spatial, kernel, dil,
                                                                  strict=True)]
    how = draw(st.sampled_from(["pads", "output_shape", "SAME_UPPER", "SAME_LOWER"]))
    if how == "pads":
        # the spec allows output_padding < max(stride, dilation); onnxruntime only < stride
        attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
        pads = draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
        assume(all(f + p - pads[i] - pads[i + rank] >= 1
                   for i, (f, p) in enumerate(zip(full, attrs["output_padding"], strict=True))))
        attrs["pads"] = pads
    elif how == "output_shape":
        # below full + stride: larger ones imply another input size (onnxruntime rejects them)
        attrs["output_shape"] = [draw(st.integers(max(1, f - 3), f + s - 1))
                                 for f, s in zip(full, strides, strict=True)]
    else:
        attrs["auto_pad"] = how
    n = draw(st.integers(1, 2))
    shapes = [(n, cg * group, *spatial), (cg * group, mg, *kernel)]
    if draw(st.booleans()):
        shapes.append((mg * group,))
    return shapes, attrs


@settings(max_examples=40, deadline=None)
@given(case=conv_transpose_case(), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_conv_transpose_matches_ort(case, seed, dtype):
    shapes, attrs = case
    check_against_ort("ConvTranspose", _inputs(shapes, seed, dtype), attrs)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize(
    "activation, params, ort_op, ort_attrs",
    [("Relu", (), "Relu", {}), ("LeakyRelu", (0.2,), "LeakyRelu", {"alpha": 0.2}),
     ("Sigmoid", (), "Sigmoid", {})],
)
def test_fused_activation_equals_conv_then_activation(op, activation, params, ort_op, ort_attrs):
    x, w, b = _inputs([(1, 4, 5, 5), (4, 4, 3, 3), (4,)], 7, np.float32)
    attrs = {"pads": [1, 1, 1, 1]}
    (plain,) = run_ort(op, [x, w, b], attrs)
    expected = run_ort(ort_op, [plain], ort_attrs)
    fused = run_kernel(op, [x, w, b], {**attrs, "activation": activation,
                                       "activation_params": params})
    assert_matches(fused, expected)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("width", [3, 8])
def test_negative_same_padding_is_clamped(auto_pad, width):
    """Kernel 1, stride 3: SAME "needs" a total pad of -2 (width 3) or -1 (width 8)."""
    x, w = _inputs([(1, 2, 1, width), (2, 2, 1, 1)], 11, np.float32)
    check_against_ort("Conv", [x, w], {"strides": [1, 3], "auto_pad": auto_pad})


def test_conv_keeps_half_dtype_and_rounds_once():
    x, w = _inputs([(1, 3, 4, 4), (2, 3, 2, 2)], 3, np.float16)
    (y,) = run_kernel("Conv", [x, w], {})
    exact = run_ort("Conv", [x.astype(np.float32), w.astype(np.float32)], {})[0]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, exact.astype(np.float16))


F = np.float32
BAD_CONV = [
    ("channels", [np.zeros((1, 4, 5, 5), F), np.zeros((2, 3, 3, 3), F)], {}, "channels"),
    ("group", [np.zeros((1, 4, 5, 5), F), np.zeros((2, 2, 3, 3), F)], {"group": 3}, "group=3"),
    ("group0", [np.zeros((1, 4, 5, 5), F), np.zeros((2, 4, 3, 3), F)], {"group": 0}, "group=0"),
    ("neg pads", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), F)],
     {"pads": [-1, 0, 0, 0]}, "pads"),
    ("rank", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3), F)], {}, "rank"),
    ("rank 4d", [np.zeros((1, 2, 3, 3, 3, 3), F), np.zeros((2, 2, 1, 1, 1, 1), F)], {},
     "spatial"),
    ("too big", [np.zeros((1, 2, 2, 2), F), np.zeros((2, 2, 3, 3), F)], {}, "does not fit"),
    ("bias", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), F), np.zeros(3, F)], {},
     "bias"),
    ("kernel_shape", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), F)],
     {"kernel_shape": [2, 2]}, "kernel_shape"),
    ("strides len", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), F)],
     {"strides": [1]}, "strides"),
    ("auto_pad", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), F)],
     {"auto_pad": "SAME"}, "auto_pad"),
    ("dtype", [np.zeros((1, 2, 5, 5), F), np.zeros((2, 2, 3, 3), np.float16)], {}, "dtype"),
    ("int", [np.zeros((1, 2, 5, 5), np.int32), np.zeros((2, 2, 3, 3), np.int32)], {}, "dtype"),
    ("missing w", [np.zeros((1, 2, 5, 5), F), None], {}, "needs"),
]


@pytest.mark.parametrize("name, inputs, attrs, words", BAD_CONV, ids=[c[0] for c in BAD_CONV])
def test_conv_rejects_bad_input(name, inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel("Conv", inputs, attrs)


BAD_TRANSPOSE = [
    ("channels", [np.zeros((1, 4, 3, 3), F), np.zeros((3, 2, 3, 3), F)], {}, "channels"),
    ("group", [np.zeros((1, 4, 3, 3), F), np.zeros((4, 2, 3, 3), F)], {"group": 3}, "group=3"),
    ("out pad", [np.zeros((1, 2, 3, 3), F), np.zeros((2, 2, 3, 3), F)],
     {"strides": [2, 2], "output_padding": [2, 0]}, "output_padding"),
    ("neg pads", [np.zeros((1, 2, 3, 3), F), np.zeros((2, 2, 3, 3), F)],
     {"pads": [0, -1, 0, 0]}, "pads"),
    ("crop all", [np.zeros((1, 2, 1, 1), F), np.zeros((2, 2, 1, 1), F)],
     {"pads": [1, 0, 0, 0]}, "empty output"),
    ("rank", [np.zeros((1, 2, 3, 3), F), np.zeros((2, 2, 3), F)], {}, "rank"),
    ("output_shape", [np.zeros((1, 2, 3), F), np.zeros((2, 2, 3), F)],
     {"output_shape": [7]}, "output_shape"),
]


@pytest.mark.parametrize("name, inputs, attrs, words", BAD_TRANSPOSE,
                         ids=[c[0] for c in BAD_TRANSPOSE])
def test_conv_transpose_rejects_bad_input(name, inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel("ConvTranspose", inputs, attrs)


@settings(max_examples=30, deadline=None)
@given(case=conv_case(), seed=seeds)
def test_numba_unfold_matches_ort_and_numpy_unfold_bits(case, seed):
    """The numba unfold (:mod:`npu_sim.kernels.unfold`) on every generated shape, though its
    rule picks it only for long strided rows: onnxruntime's values, the numpy unfold's bits."""
    from npu_sim.kernels import conv, unfold
    shapes, attrs = case
    inputs = _inputs(shapes, seed, np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conv, "direct_fits", lambda *args: False)  # the unfold, not the stems'
        numpy_path = run_kernel("Conv", inputs, attrs)
        patch.setattr(unfold, "fits", lambda dtype, stride_w, out_w: True)
        numba_path = check_against_ort("Conv", inputs, attrs)
    np.testing.assert_array_equal(numba_path[0], numpy_path[0])


@pytest.mark.parametrize("c, size, kernel, stride, pad, numba", [
    (3, 224, 3, 2, 1, True),    # MobileNet-V3's stem: 112-pixel rows
    (3, 112, 3, 2, 1, True),    # 56-pixel rows, at the limit
    (3, 110, 3, 2, 1, False),   # 55-pixel rows: pad and numpy copy
    (3, 224, 3, 1, 1, False),   # stride 1: pad and numpy copy
    (3, 230, 7, 2, 3, True),    # a ResNet stem, odd width
])
def test_unfold_rule_matches_ort_on_both_sides(c, size, kernel, stride, pad, numba,
                                               monkeypatch):
    from npu_sim.kernels import conv, unfold
    monkeypatch.setattr(conv, "direct_fits", lambda *args: False)  # the unfold, not the stems'
    out = (size + 2 * pad - kernel) // stride + 1
    assert unfold.fits(np.dtype(np.float32), stride, out) is numba
    inputs = _inputs([(1, c, size, size), (16, c, kernel, kernel), (16,)], 7, np.float32)
    attrs = {"strides": [stride, stride], "pads": [pad] * 4}
    chosen = check_against_ort("Conv", inputs, attrs)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unfold, "fits", lambda dtype, stride_w, out_w: not numba)
        other = run_kernel("Conv", inputs, attrs)[0]
    np.testing.assert_array_equal(chosen, other)
