"""MatMul and Gemm kernels against onnxruntime, over generated shapes and attributes.

Inputs come from [-1, 1] and K <= 8, so float32 sums in any order agree far inside the
tolerance (1e-4 relative, 1e-5 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import FLOATS, assert_matches, check_against_ort, random_array, run_kernel, seeds
from tests.ortref import run_ort

F = np.float32


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of A and B that numpy's matmul accepts, including 1-D and broadcast batches."""
    m, k, n = (draw(st.integers(1, 8)) for _ in range(3))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [1 if draw(st.booleans()) else d for d in batch]
    b_batch = [1 if draw(st.booleans()) else d for d in batch]
    a_batch = a_batch[draw(st.integers(0, len(a_batch))):]
    b_batch = b_batch[draw(st.integers(0, len(b_batch))):]
    a = (k,) if draw(st.integers(0, 4)) == 0 else (*a_batch, m, k)
    b = (k,) if draw(st.integers(0, 4)) == 0 else (*b_batch, k, n)
    return a, b


@settings(max_examples=40, deadline=None)
@given(shapes=matmul_shapes(), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_matmul_matches_ort(shapes, seed, dtype):
    a, b = (random_array(seed + i, s, dtype, -1, 1) for i, s in enumerate(shapes))
    check_against_ort("MatMul", [a, b])


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), k=st.integers(1, 8), n=st.integers(1, 7), trans_a=st.booleans(),
       trans_b=st.booleans(), c_kind=st.sampled_from(["none", "scalar", "row", "col", "full",
                                                      "1x1"]),
       alpha=st.sampled_from([None, 1.0, 0.5, -2.0]), beta=st.sampled_from([None, 1.0, 0.0, 3.0]),
       seed=seeds, dtype=st.sampled_from(FLOATS))
def test_gemm_matches_ort(m, k, n, trans_a, trans_b, c_kind, alpha, beta, seed, dtype):
    a = random_array(seed, (k, m) if trans_a else (m, k), dtype, -1, 1)
    b = random_array(seed + 1, (n, k) if trans_b else (k, n), dtype, -1, 1)
    c_shape = {"none": None, "scalar": (), "row": (n,), "col": (m, 1), "full": (m, n),
               "1x1": (1, 1)}[c_kind]
    inputs = [a, b] + ([] if c_shape is None else [random_array(seed + 2, c_shape, dtype, -1, 1)])
    attrs = {"transA": int(trans_a), "transB": int(trans_b)}
    if alpha is not None:
        attrs["alpha"] = alpha
    if beta is not None:
        attrs["beta"] = beta
    check_against_ort("Gemm", inputs, attrs)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("activation, params, ort_op, ort_attrs", [
    ("Relu", (), "Relu", {}),
    ("Clip", (-0.5, 0.25), "Clip", None),
    ("HardSigmoid", (0.3, 0.4), "HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
])
def test_fused_activation_equals_op_then_activation(op, activation, params, ort_op, ort_attrs):
    a = random_array(1, (4, 6), np.float32, -1, 1)
    b = random_array(2, (6, 5), np.float32, -1, 1)
    (plain,) = run_ort(op, [a, b])
    if ort_op == "Clip":  # Clip takes its bounds as inputs since opset 11
        expected = run_ort("Clip", [plain, np.array(params[0], F), np.array(params[1], F)])
    else:
        expected = run_ort(ort_op, [plain], ort_attrs)
    fused = run_kernel(op, [a, b], {"activation": activation, "activation_params": params})
    assert_matches(fused, expected)



BAD = [
    ("MatMul", [np.zeros((2, 3), F), np.zeros((4, 5), F)], {},
     r"inner dimensions differ: A \(2, 3\) has K=3, B \(4, 5\) has K=4"),
    ("MatMul", [np.zeros((2, 2, 3), F), np.zeros((3, 3, 4), F)], {}, "batch dimensions"),
    ("MatMul", [np.zeros((), F), np.zeros((3,), F)], {},
     r"rank >= 1, got shapes \(\) and \(3,\)"),
    ("MatMul", [np.zeros((2, 3), F), np.zeros((3, 4), np.float16)], {},
     "B has dtype float16 but A has float32"),
    ("MatMul", [np.zeros((2, 3), np.int32), np.zeros((3, 4), np.int32)], {},
     "A has dtype int32; expected one of float32, float16, bfloat16"),
    ("MatMul", [np.zeros((2, 3), F)], {}, "needs 2 inputs"),
    ("Gemm", [np.zeros((2, 3), F), np.zeros((4, 5), F)], {}, "inner dimensions"),
    ("Gemm", [np.zeros((2, 3), F), np.zeros((2, 4), F)], {"transA": 0}, "inner dimensions"),
    ("Gemm", [np.zeros((2, 2, 3), F), np.zeros((3, 4), F)], {}, "2-D"),
    ("Gemm", [np.zeros((2, 3), F), np.zeros((3, 4), F), np.zeros((3,), F)], {}, "broadcast"),
    ("Gemm", [np.zeros((2, 3), F), np.zeros((3, 4), F), np.zeros((1, 2, 4), F)], {},
     "broadcast"),
]


@pytest.mark.parametrize("op, inputs, attrs, words", BAD, ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_rejects_bad_input(op, inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel(op, inputs, attrs)
