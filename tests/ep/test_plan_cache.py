"""The compiler's tile-plan cache: the plans it returns are plan_launch's, and it stays bounded."""

from __future__ import annotations

import multiprocessing
import os
import threading
from types import SimpleNamespace

import pytest

from ep.npusim.compiler import tiling
from ep.npusim.compiler.tiling import PlanCache, plan_launch
from npu_sim import kernels
from npu_sim.config import DeviceConfig
from npu_sim.dtypes import TensorSpec
from npu_sim.errors import KernelError

NPU_M = DeviceConfig.preset("npu-m")
CONV = ("Conv", [("float32", (1, 16, 28, 28)), ("float32", (32, 16, 3, 3)), None],
        [("float32", (1, 32, 28, 28))], {"pads": (1, 1, 1, 1), "strides": (1, 1)})


def _uncached(config, op, ins, outs, attrs):
    return plan_launch(config, op, [None if t is None else TensorSpec(t[1], t[0]) for t in ins],
                       [TensorSpec(s, d) for d, s in outs], attrs)


def test_a_cached_plan_is_the_one_plan_launch_makes():
    cache = PlanCache(8)
    first = cache.plan(NPU_M, *CONV)
    assert first == _uncached(NPU_M, *CONV)
    assert cache.plan(NPU_M, *CONV) is first and len(cache) == 1
    small = NPU_M.replace(cores=1)
    assert cache.plan(small, *CONV) == _uncached(small, *CONV)
    assert cache.plan(small, *CONV).cores == 1 and len(cache) == 2


def test_attributes_are_told_apart_by_repr():
    # -0.0 == 0.0, but a kernel may price them differently: they must not share a plan.
    cache = PlanCache(8)
    x = [("float32", (1, 8))]
    cache.plan(NPU_M, "LeakyRelu", x, x, {"alpha": 0.0})
    cache.plan(NPU_M, "LeakyRelu", x, x, {"alpha": -0.0})
    assert len(cache) == 2


def test_the_cache_keeps_the_most_recently_used_plans():
    cache = PlanCache(2)
    shapes = [("float32", (1, n)) for n in (8, 16, 32)]
    a = cache.plan(NPU_M, "Relu", [shapes[0]], [shapes[0]], {})
    cache.plan(NPU_M, "Relu", [shapes[1]], [shapes[1]], {})
    assert cache.plan(NPU_M, "Relu", [shapes[0]], [shapes[0]], {}) is a  # now the most recent
    cache.plan(NPU_M, "Relu", [shapes[2]], [shapes[2]], {})  # evicts the 16-element plan
    assert len(cache) == 2
    assert cache.plan(NPU_M, "Relu", [shapes[0]], [shapes[0]], {}) is a


def test_a_kernel_registered_again_is_priced_with_its_new_cycles():
    def cycles_of(n):
        return lambda config, ins, outs, attrs, cores: SimpleNamespace(total_cycles=n * cores)

    cache = PlanCache(8)
    x = [("float32", (4,))]
    try:
        kernels.register_kernel("PlanCacheProbe", lambda i, a: [i[0]], cycles=cycles_of(10))
        assert cache.plan(NPU_M, "PlanCacheProbe", x, x, {}).cycles == 10
        kernels.register_kernel("PlanCacheProbe", lambda i, a: [i[0]], cycles=cycles_of(20),
                                replace=True)
        assert cache.plan(NPU_M, "PlanCacheProbe", x, x, {}).cycles == 20
    finally:
        kernels.unregister_kernel("PlanCacheProbe")


def test_an_unpriceable_launch_raises_and_is_not_cached():
    cache = PlanCache(8)
    with pytest.raises(KernelError, match="NoSuchKernel"):
        cache.plan(NPU_M, "NoSuchKernel", [("float32", (4,))], [("float32", (4,))], {})
    assert len(cache) == 0


def test_threads_sharing_a_cache_get_the_same_plans():
    cache = PlanCache(4)
    want = _uncached(NPU_M, *CONV)
    got: list = []

    def work():
        got.extend(cache.plan(NPU_M, *CONV) for _ in range(50))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 200 and all(p == want for p in got) and len(cache) == 1


def test_a_planner_shares_plans_between_equal_configs():
    cache = PlanCache(8)
    twin = DeviceConfig(**NPU_M.to_dict())  # an equal config, another instance
    assert twin == NPU_M and twin is not NPU_M
    first = cache.planner(NPU_M)(*CONV)
    again = cache.planner(twin)
    assert again.args[0] is NPU_M  # keyed by the one instance seen first
    assert again(*CONV) is first and cache.plan(NPU_M, *CONV) is first and len(cache) == 1
    for n in range(1, 80):  # more configs than the planner keeps instances of: still correct
        other = NPU_M.replace(sram_bytes_per_core=NPU_M.sram_bytes_per_core + 64 * n)
        cache.planner(other)
        assert len(cache._configs) <= tiling._CONFIGS
    assert cache.planner(NPU_M)(*CONV) == first


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_plans_although_a_thread_held_the_lock_at_the_fork():
    """A thread of the parent holds the shared cache's lock when the process forks: the child
    (which has no such thread) plans with a lock of its own instead of waiting forever."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with tiling.PLANS._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply_async(_plan_in_child).get(timeout=60) == _uncached(NPU_M, *CONV)
    finally:
        release.set()
        thread.join()


def _plan_in_child():
    return tiling.PLANS.plan(NPU_M, *CONV)
