"""Pool and LRN kernels against onnxruntime, over generated shapes and attributes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from npu_sim.kernels import pool
from npu_sim.kernels.pool import _plane_means
from npu_sim.kernels.registry import lookup
from tests.kernels import (
    FLOATS,
    assert_matches,
    check_against_ort,
    ort_reference,
    random_array,
    run_kernel,
    seeds,
)
from tests.ortref import single_node_model


@st.composite
def pool_case(draw: st.DrawFn, op: str) -> tuple[tuple[int, ...], dict]:
    """An input shape and pool attributes with a non-empty output and pads < kernel."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    side = 7 if rank < 3 else 4
    spatial = draw(st.lists(st.integers(1, side), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    attrs: dict = {"kernel_shape": kernel}
    if draw(st.booleans()):
        attrs["strides"] = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    dil = [1] * rank
    if op == "MaxPool" and auto_pad == "NOTSET" and draw(st.booleans()):
        dil = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
        attrs["dilations"] = dil
    pads = [0] * 2 * rank
    if auto_pad == "NOTSET":
        pads = [draw(st.integers(0, k - 1)) for k in kernel + kernel]
        attrs["pads"] = pads
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["auto_pad"] = auto_pad
    strides = attrs.get("strides", [1] * rank)
    for i in range(rank):
        span = (kernel[i] - 1) * dil[i] + 1
        if auto_pad.startswith("SAME"):
            # negative SAME padding: onnxruntime's pools crop or fail; the kernels clamp it to 0
            # like its Conv does (test_conv: test_negative_same_padding_is_clamped)
            assume((-(-spatial[i] // strides[i]) - 1) * strides[i] + span >= spatial[i])
        else:
            assume(span <= spatial[i] + pads[i] + pads[i + rank])
    if op == "MaxPool":
        attrs["storage_order"] = draw(st.integers(0, 1))
    else:
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial), attrs


@settings(max_examples=40, deadline=None)
@given(case=pool_case("MaxPool"), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_max_pool_and_indices_match_ort(case, seed, dtype):
    shape, attrs = case
    # distinct values, so the index of the maximum is unambiguous
    x = (np.random.default_rng(seed).permutation(int(np.prod(shape))).reshape(shape) / 8 - 4)
    x = x.astype(dtype)
    if dtype != np.float32:  # halves round distinct values together: compare values only
        check_against_ort("MaxPool", [x], attrs)
    else:
        check_against_ort("MaxPool", [x], attrs, n_outputs=2)


def _awkward(seed: int, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Values with ties, both zeros, infinities and NaNs at random places."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    special = rng.choice([np.nan, -np.inf, np.inf, -0.0, 0.0], shape)
    return np.where(rng.random(shape) < 0.2, special, x).astype(dtype)


@settings(max_examples=60, deadline=None)
@given(case=pool_case("MaxPool"), seed=seeds, dtype=st.sampled_from(FLOATS), split=st.booleans())
def test_max_pool_without_indices_gives_the_indices_loops_bits_and_ort(case, seed, dtype, split):
    # A launch with one output hands ``out`` of one entry: 1- and 2-D pools then take the
    # two-pass loop; its maxima must be the indices loop's, bit for bit (NaNs skipped, the
    # first of tied zeros kept), and onnxruntime's on finite values; also with the planes split
    # over the cores (the threshold at 0).
    shape, attrs = case
    x = _awkward(seed, shape, dtype)
    (want, _) = run_kernel("MaxPool", [x], attrs)
    out = np.full(want.shape, 7, dtype)
    with pytest.MonkeyPatch.context() as patch:
        if split:
            patch.setattr(pool, "SPLIT_ELEMENTS", 0)
        (got,) = lookup("MaxPool").values([x], attrs, out=[out])
    assert got.tobytes() == want.tobytes()
    assert (got is out) == (dtype == np.float32 and len(shape) <= 4)  # 3-D: the indices loop
    finite = np.where(np.isfinite(x), x, 1).astype(dtype)
    (ref,) = ort_reference("MaxPool", [finite], attrs)
    assert_matches(lookup("MaxPool").values([finite], attrs, out=[None]), [ref])


@pytest.mark.parametrize(("shape", "attrs"), [
    ((1, 64, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 31), {"kernel_shape": [2, 5], "strides": [3, 2], "dilations": [2, 3],
                      "pads": [1, 4, 1, 2], "ceil_mode": 1}),
    ((1, 4, 40), {"kernel_shape": [4], "strides": [3], "auto_pad": "SAME_UPPER"}),
])
def test_max_pool_without_indices_on_wide_rows_matches_the_indices_loop(shape, attrs):
    # rows long enough for the vector loops, edges on both sides, stride and dilation
    x = _awkward(11, shape, np.float32)
    (want, _) = run_kernel("MaxPool", [x], attrs)
    (got,) = lookup("MaxPool").values([x], attrs, out=[None])
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(("shape", "kernel"), [
    ((1, 1, 1), [2]), ((1, 2, 1, 3), [2, 1]), ((1, 1, 2, 1), [1, 2]),
    ((1, 1, 1, 2, 3), [2, 1, 1]), ((1, 1, 2, 1, 3), [1, 2, 1]), ((2, 1, 2, 3, 1), [1, 1, 2]),
])
def test_max_pool_windows_of_only_padding_get_onnxruntimes_index(shape, kernel, storage_order):
    # a size-1 dim, a kernel of 2 taps dilated by 2 and one pad each side: no tap is inside
    attrs = {"kernel_shape": kernel, "dilations": kernel, "storage_order": storage_order,
             "pads": [k - 1 for k in kernel] * 2}
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    check_against_ort("MaxPool", [x], attrs, n_outputs=2)


@settings(max_examples=40, deadline=None)
@given(case=pool_case("AveragePool"), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_average_pool_matches_ort(case, seed, dtype):
    shape, attrs = case
    check_against_ort("AveragePool", [random_array(seed, shape, dtype)], attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("outputs", [1, 2])
def test_max_pool_of_integers_with_a_window_of_only_padding_matches_ort(dtype, outputs):
    # the window dilated past the input holds only padding: the type's lowest value
    x = np.array([[[[5, 7], [1, 2]]]], dtype)
    attrs = {"kernel_shape": [2, 2], "dilations": [3, 3], "pads": [1, 1, 1, 1]}
    (want,) = ort_reference("MaxPool", [x], attrs, opset=12)
    got = lookup("MaxPool").values([x], attrs, out=[None] * outputs)[0]
    np.testing.assert_array_equal(got, want)
    assert want.min() == np.iinfo(dtype).min


def test_global_average_pool_adds_its_running_sums_in_the_platforms_pairs():
    # x86-64's MLAS adds (first + third) + (second + fourth), ARM64's neighbours; 1e8 + 1
    # rounds to 1e8 in float32, so the two orders give 2 / 4 and 0 / 4
    row = np.array([[1e8, 1, -1e8, 1]], np.float32)
    out = np.empty(1, np.float32)
    _plane_means(row, False, out)
    assert out[0] == 0.5
    _plane_means(row, True, out)
    assert out[0] == 0.0


@settings(max_examples=15, deadline=None)
@given(seed=seeds, dtype=st.sampled_from([np.int8, np.uint8]))
def test_max_pool_int8_matches_ort(seed, dtype):
    x = random_array(seed, (1, 2, 6, 5), dtype, -128, 255)
    check_against_ort("MaxPool", [x], {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1],
                                       "strides": [2, 1]}, opset=12)


def test_average_pool_dilations_match_ort():
    x = random_array(5, (1, 2, 9, 8), np.float32)
    attrs = {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1], "strides": [2, 3],
             "dilations": [2, 1], "ceil_mode": 1, "count_include_pad": 1}
    check_against_ort("AveragePool", [x], attrs, opset=19)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@settings(max_examples=15, deadline=None)
@given(spatial=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=seeds,
       dtype=st.sampled_from(FLOATS))
def test_global_pools_match_ort(op, spatial, seed, dtype):
    check_against_ort(op, [random_array(seed, (2, 3, *spatial), dtype)])


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (0, 3, 2), (0, 1, 1, 1, 1)])
def test_global_average_pool_of_an_empty_batch_matches_ort(shape):
    check_against_ort("GlobalAveragePool", [np.zeros(shape, np.float32)])


def test_global_average_pool_of_no_channels_or_empty_planes_is_np_means():
    """onnxruntime refuses these (only N may be 0); the kernel gives np.mean's answer, no
    raw exception: an empty output, or NaN for an empty plane."""
    assert run_kernel("GlobalAveragePool", [np.zeros((2, 0, 4, 4), np.float32)])[0].shape == \
        (2, 0, 1, 1)
    empty = run_kernel("GlobalAveragePool", [np.zeros((2, 3, 0, 4), np.float32)])[0]
    assert empty.shape == (2, 3, 1, 1) and np.isnan(empty).all()


def _ort_global_average_pool(x: np.ndarray, level: ort.GraphOptimizationLevel) -> np.ndarray:
    model = single_node_model("GlobalAveragePool", [x])
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"in0": x})[0]


def _same_bits_or_both_nan(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(want)  # a NaN's payload is left out: which NaN an add keeps is not fixed
    return bool((np.isnan(got) == nan).all() and got[~nan].tobytes() == want[~nan].tobytes())


@settings(max_examples=40, deadline=None)
@given(spatial=st.lists(st.integers(1, 40), min_size=1, max_size=3), seed=seeds,
       scale=st.sampled_from([1e-3, 1.0, 100.0]), special=st.booleans(),
       level=st.sampled_from([ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                              ort.GraphOptimizationLevel.ORT_ENABLE_ALL]))
def test_global_average_pool_gives_onnxruntimes_bits_written_into_the_output(
        spatial, seed, scale, special, level):
    """onnxruntime's bits (its MLAS kernel's summation order), into ``out`` when given; 5
    channels, which no NCHWc channel block divides, so every level runs that kernel."""
    x = random_array(seed, (2, 5, *spatial), np.float32) * np.float32(scale)
    if special:
        rng = np.random.default_rng(seed)
        x[rng.random(x.shape) < 0.05] = rng.choice([np.nan, np.inf, -np.inf, -0.0])
    want = _ort_global_average_pool(x, level)
    out = np.empty(want.shape, np.float32)
    got = lookup("GlobalAveragePool").values([x], {}, out=[out])
    assert got[0] is out
    assert _same_bits_or_both_nan(out, want)
    assert _same_bits_or_both_nan(run_kernel("GlobalAveragePool", [x], {})[0], want)


@settings(max_examples=25, deadline=None)
@given(channels=st.integers(1, 7), size=st.sampled_from([1, 3, 5, 7]), seed=seeds,
       alpha=st.sampled_from([1e-4, 0.01, 0.3, 1.0]), beta=st.sampled_from([0.1, 0.5, 0.75, 1.0]),
       bias=st.sampled_from([0.5, 1.0, 2.0]), dtype=st.sampled_from(FLOATS))
def test_lrn_matches_ort(channels, size, seed, alpha, beta, bias, dtype):
    x = random_array(seed, (2, channels, 3, 4), dtype)
    check_against_ort("LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "bias": bias})


F = np.float32
X = np.zeros((1, 2, 5, 5), F)
BAD = [
    ("MaxPool", [X], {}, "kernel_shape attribute is required"),
    ("MaxPool", [X], {"kernel_shape": [2]}, "one entry per spatial dim"),
    ("MaxPool", [X], {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, "smaller than kernel"),
    ("MaxPool", [X], {"kernel_shape": [2, 2], "pads": [-1, 0, 0, 0]},
     r"pads=\[-1, 0, 0, 0\] must have every entry >= 0"),
    ("MaxPool", [X], {"kernel_shape": [2, 2], "storage_order": 2},
     "storage_order=2; expected 0 or 1"),
    ("MaxPool", [X], {"kernel_shape": [6, 2]}, "does not fit"),
    ("MaxPool", [X], {"kernel_shape": [2, 2], "strides": [0, 1]},
     r"strides=\[0, 1\] must have every entry >= 1"),
    ("MaxPool", [X.astype(np.int32)], {"kernel_shape": [2, 2]},
     "dtype int32; expected float32, float16, bfloat16, int8 or uint8"),
    ("MaxPool", [np.zeros((1, 2), F)], {"kernel_shape": [2]},
     r"shape \(1, 2\) has rank 2; expected \(N, C, \*spatial\) with 1 to 3 spatial"),
    ("AveragePool", [X.astype(np.int8)], {"kernel_shape": [2, 2]},
     "dtype int8; expected one of float32, float16, bfloat16"),
    ("AveragePool", [X], {"kernel_shape": [2, 2], "auto_pad": "FULL"},
     "auto_pad='FULL'; expected one of .*SAME_LOWER"),
    ("GlobalAveragePool", [np.zeros((2, 3), F)], {}, "rank"),
    ("LRN", [X], {}, "size=None; expected an integer >= 1"),
    ("LRN", [np.zeros((3,), F)], {"size": 3}, "rank"),
]


@pytest.mark.parametrize("op, inputs, attrs, words", BAD, ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_rejects_bad_input(op, inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel(op, inputs, attrs)
