"""cores.run_native: native parts (numba cfuncs) run once each, on the caller and the helper
threads without the GIL, each part's epilogue after it; helpers keep spinning through a
program run; and the BLAS call the native 1x1 parts make gives numpy's bits."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import carray, cfunc, int64, njit

from npu_sim.kernels import blas, cores
from npu_sim.kernels.cores import _fetch_add, _load, _pause
from npu_sim.kernels.native import SIGNATURE, address, pointer, sgemm

# Test parts. Context of _count: the counts' address; part k adds 1 to counts[k].
# Context of _check: the counts' address, the seen flags' address; part k records whether
# counts[k] was already 1 (its main part ran first). Context of _meet: flags' address; part 1
# sets flags[1], part 0 waits for it (at most ~1 s of spins) and records in flags[0] whether
# it came.


@cfunc(SIGNATURE, nogil=True)
def _count(context, k):  # pragma: no cover - compiled
    counts = carray(pointer(carray(context, 1)[0], int64), k + 1)
    _fetch_add(counts, k)


@cfunc(SIGNATURE, nogil=True)
def _check(context, k):  # pragma: no cover - compiled
    c = carray(context, 2)
    counts, seen = carray(pointer(c[0], int64), k + 1), carray(pointer(c[1], int64), k + 1)
    seen[k] = _load(counts, k) == 1


@cfunc(SIGNATURE, nogil=True)
def _meet(context, k):  # pragma: no cover - compiled
    flags = carray(pointer(carray(context, 1)[0], int64), 2)
    if k == 1:
        _fetch_add(flags, 1)
        return
    for _ in range(1 << 28):
        if _load(flags, 1):
            flags[0] = 1
            return
        _pause()


def _counts_of(parts: int, after: bool = False) -> tuple[np.ndarray, np.ndarray]:
    counts, seen = np.zeros(max(parts, 1), np.int64), np.zeros(max(parts, 1), np.int64)
    if after:
        cores.run_native(parts, _count.address, np.array([address(counts)], np.int64),
                         _check.address, np.array([address(counts), address(seen)], np.int64))
    else:
        cores.run_native(parts, _count.address, np.array([address(counts)], np.int64))
    return counts[:parts], seen[:parts]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.booleans())
def test_every_native_part_runs_once_and_its_epilogue_after_it(parts: int, after: bool) -> None:
    counts, seen = _counts_of(parts, after)
    assert counts.tolist() == [1] * parts
    assert seen.tolist() == ([1] * parts if after else [0] * parts)


def test_native_and_python_jobs_back_to_back_each_run_every_part_once() -> None:
    """Jobs in quick succession, so helpers still at one job's parts meet the next (a part of a
    newer native job is never claimed on an older one's behalf)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        parts = int(rng.integers(1, 9))
        if rng.random() < 0.8:
            assert _counts_of(parts)[0].tolist() == [1] * parts
        else:
            seen: list[int] = []
            cores.split(parts, seen.append)
            assert sorted(seen) == list(range(parts))


def test_native_parts_run_serially_without_helpers(monkeypatch) -> None:
    monkeypatch.setattr(cores, "team", lambda: None)
    assert _counts_of(7, after=True)[0].tolist() == [1] * 7


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_helper_runs_a_native_part_beside_the_caller(monkeypatch) -> None:
    """Part 0 waits in compiled code until part 1 has run: only a helper taking part 1 while
    the caller is in part 0 (neither holding the GIL) lets it through."""
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    _fresh(cores.team())
    flags = np.zeros(2, np.int64)
    cores.run_native(2, _meet.address, np.array([address(flags)], np.int64))
    assert flags.tolist() == [1, 1]


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_helpers_spin_through_a_program_run_and_sleep_after_it(monkeypatch) -> None:
    """After a split, a helper spins for SPIN_SECONDS and then sleeps; inside running() it
    keeps spinning until the run ends."""
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    helpers = cores.team()
    _fresh(helpers)
    wait = 20 * cores.SPIN_SECONDS
    with cores.running():
        _counts_of(2)
        time.sleep(wait)
        assert helpers.sleepers == 0
    assert _until(lambda: helpers.sleepers == cores.THREADS - 1, 10)
    _counts_of(2)
    assert _until(lambda: helpers.sleepers == cores.THREADS - 1, 10)


def test_running_nests_across_threads() -> None:
    cores.split(2, lambda k: None)  # the helpers exist
    helpers = cores.team()
    if helpers is None:
        pytest.skip("one core: no helpers to keep spinning")
    inside = threading.Barrier(2)

    def run() -> None:
        with cores.running():
            inside.wait()
            inside.wait()

    thread = threading.Thread(target=run)
    thread.start()
    with cores.running():
        inside.wait()
        assert helpers.running[0] == 2
        inside.wait()
    thread.join()
    assert helpers.running[0] == 0


@pytest.mark.skipif(blas.sgemm() is None, reason="numpy's BLAS is not a bundled OpenBLAS")
@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 80), n=st.integers(2, 300), k=st.integers(1, 300), seed=st.integers(0, 99))
def test_the_native_sgemm_gives_numpys_matmul_bits(m, n, k, seed) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    function, ilp64 = blas.sgemm()
    got = np.full((m, n), np.nan, np.float32)
    with blas.one_thread():
        _product(function, int(ilp64), a, b, got)
        want = a @ b
    np.testing.assert_array_equal(got, want)


@njit
def _product(function, ilp64, a, b, c):  # pragma: no cover - compiled
    m, k = a.shape
    n = b.shape[1]
    sgemm(function, ilp64, m, n, k, a.ctypes.data, k, b.ctypes.data, n, c.ctypes.data, n)


def _until(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _fresh(helpers) -> None:
    helpers.strikes = helpers.rest = 0
    helpers.spin = helpers.spins
