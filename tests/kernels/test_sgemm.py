"""The numba sgemm against a float64 product: edge sizes off the tile grid, both orientations,
strided operands and outputs, one or two threads, and :func:`matmul`'s numpy fallback; and the
Conv, Gemm and MatMul kernels on products large enough to take it, against onnxruntime.

Inputs come from [-1, 1]; a float32 sum of K such products in any order is within
K * 2**-24 * sum|a||b| of the exact one, which bounds the tolerance used here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import check_against_ort, random_array
from npu_sim.kernels import sgemm as sg


def _check(a: np.ndarray, b: np.ndarray, got: np.ndarray) -> None:
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = a.shape[1] * 2.0**-23 * (np.abs(a).astype(np.float64) @ np.abs(b))
    assert got.shape == exact.shape
    assert np.all(np.abs(got - exact) <= bound + 1e-30)


def _rand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


# sides around the tile sizes (MR = 12, NR = 32) and the cache blocks (KC = 256)
sides = st.sampled_from([1, 2, 11, 12, 13, 31, 32, 33, 49, 65, 100])
depths = st.sampled_from([1, 3, 255, 256, 257, 600])


@settings(max_examples=40, deadline=None)
@given(m=sides, k=depths, n=sides, parts=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_sgemm_matches_exact_product(m, k, n, parts, seed):
    rng = np.random.default_rng(seed)
    a, b = _rand(rng, (m, k)), _rand(rng, (k, n))
    _check(a, b, sg.sgemm(a, b, parts=parts))


@settings(max_examples=15, deadline=None)
@given(m=sides, k=depths, n=sides, seed=st.integers(0, 2**16))
def test_sgemm_strided_operands_and_output(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = _rand(rng, (k, 2 * m)).T[::2]  # transposed and strided views
    b = _rand(rng, (k, 3 * n))[:, ::3]
    out = np.full((m, 2 * n), np.nan, np.float32)
    got = sg.sgemm(a, b, out=out[:, ::2])
    assert np.shares_memory(got, out)
    _check(a, b, out[:, ::2])
    assert np.isnan(out[:, 1::2]).all()  # columns outside the view untouched


def test_sgemm_overwrites_output():
    rng = np.random.default_rng(0)
    a, b = _rand(rng, (40, 300)), _rand(rng, (300, 70))
    out = np.full((40, 70), 1e30, np.float32)
    sg.sgemm(a, b, out=out)
    _check(a, b, out)


def test_matmul_uses_sgemm_only_for_large_float32(monkeypatch):
    calls = []
    monkeypatch.setattr(sg, "sgemm", lambda a, b, out=None: calls.append(a.shape) or a @ b)
    big = np.ones((64, 256), np.float32), np.ones((256, 64), np.float32)
    sg.matmul(*big)
    assert calls == [(64, 256)]
    sg.matmul(big[0].astype(np.float64), big[1].astype(np.float64))  # float64: numpy
    sg.matmul(np.ones((64, 2048), np.float32), np.ones((2048, 1), np.float32))  # gemv: numpy
    sg.matmul(np.ones((8, 4), np.float32), np.ones((4, 8), np.float32))  # tiny: numpy
    assert calls == [(64, 256)]


def test_matmul_fallback_matches_numpy():
    a, b = np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(4, 2)
    out = np.empty((3, 2))
    assert sg.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, a @ b)


@pytest.fixture
def sgemm_calls(monkeypatch):
    """Shapes of the products the kernels send to the sgemm (which still computes them)."""
    calls = []
    real = sg.sgemm

    def spy(a, b, out=None):
        calls.append((a.shape[0], a.shape[1], b.shape[1]))
        return real(a, b, out)

    monkeypatch.setattr(sg, "sgemm", spy)
    return calls


# Shapes just above MIN_MACS with small K, so float32 sums in any order stay far inside the
# float32 tolerance of check_against_ort.
def test_conv_through_sgemm_matches_ort(sgemm_calls):
    x = random_array(1, (1, 2, 64, 64), np.float32, -1, 1)
    w = random_array(2, (64, 2, 3, 3), np.float32, -1, 1)
    check_against_ort("Conv", [x, w], {"strides": [2, 2], "pads": [1, 1, 1, 1]})
    x = random_array(3, (1, 16, 32, 33), np.float32, -1, 1)
    w = random_array(4, (64, 16, 1, 1), np.float32, -1, 1)
    check_against_ort("Conv", [x, w])
    assert sgemm_calls == [(64, 18, 1024), (64, 16, 32 * 33)]


def test_gemm_and_matmul_through_sgemm_match_ort(sgemm_calls):
    a = random_array(5, (64, 16), np.float32, -1, 1)
    b = random_array(6, (1100, 16), np.float32, -1, 1)
    c = random_array(7, (1100,), np.float32, -1, 1)
    check_against_ort("Gemm", [a, b, c], {"transB": 1, "alpha": 0.5})
    check_against_ort("MatMul", [random_array(8, (96, 16), np.float32, -1, 1),
                                 random_array(9, (16, 700), np.float32, -1, 1)])
    # N = 49 < 2 * NR: computed as C^T on the wide micro-kernel
    check_against_ort("MatMul", [random_array(10, (1024, 24), np.float32, -1, 1),
                                 random_array(11, (24, 49), np.float32, -1, 1)])
    assert sgemm_calls == [(64, 16, 1100), (96, 16, 700), (1024, 24, 49)]
