"""Native parts (npu_sim.kernels.native, cores.split_native): every part once, on the caller and
a helper thread without the GIL, from several threads and in a forked child; the 1x1
convolution's and the classifier Gemm's parts give numpy's bits."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import carray, cfunc

from npu_sim.epilogue import Step, encode
from npu_sim.kernels import blas, cores, native
from npu_sim.kernels import gemm as gemm_module
from npu_sim.kernels.bias_fused import native_loops
from tests.kernels import random_array, seeds


def _count(record, part):  # pragma: no cover - numba
    counts = carray(record, (64,), np.int64)
    counts[part] += 1


def _meet(record, part):  # pragma: no cover - numba
    """Part 1 marks that it started; part 0 waits for that (a bounded spin) and marks whether
    it saw it: only two threads at once get both marks set."""
    flags = carray(record, (2,), np.int64)
    if part == 1:
        flags[1] = 1
        return
    for _ in range(1 << 31):
        if cores._load(flags, 1):
            flags[0] = 1
            return


COUNT = cfunc(native.PART)(_count).address
MEET = cfunc(native.PART)(_meet).address


def _counts(parts: int) -> np.ndarray:
    counts = np.zeros(64, np.int64)
    cores.split_native(parts, COUNT, counts.ctypes.data)
    return counts


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 64))
def test_every_native_part_runs_once(parts: int) -> None:
    assert _counts(parts).tolist() == [1] * parts + [0] * (64 - parts)


def _ready_helpers(monkeypatch) -> cores._Team:
    """The helpers awake and not resting, on a host taken as quiet: the count of running
    threads belongs to the whole machine, and another process's thread would leave the
    split to the caller (:func:`.cores._others_running`, tested below), so a test that needs
    a helper to meet the caller would fail by the moment (3 of 3,000 splits here)."""
    helpers = cores.team()
    helpers.strikes = helpers.rest = 0
    helpers.spin = helpers.spins
    monkeypatch.setattr(cores, "_others_running", lambda helpers, awake=True: False)
    return helpers


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to race")
def test_a_part_claimed_by_both_threads_at_once_runs_once(monkeypatch) -> None:
    """Many splits of many empty parts: the caller and a helper claim parts as fast as they
    can, and each claim must be the only one."""
    _ready_helpers(monkeypatch)
    counts = np.zeros(64, np.int64)
    for _ in range(2000):
        cores.split_native(64, COUNT, counts.ctypes.data)
    assert counts.tolist() == [2000] * 64


def _met() -> bool:
    flags = np.zeros(2, np.int64)
    cores.split_native(2, MEET, flags.ctypes.data)
    return bool(flags[0])


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_helper_runs_a_native_part_beside_the_caller(monkeypatch) -> None:
    _ready_helpers(monkeypatch)
    assert _met()


def test_native_splits_from_several_threads_at_once_all_complete() -> None:
    """One split at a time goes to the helpers; the others run serially on their callers."""
    results: dict[int, list[list[int]]] = {}

    def caller(t: int) -> None:
        for parts in range(1, 40):
            results.setdefault(t, []).append(_counts(parts)[:parts].tolist())

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {t: [[1] * parts for parts in range(1, 40)] for t in range(3)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_forked_child_splits_natively_with_helpers_of_its_own(monkeypatch) -> None:
    """The parent's helpers, spinning in compiled code, do not exist in a forked child: its
    native parts meet on helpers of its own (the child inherits the quiet host)."""
    _ready_helpers(monkeypatch)
    _counts(4)  # the parent's helpers exist before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_met)


@pytest.mark.skipif(native.sgemm_address() is None,
                    reason="numpy's BLAS is not the bundled OpenBLAS this part calls")
@settings(max_examples=40, deadline=None)
@given(m=st.integers(16, 160), k=st.integers(1, 300), p=st.integers(2, 400),
       images=st.integers(1, 2), scaled=st.booleans(), seed=seeds)
def test_the_1x1_part_gives_the_bits_of_numpys_product_and_bias(m, k, p, images, scaled,
                                                                 seed) -> None:
    """Rows cut where a split cuts them (the BLAS kernel's row blocks); weights scaled per
    input channel into the part's buffer as numpy multiplies them."""
    w = random_array(seed, (m, k), np.float32)
    scale = random_array(seed + 1, (k,), np.float32, 0.0, 2.0)
    columns = [random_array(seed + 2 + i, (k, p), np.float32) for i in range(images)]
    bias = random_array(seed + 9, (m,), np.float32)
    y = np.full((images, m, p), np.nan, np.float32)
    buffer = np.empty_like(w)
    edges = blas.edges(m, p * k, blas.kernel_split()[0])
    record = native.pointwise_record(buffer if scaled else w, (w, scale) if scaled else None,
                                     columns, y, bias, native_loops()["bias"], None, None, edges)
    with blas.one_thread():
        cores.split_native(len(edges) - 1, native.pointwise_part(), record.ctypes.data)
        weights = w * scale if scaled else w
        want = np.stack([np.matmul(weights, c) + bias[:, None] for c in columns])
    np.testing.assert_array_equal(y, want)


def test_a_1x1_record_refuses_what_a_part_could_not_run() -> None:
    w, bias = np.ones((32, 8), np.float32), np.ones(32, np.float32)
    y, columns = np.zeros((1, 32, 16), np.float32), [np.ones((8, 16), np.float32)]
    loop = native_loops()["bias"]
    assert native.pointwise_record(w, None, [np.ones((8, 32), np.float32)[:, ::2]], y, bias,
                                   loop, None, None, [0, 32]) is None  # strided columns
    assert native.pointwise_record(w.astype(np.float64), None, columns, y, bias, loop, None,
                                   None, [0, 32]) is None
    assert native.pointwise_record(w, None, columns, np.zeros((1, 32, 1), np.float32), bias,
                                   loop, None, None, [0, 32]) is None  # one pixel: numpy's gemv
    assert native.pointwise_record(w, None, columns, y, bias, loop, None, None,
                                   [0, 32]) is not None or native.sgemm_address() is None


def test_no_native_gemm_part_without_a_known_blas_kernel(monkeypatch) -> None:
    """A BLAS whose GEMM splits are not known here runs its products on numpy: no record."""
    monkeypatch.setattr(blas, "kernel_split", lambda: None)
    native._blas_address.cache_clear()
    try:
        assert native.sgemm_address() is None
        assert native.pointwise_record(np.ones((32, 8), np.float32), None,
                                       [np.ones((8, 16), np.float32)],
                                       np.zeros((1, 32, 16), np.float32),
                                       np.ones(32, np.float32), native_loops()["bias"], None,
                                       None, [0, 32]) is None
    finally:
        native._blas_address.cache_clear()


GEMM_EPILOGUES = [{}, {"activation": "Relu"},
                  encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))]),
                  encode([Step("Sigmoid", gate=True)])]


@pytest.mark.skipif(native.sgemv_address() is None,
                    reason="numpy's BLAS is not the bundled OpenBLAS this part calls")
@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 1200), k=st.integers(1, 700), epilogue=st.sampled_from(GEMM_EPILOGUES),
       bias_2d=st.booleans(), seed=seeds)
def test_a_split_classifier_gemm_gives_the_bits_of_the_gemm_kernel(n, k, epilogue, bias_2d,
                                                                   seed) -> None:
    """``x @ B.T + C`` with its fused activation, split into native parts at every size
    (threshold 0), against the unprepared kernel: numpy's product, C's add, then the
    activation, one pass each."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm_module, "NATIVE_ROW_WORK", 0)
        _check_classifier_gemm(n, k, epilogue, bias_2d, seed)


def _check_classifier_gemm(n: int, k: int, epilogue: dict, bias_2d: bool, seed: int) -> None:
    x = random_array(seed, (1, k), np.float32)
    b = random_array(seed + 1, (n, k), np.float32)
    c = random_array(seed + 2, (1, n) if bias_2d else (n,), np.float32)
    attrs = {"transB": 1, **epilogue}
    got = np.full((1, n), np.nan, np.float32)
    run = gemm_module.prepare_gemm([x, b, c], attrs, [got])
    assert hasattr(run, "arrays") or n < 2 * gemm_module.ROW_ALIGN  # the native split
    with blas.one_thread(), np.errstate(all="ignore"):
        run()
        want = gemm_module.gemm([x, b, c], attrs)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: every split runs on the caller")
def test_a_busy_host_runs_native_parts_on_the_caller(monkeypatch) -> None:
    """More threads running than cores: the split is left to the caller, and counts towards
    the helpers' rest. A native split asks about running threads beyond the cores (a sleeping
    helper costs it nothing), not beyond the caller and its awake helpers."""
    helpers = cores.team()
    helpers.strikes = helpers.rest = 0
    helpers.spin = helpers.spins
    asked: list[bool] = []
    monkeypatch.setattr(cores, "_others_running",
                        lambda helpers, awake=True: asked.append(awake) or True)
    assert _counts(8)[:8].tolist() == [1] * 8
    assert asked == [False]
    assert helpers.strikes == 1
    helpers.strikes = 0
