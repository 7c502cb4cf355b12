"""BLAS thread control: small GEMMs on one thread, the library's own setting restored after."""

from __future__ import annotations

import numpy as np
import pytest
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
