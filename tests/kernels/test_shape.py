"""Shape and data-movement kernels against onnxruntime, in current and older opset forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import (
    broadcastable,
    check_against_ort,
    check_like_ort,
    random_array,
    run_kernel,
    seeds,
    shapes,
)

DTYPES = st.sampled_from([np.float32, np.float16, np.int8, np.uint8, np.int32, np.int64])
I64 = np.int64


def ints(values) -> np.ndarray:
    return np.array(values, dtype=I64)


@settings(max_examples=40)
@given(data=st.data(), shape=shapes(), seed=seeds, dtype=DTYPES)
def test_reshape_matches_ort(data, shape, seed, dtype):
    dims = data.draw(st.permutations(shape))
    target = []
    for d in dims:  # merge neighbours of a permutation of the dims: same element count
        if target and data.draw(st.booleans()):
            target[-1] *= d
        else:
            target.append(d)
    target += [1] * data.draw(st.integers(0, 1))
    allowzero = data.draw(st.sampled_from([0, 1]))
    if target and data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    elif not allowzero:
        target = [0 if i < len(shape) and t == shape[i] else t for i, t in enumerate(target)]
    x = random_array(seed, shape, dtype)
    check_against_ort("Reshape", [x, ints(target)], {"allowzero": allowzero}, opset=14,
                      constant_inputs=[1], upcast_halves=False)


@settings(max_examples=25)
@given(data=st.data(), shape=shapes(), seed=seeds, dtype=DTYPES)
def test_flatten_and_transpose_match_ort(data, shape, seed, dtype):
    x = random_array(seed, shape, dtype)
    axis = data.draw(st.integers(-len(shape), len(shape)))
    check_against_ort("Flatten", [x], {"axis": axis}, opset=13, upcast_halves=False)
    perm = data.draw(st.permutations(range(len(shape))))
    attrs = {"perm": list(perm)} if perm and data.draw(st.booleans()) else {}
    check_against_ort("Transpose", [x], attrs, opset=13, upcast_halves=False)


@settings(max_examples=30)
@given(data=st.data(), shape=shapes(min_dims=1), seed=seeds, dtype=DTYPES, n=st.integers(1, 4))
def test_concat_matches_ort(data, shape, seed, dtype, n):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    arrays = []
    for i in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 3))
        arrays.append(random_array(seed + i, s, dtype))
    check_against_ort("Concat", arrays, {"axis": axis}, opset=13, upcast_halves=False)


@settings(max_examples=40)
@given(data=st.data(), shape=shapes(min_dims=1, max_side=7), seed=seeds,
       form=st.sampled_from(["input", "attribute", "num_outputs"]))
def test_split_matches_ort(data, shape, seed, form):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    x = random_array(seed, shape, np.float32)
    if form == "num_outputs":
        n = data.draw(st.integers(1, dim + 2))  # past dim: empty tail parts
        check_like_ort("Split", [x], {"axis": axis, "num_outputs": n}, n_outputs=n, opset=18)
        return
    cuts = sorted(data.draw(st.lists(st.integers(0, dim), max_size=3)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, dim], strict=True)]
    if form == "input":
        check_against_ort("Split", [x, ints(sizes)], {"axis": axis}, n_outputs=len(sizes),
                          opset=13, constant_inputs=[1])
    else:
        check_against_ort("Split", [x], {"axis": axis, "split": sizes}, n_outputs=len(sizes),
                          opset=11)


@settings(max_examples=50)
@given(data=st.data(), shape=shapes(min_dims=1, max_side=6), seed=seeds, dtype=DTYPES,
       old=st.booleans())
def test_slice_matches_ort(data, shape, seed, dtype, old):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    axes = [a - rank if data.draw(st.booleans()) else a for a in axes]
    bound = st.integers(-8, 8) | st.sampled_from([2**62, -(2**62)])
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    x = random_array(seed, shape, dtype)
    if old:
        check_against_ort("Slice", [x], {"starts": starts, "ends": ends, "axes": axes}, opset=9,
                          upcast_halves=False)
        return
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    check_against_ort("Slice", [x, ints(starts), ints(ends), ints(axes), ints(steps)], opset=13,
                      constant_inputs=[1, 2, 3, 4], upcast_halves=False)


@settings(max_examples=30)
@given(data=st.data(), shape=shapes(max_side=3), seed=seeds, old=st.booleans())
def test_squeeze_unsqueeze_match_ort(data, shape, seed, old):
    x = random_array(seed, shape, np.float32)
    ones = [i for i, d in enumerate(shape) if d == 1]
    squeeze = data.draw(st.none() | st.lists(st.sampled_from(ones), unique=True) if ones
                        else st.none())
    rank = len(shape)
    unsq = data.draw(st.lists(st.integers(0, rank), min_size=1, max_size=2, unique=True))
    unsq = [a - (rank + len(unsq)) if data.draw(st.booleans()) else a for a in unsq]
    if old:
        check_against_ort("Squeeze", [x], {"axes": squeeze} if squeeze else {}, opset=11)
        check_against_ort("Unsqueeze", [x], {"axes": unsq}, opset=11)
    else:
        sq_inputs = [x] if squeeze is None else [x, ints(squeeze)]
        check_against_ort("Squeeze", sq_inputs, opset=13, constant_inputs=[1])
        check_against_ort("Unsqueeze", [x, ints(unsq)], opset=13, constant_inputs=[1])


@settings(max_examples=40)
@given(data=st.data(), shape=shapes(min_dims=1), seed=seeds, dtype=DTYPES,
       index_shape=shapes(max_dims=2), index_dtype=st.sampled_from([np.int32, np.int64]))
def test_gather_matches_ort(data, shape, seed, dtype, index_shape, index_dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    indices = random_array(seed + 1, index_shape, index_dtype, -dim, dim - 1)
    x = random_array(seed, shape, dtype)
    check_against_ort("Gather", [x, indices], {"axis": axis}, opset=13, upcast_halves=False)


@settings(max_examples=30)
@given(data=st.data(), shape=shapes(), seed=seeds, dtype=DTYPES)
def test_expand_matches_ort(data, shape, seed, dtype):
    other = data.draw(broadcastable(shape))
    x_shape, target = (shape, other) if data.draw(st.booleans()) else (other, shape)
    x = random_array(seed, x_shape, dtype)
    check_against_ort("Expand", [x, ints(target)], opset=13, constant_inputs=[1],
                      upcast_halves=False)


@settings(max_examples=50)
@given(data=st.data(), shape=shapes(min_dims=1, max_side=4), seed=seeds,
       mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]),
       dtype=st.sampled_from([np.float32, np.int32, np.int64, np.uint8]))
def test_pad_matches_ort(data, shape, seed, mode, dtype):
    low = -1 if mode in ("constant", "edge") else 0
    pads = []
    for _side in ("begin", "end"):
        for d in shape:
            top = min(3, d - 1) if mode == "reflect" else 3  # reflect pads stay below the dim
            # Crops leave at least one element: onnxruntime's edge mode rejects empty extents.
            pads.append(data.draw(st.integers(low if d > 2 else 0, top)))
    x = random_array(seed, shape, dtype)
    inputs = [x, ints(pads)]
    if mode == "constant" and data.draw(st.booleans()):
        inputs.append(np.array(7, dtype))
    check_against_ort("Pad", inputs, {"mode": mode}, opset=19, constant_inputs=[1, 2])
    if mode != "wrap" and dtype == np.float32 and data.draw(st.booleans()):
        check_against_ort("Pad", [x], {"mode": mode, "pads": pads, "value": 3.0}, opset=10)


def test_pad_axes_input_matches_ort():
    x = random_array(1, (2, 3, 4), np.float32)
    check_against_ort("Pad", [x, ints([1, -1, 2, 0]), None, ints([-1, 0])], opset=18,
                      constant_inputs=[1, 3])


def test_views_do_not_copy():
    x = random_array(2, (2, 3, 4), np.float32)
    for op, inputs in [("Reshape", [x, ints([6, 4])]), ("Transpose", [x]),
                       ("Slice", [x, ints([1]), ints([3]), ints([1])])]:
        assert np.shares_memory(run_kernel(op, inputs)[0], x), op


@pytest.mark.parametrize(("op", "inputs", "attrs", "match"), [
    ("Reshape", [np.zeros(6), ints([4, -1])], {}, r"cannot infer -1 in shape=\[4, -1\]"),
    ("Reshape", [np.zeros(6), ints([4, 2])], {}, "does not hold the 6 elements"),
    ("Reshape", [np.zeros(6), ints([-1, -1])], {}, "more than one -1"),
    ("Reshape", [np.zeros(6), ints([0, -1])], {"allowzero": 1}, "both 0 and -1"),
    ("Reshape", [np.zeros(6), np.array([6.0])], {}, "shape must be a 1-D integer tensor"),
    ("Flatten", [np.zeros((2, 3))], {"axis": 3}, "axis=3 is out of range"),
    ("Transpose", [np.zeros((2, 3))], {"perm": [0, 0]}, r"perm=\[0, 0\] is not a permutation"),
    ("Concat", [np.zeros((2, 3)), np.zeros((3, 3))], {"axis": 1}, r"input 1 shape \(3, 3\)"),
    ("Concat", [np.zeros((2, 3))], {"axis": 2}, "axis=2 is out of range for rank 2"),
    ("Concat", [np.zeros(2), np.zeros(2, np.float32)], {"axis": 0}, "input 1 dtype float32"),
    ("Split", [np.zeros(5), ints([2, 2])], {}, r"split=\[2, 2\] must .* sum to dimension 5"),
    ("Split", [np.zeros(5)], {}, "needs split sizes"),
    ("Split", [np.zeros(5)], {"num_outputs": 2, "_opset": 13}, "does not split evenly"),
    ("Slice", [np.zeros(5), ints([0]), ints([3]), ints([0]), ints([0])], {}, "steps=.* 0"),
    ("Slice", [np.zeros(5), ints([0]), ints([3]), ints([1])], {}, "axes=1 is out of range"),
    ("Slice", [np.zeros((5, 5)), ints([0, 0]), ints([3, 3]), ints([0, -2])], {},
     "repeats an axis"),
    ("Squeeze", [np.zeros((2, 1)), ints([0])], {}, "cannot squeeze axis 0 of size 2"),
    ("Unsqueeze", [np.zeros((2,))], {}, "axes are required"),
    ("Unsqueeze", [np.zeros((2,)), ints([3])], {}, "axes=3 is out of range for rank 2"),
    ("Gather", [np.zeros((4, 2)), ints([1, 4])], {}, "index 4 is out of range for axis 0 of "
                                                     "size 4"),
    ("Gather", [np.zeros((4, 2)), ints([-5])], {}, "index -5 is out of range"),
    ("Gather", [np.zeros((4, 2)), np.array([1.0])], {}, "indices dtype float64"),
    ("Expand", [np.zeros((2, 3)), ints([4, 3])], {}, r"input shape \(2, 3\) does not broadcast"),
    ("Pad", [np.zeros((2, 3)), ints([1, 1])], {}, r"pads=\[1, 1\] must have 4 values"),
    ("Pad", [np.zeros((2, 3)), ints([0, 0, 0, 3])], {"mode": "reflect"},
     "must be smaller than its size 3"),
    ("Pad", [np.zeros((2, 3)), ints([-2, 0, -1, 0])], {}, "crop more than the input"),
    ("Pad", [np.zeros((2, 3)), ints([0, 0, 0, 0])], {"mode": "mirror"}, "mode='mirror'"),
])
def test_bad_shape_input_raises_kernel_error(op, inputs, attrs, match):
    with pytest.raises(KernelError, match=match) as info:
        run_kernel(op, inputs, attrs)
    assert info.value.op == op


def test_split_num_outputs_last_part_smaller():
    parts = run_kernel("Split", [np.arange(7)], {"num_outputs": 3})
    assert [p.size for p in parts] == [3, 3, 1]
    assert math.prod(run_kernel("Flatten", [np.zeros((0, 3))], {"axis": 1})[0].shape) == 0
