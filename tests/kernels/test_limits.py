"""Kernels whose output shape comes from input or attribute values refuse absurd sizes.

Expand, Pad, Resize/Upsample, Reshape (allowzero), Conv/ConvTranspose/QLinearConv and the pools
take their output (or a temporary's) shape from values a graph supplies. Asked for more than
:data:`npu_sim.kernels.limits.MAX_ELEMENTS` elements, or for a negative size, they raise a
:class:`KernelError` naming the op, the shape and the limit before allocating anything; without
the check the cases below raise numpy's ``MemoryError`` (terabytes) or worse.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from npu_sim.errors import KernelError
from npu_sim.kernels import limits
from tests.kernels import check_against_ort, check_like_ort, run_kernel

F32 = np.float32
HUGE = 2**40  # elements: 4 TiB of float32


def ints(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def ones(*shape: int, dtype=F32) -> np.ndarray:
    return np.ones(shape, dtype)


def ramp(*shape: int) -> np.ndarray:
    """Distinct float32 values 1, 2, ... so a misplaced element shows against onnxruntime."""
    return np.arange(1, np.prod(shape) + 1, dtype=F32).reshape(shape)


# (op, inputs, attrs, text the message must contain besides the op and the limit)
OVERSIZED = [
    ("Expand", [ones(1), ints([HUGE])], {}, f"[{HUGE}]"),
    # the target fits; broadcasting it with the input does not
    ("Expand", [ones(4, 1), ints([2**28, 1, 4])], {},
     "output shape [268435456, 4, 4] would hold 4294967296 elements"),
    ("Pad", [ones(2), ints([0, HUGE])], {}, f"pads=[0, {HUGE}]"),
    ("Pad", [ones(2), ints([2**62, 2**62])], {"mode": "edge"}, f"pads=[{2**62}, {2**62}]"),
    ("Pad", [ones(1, 1)], {"pads": [0, 0, 2**20, 2**20], "_opset": 2}, "1099513724929 elements"),
    ("Resize", [ones(1, 1, 2, 2), None, None, ints([1, 1, 2**20, 2**20])], {},
     "[1, 1, 1048576, 1048576]"),
    ("Resize", [ones(1, 1, 2, 2), None, np.array([1, 1, 1e30, 1], F32)], {}, "elements"),
    ("Resize", [ones(1, 1, 1, 2), None, None, ints([HUGE, 1])],
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}, f"[1, 1, {HUGE}, {2 * HUGE}]"),
    ("Upsample", [ones(1, 1, 2, 2), np.array([1, 1, 1e6, 1e6], F32)], {},
     "[1, 1, 2000000, 2000000]"),
    ("Upsample", [ones(1, 1, 2, 2)], {"scales": [1.0, 1.0, 1e6, 1e6]}, "[1, 1, 2000000, 2000000]"),
    ("Reshape", [ones(0), ints([2**62, 2**62, 0])], {"allowzero": 1},
     f"[{2**62}, {2**62}, 0] would hold 0 elements"),
    ("Conv", [ones(1, 1, 2, 2), ones(1, 1, 1, 1)], {"pads": [2**20] * 4}, "output shape"),
    # the output (1, 1, 40000, 40000) fits; the padded input and its im2col matrix would not
    ("Conv", [ones(1, 64, 2, 2), ones(1, 64, 3, 3)], {"pads": [20000] * 4},
     "padded input image shape [64, 40002, 40002]"),
    ("Conv", [ones(1, 64, 2, 2), ones(1, 64, 3, 3)], {"pads": [2000] * 4},
     "im2col matrix shape [576, 16000000]"),
    ("QLinearConv",
     [ones(1, 1, 2, 2, dtype=np.uint8), F32(1), np.uint8(0), ones(1, 1, 1, 1, dtype=np.uint8),
      F32(1), np.uint8(0), F32(1), np.uint8(0)], {"pads": [2**20] * 4}, "output shape"),
    ("ConvTranspose", [ones(1, 1, 2, 2), ones(1, 1, 1, 1)], {"strides": [2**20, 2**20]},
     "[1, 1, 1048577, 1048577]"),
    ("ConvTranspose", [ones(1, 1, 2, 2), ones(1, 1, 2, 2)], {"dilations": [2**20, 2**20]},
     "[1, 1, 1048578, 1048578]"),
    ("MaxPool", [ones(1, 1, 2, 2)], {"kernel_shape": [2**30] * 2, "pads": [2**30 - 1] * 4},
     "[1, 1, 1073741825, 1073741825]"),
    ("AveragePool", [ones(1, 1, 2)], {"kernel_shape": [2**32], "pads": [2**32 - 1] * 2},
     "[1, 1, 4294967297]"),
]


@pytest.mark.parametrize(
    "op, inputs, attrs, names", OVERSIZED, ids=[f"{c[0]}-{i}" for i, c in enumerate(OVERSIZED)]
)
def test_oversized_output_is_a_kernel_error_before_allocating(op, inputs, attrs, names):
    with pytest.raises(KernelError) as info:
        run_kernel(op, inputs, attrs)
    message = str(info.value)
    assert info.value.op == op
    assert re.search(rf"\b{op}\b", message)
    assert names in message
    assert f"at most {limits.MAX_ELEMENTS} elements" in message


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("Expand", [ones(3), ints([-5])], {}, r"Expand.*target shape \[-5\] has negative "
                                                r"dimension -5; dimensions must be >= 0"),
        ("Expand", [ones(1), ints([2, -1])], {}, r"negative dimension -1"),
        ("Resize", [ones(1, 1, 2, 2), None, None, ints([1, 1, -3, 2])], {},
         r"sizes=\[1, 1, -3, 2\] must hold 4 positive lengths"),
        ("Resize", [ones(1, 1, 2, 2), None, None, ints([1, 1, 0, 2])], {},
         r"sizes=\[1, 1, 0, 2\] must hold 4 positive lengths"),
        ("Resize", [ones(1, 1, 0, 2), None, None, ints([1, 1, 4, 4])], {},
         r"cannot resize axis 2 of input shape \(1, 1, 0, 2\): it is empty"),
        ("Resize", [ones(1, 1, 2, 2), None, np.array([1, 1, np.inf, 1], F32)], {},
         r"scale inf on axis 2 .* no finite output length"),
        ("Resize", [ones(1, 1, 2, 2), None, np.array([1, 1, 3e38, 1], F32)], {},
         r"scale 3\.0\d*e\+38 on axis 2 .* no finite output length"),
        ("Resize", [ones(1, 1, 2, 2), None, np.array([1, 1, -2, 1], F32)], {},
         r"scales=\[1\.0, 1\.0, -2\.0, 1\.0\] must hold 4 positive values"),
        ("Pad", [ones(2, 2), ints([0, -3, 0, 0])], {}, r"crop more than the input shape"),
        ("ConvTranspose", [ones(1, 1, 2, 2), ones(1, 1, 1, 1)], {"output_shape": [-4, 2]},
         r"leave an empty output \[-4, 2\]"),
        ("Reshape", [ones(4), ints([-2, 2])], {}, r"shape=\[-2, 2\] has invalid dimension -2"),
    ],
)
def test_negative_or_zero_sizes_are_kernel_errors(op, inputs, attrs, match):
    with pytest.raises(KernelError, match=match):
        run_kernel(op, inputs, attrs)


# At a lowered limit of 24 elements, the largest allowed output still matches onnxruntime and
# one step beyond it is refused: the limit is inclusive and applies to the real output shape.
AT_LIMIT = [
    ("Expand", [ramp(2, 3), ints([4, 2, 3])], {}, [ones(2, 3), ints([5, 2, 3])], {}),
    ("Pad", [ramp(2, 3), ints([1, 1, 1, 2])], {}, [ones(2, 3), ints([2, 1, 1, 2])], {}),
    ("Resize", [ramp(1, 1, 2, 3), None, None, ints([1, 1, 4, 6])], {"mode": "nearest"},
     [ones(1, 1, 2, 3), None, None, ints([1, 1, 5, 6])], {"mode": "nearest"}),
    ("Conv", [ramp(1, 1, 2, 2), ramp(1, 1, 1, 1)], {"pads": [1, 1, 1, 3]},
     [ones(1, 1, 2, 2), ones(1, 1, 1, 1)], {"pads": [2, 1, 1, 3]}),
    ("ConvTranspose", [ramp(1, 1, 2, 2), ramp(1, 1, 1, 1)], {"strides": [3, 5]},
     [ones(1, 1, 2, 2), ones(1, 1, 1, 1)], {"strides": [4, 5]}),
    ("MaxPool", [ramp(1, 1, 5, 3)], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
     [ones(1, 1, 6, 3)], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("op, fits, fit_attrs, over, over_attrs", AT_LIMIT,
                         ids=[c[0] for c in AT_LIMIT])
def test_limit_is_inclusive_and_counts_the_output(monkeypatch, op, fits, fit_attrs, over,
                                                  over_attrs):
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 24)
    out = check_against_ort(op, fits, fit_attrs, opset=19)[0]
    assert out.size == 24
    with pytest.raises(KernelError, match=rf"{op}: .*would hold \d+ elements.*at most 24 "):
        run_kernel(op, over, over_attrs)


def test_empty_tensors_stay_valid():
    """Zero-sized dimensions are ONNX empty tensors, not errors; they match onnxruntime."""
    check_against_ort("Expand", [ones(1, 3), ints([0, 3])], {})
    check_against_ort("Pad", [ones(0, 2), ints([0, 1, 0, 1])], {})
    out = run_kernel("Reshape", [ones(0, 3), ints([3, 0])], {"allowzero": 1})[0]
    assert out.shape == (3, 0)


@pytest.mark.parametrize("n", [0, -3, limits.MAX_OUTPUTS + 1, 10**12])
def test_split_output_count_is_bounded(n):
    # An empty axis splits into any number of empty parts, so only the count bounds the work.
    with pytest.raises(KernelError, match=rf"Split.*num_outputs={n} is out of range; "
                                          rf"expected 1 to {limits.MAX_OUTPUTS}"):
        run_kernel("Split", [np.zeros((0, 3), np.float32)], {"num_outputs": n})


@pytest.mark.parametrize(("dim", "n"), [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3), (3, 5)])
def test_split_into_more_parts_than_the_axis_has(dim, n):
    """Every part but the last has ceil(dim / n) rows; the tail is empty. onnxruntime before 1.32
    refused this, 1.32 runs it: the kernel agrees with whichever is installed, or with ONNX."""
    x = np.arange(dim * 3, dtype=np.float32).reshape(dim, 3)
    parts = check_like_ort("Split", [x], {"num_outputs": n}, n_outputs=n, opset=18)
    assert parts is not None, "the kernel follows ONNX here rather than refusing"
