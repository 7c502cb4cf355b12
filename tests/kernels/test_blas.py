"""BLAS thread control: small GEMMs on one thread, the library's own setting restored after."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from threadpoolctl import ThreadpoolController

from npu_sim.kernels import blas


def blas_threads() -> list[int]:
    return [lib.get_num_threads() for lib in ThreadpoolController().select(user_api="blas")
            .lib_controllers]


def test_a_small_gemm_runs_on_one_thread_and_the_setting_comes_back() -> None:
    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS is loaded
    before = blas_threads()
    assert before
    with blas.threads_for(blas.SMALL_MACS - 1):
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before
    with blas.threads_for(blas.SMALL_MACS):
        assert blas_threads() == before


def test_the_setting_comes_back_when_the_gemm_raises() -> None:
    before = blas_threads()
    with pytest.raises(ValueError), blas.threads_for(1):
        np.ones((2, 3)) @ np.ones((2, 3))
    assert blas_threads() == before


def test_one_thread_nests_and_restores_at_the_outermost_exit() -> None:
    np.ones((2, 2)) @ np.ones((2, 2))
    before = blas_threads()
    with blas.one_thread():
        with blas.one_thread():
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((512, 2304), (2304, 196)),  # split by rows over the pool
    ((16, 27), (27, 12544)),  # a wide convolution GEMM: split by columns
    ((1, 128, 768), (768, 3072)),  # broadcast batch
    ((12, 128, 64), (12, 64, 128)),  # batched
    ((3, 5), (5, 7)),  # small: one call
    ((1, 4096), (4096, 9000)),  # one row: nothing to split
])
def test_matmul_equals_numpy(a_shape, b_shape) -> None:
    r = np.random.default_rng(0)
    a = r.standard_normal(a_shape).astype(np.float32)
    b = r.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a, b)
    got = blas.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    out = np.empty_like(want)
    assert blas.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, got)


def test_a_split_gemm_gives_the_bits_of_one_call(monkeypatch) -> None:
    """Split by rows or by columns, every element is the same dot product in the same order;
    split where the BLAS kernel is known (and there are cores to split over), else whole."""
    calls = []
    monkeypatch.setattr(blas, "spread", lambda *a, s=blas.spread: calls.append(a) or s(*a))
    r = np.random.default_rng(1)
    for a_shape, b_shape in [((16, 27), (27, 12544)), ((512, 2304), (2304, 196))]:
        a = r.standard_normal(a_shape).astype(np.float32)
        b = r.standard_normal(b_shape).astype(np.float32)
        with blas.one_thread():
            np.testing.assert_array_equal(blas.matmul(a, b), np.matmul(a, b))
    assert len(calls) == (2 if blas.kernel_split() and blas.THREADS > 1 else 0)


@pytest.mark.skipif(blas.kernel_split() is None, reason="no BLAS kernel known to split exactly")
@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 8), k=st.integers(8, 300), n=st.integers(100, 3000),
       cut=st.integers(1, 7), seed=st.integers(0, 2**32 - 1))
def test_a_product_cut_at_the_kernels_row_block_keeps_its_bits(m, k, n, cut, seed) -> None:
    """The property :data:`blas.KERNELS` rests on, on this host's kernel: rows cut at a
    multiple of its block give the whole product's bits (pieces above the small-matrix size)."""
    block = blas.kernel_split()[0]
    rows, lo = m * block, min(cut, m - 1) * block
    assume(min(lo, rows - lo) * k * n > blas.SMALL_GEMM)
    r = np.random.default_rng(seed)
    a = r.standard_normal((rows, k)).astype(np.float32)
    b = r.standard_normal((k, n)).astype(np.float32)
    with blas.one_thread():
        np.testing.assert_array_equal(np.concatenate([a[:lo] @ b, a[lo:] @ b]), a @ b)


def test_a_blas_kernel_not_measured_runs_whole(monkeypatch) -> None:
    """Another BLAS or core type: no split, whose pieces might sum in another order."""
    monkeypatch.setattr(blas, "KERNELS", {})
    blas.kernel_split.cache_clear()
    monkeypatch.setattr(blas, "spread", lambda *a, **k: pytest.fail("split"))
    try:
        assert blas.kernel_split() is None
        a = np.ones((512, 2304), np.float32)
        b = np.ones((2304, 196), np.float32)
        np.testing.assert_array_equal(blas.matmul(a, b), np.matmul(a, b))
    finally:
        blas.kernel_split.cache_clear()


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 5000), unit=st.integers(1, 3 * blas.SMALL_GEMM),
       align=st.sampled_from([1, 4, 12, 16]))
def test_every_split_piece_stays_off_the_small_matrix_kernel(count, unit, align) -> None:
    """Pieces cover the range in order, inner boundaries aligned, at most PARTS of them, and
    each above SMALL_GEMM MACs unless there is only one."""
    bounds = blas.edges(count, unit, align)
    assert bounds[0] == 0 and bounds[-1] == count and len(bounds) - 1 <= max(1, blas.PARTS)
    assert all(lo < hi for lo, hi in zip(bounds, bounds[1:], strict=False))
    assert all(b % align == 0 for b in bounds[1:-1])
    if len(bounds) > 2:
        assert min(hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)) * unit > \
            blas.SMALL_GEMM


def test_holding_one_thread_is_per_thread() -> None:
    """Another thread's hold does not count as this thread's: when it ends, the library's
    setting comes back under a thread that had skipped entering."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with blas.one_thread():
            entered.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    entered.wait(10)
    try:
        assert not blas.held()
        with blas.one_thread():
            assert blas.held()
    finally:
        release.set()
        other.join()
    assert not blas.held()
