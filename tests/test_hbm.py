"""HBM allocator and contents: every strategy keeps the same invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim import DeviceConfig
from npu_sim.config import MiB
from npu_sim.errors import ConfigError, DmaFault, HbmOutOfMemory, InvalidFree
from npu_sim.hbm import ALLOCATORS, Hbm

STRATEGIES = sorted(ALLOCATORS)
SMALL = DeviceConfig.preset("os32").replace(hbm_bytes=1 * MiB, hbm_alignment=512)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 300_000)),
        st.tuples(st.just("free"), st.integers(0, 10_000)),
    ),
    max_size=60,
)


def check_invariants(hbm: Hbm, live: list) -> None:
    s = hbm.stats()
    spans = sorted((b.address, b.end) for b in live)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, "live blocks overlap"
    for b in live:
        assert b.address % hbm.alignment == 0 and b.size % hbm.alignment == 0
        assert 0 <= b.address and b.end <= hbm.capacity
        assert b.nbytes <= b.size < b.nbytes + hbm.alignment
    assert s["hbm.bytes_in_use"] == sum(b.size for b in live)
    assert s["hbm.allocations"] == len(live)
    assert s["hbm.free_bytes"] + s["hbm.cached_bytes"] == hbm.capacity - s["hbm.bytes_in_use"]
    if hbm.strategy != "mru":
        assert s["hbm.cached_bytes"] == 0
    assert s["hbm.largest_free_block"] <= s["hbm.free_bytes"]
    assert s["hbm.peak_bytes_in_use"] >= s["hbm.bytes_in_use"]
    assert 0.0 <= s["hbm.fragmentation"] < 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=40)
@given(ops=ops)
def test_random_alloc_free_keeps_invariants(strategy, ops):
    hbm = Hbm(SMALL, strategy)
    live = []
    for op, arg in ops:
        if op == "alloc":
            before = hbm.stats()
            try:
                live.append(hbm.malloc(arg))
            except HbmOutOfMemory as exc:
                assert hbm.stats() == before, "a failed malloc changed the allocator"
                aligned = -(-arg // 512) * 512
                assert exc.nbytes == aligned
                assert exc.free_bytes == before["hbm.free_bytes"]
                assert exc.largest_free_block == before["hbm.largest_free_block"]
                # OOM is only legitimate if no block (even after flushing a cache) could fit.
                assert aligned > hbm.capacity - before["hbm.bytes_in_use"] or aligned > \
                    before["hbm.largest_free_block"]
        elif live:
            hbm.free(live.pop(arg % len(live)))
        check_invariants(hbm, live)
    for b in live:
        hbm.free(b)
    hbm.release_cache()
    s = hbm.stats()
    assert s["hbm.free_bytes"] == s["hbm.largest_free_block"] == hbm.capacity
    assert s["hbm.fragmentation"] == 0.0 and s["hbm.bytes_in_use"] == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_error_paths_leave_state_unchanged(strategy):
    hbm, other = Hbm(SMALL, strategy), Hbm(SMALL, strategy)
    a = hbm.malloc(1000)
    hbm.free(hbm.malloc(512))
    foreign = other.malloc(512)
    assert foreign.address == a.address  # same address, other device: must not alias `a`
    data = (np.arange(1000) % 251).astype(np.uint8)
    hbm.write(a.address, data)
    before = hbm.stats()
    for bad in (0, -1, 1.5, "12", None, True):
        with pytest.raises(InvalidFree, match="malloc"):
            hbm.malloc(bad)
    # The request rounds up to the alignment; what is free depends on the strategy.
    with pytest.raises(HbmOutOfMemory, match=r"npu\.hbm: cannot allocate 1\.0 MiB \(free "
                                             r"[\d.]+ KiB, largest block [\d.]+ KiB\)") as info:
        hbm.malloc(hbm.capacity + 1)
    assert info.value.nbytes == hbm.capacity + SMALL.hbm_alignment
    assert info.value.largest_free_block <= info.value.free_bytes < hbm.capacity
    with pytest.raises(InvalidFree, match="not a live allocation"):
        hbm.free(foreign)
    with pytest.raises(InvalidFree, match="expected a DeviceBuffer"):
        hbm.free(a.address)
    # Every refused call left the allocator and the contents exactly as they were.
    assert hbm.stats() == before
    np.testing.assert_array_equal(hbm.read(a.address, 1000), data)
    hbm.free(a)
    after_free = hbm.stats()
    with pytest.raises(InvalidFree, match="double free"):
        hbm.free(a)
    assert hbm.stats() == after_free
    assert before["hbm.alloc_calls"] == after_free["hbm.alloc_calls"]


def test_oom_reports_fragmentation():
    hbm = Hbm(SMALL, "first_fit")
    blocks = [hbm.malloc(64 * 1024) for _ in range(16)]  # fills the 1 MiB exactly
    for b in blocks[::2]:
        hbm.free(b)
    with pytest.raises(HbmOutOfMemory) as info:
        hbm.malloc(128 * 1024)
    assert info.value.free_bytes == 8 * 64 * 1024
    assert info.value.largest_free_block == 64 * 1024
    assert info.value.scope == "npu.hbm"
    assert "128.0 KiB" in str(info.value)
    assert hbm.stats()["hbm.fragmentation"] == pytest.approx(1 - 1 / 8)


def test_first_fit_and_best_fit_choose_differently():
    def layout(strategy):
        hbm = Hbm(SMALL, strategy)
        a, _, c, _ = (hbm.malloc(n) for n in (4096, 512, 1024, 512))
        hbm.free(a)  # a 4096 hole at 0 and a 1024 hole after it
        hbm.free(c)
        return hbm.malloc(1024).address, a.address, c.address

    got, a_addr, _ = layout("first_fit")
    assert got == a_addr
    got, _, c_addr = layout("best_fit")
    assert got == c_addr


def test_mru_reuses_most_recently_freed_block_of_same_size():
    hbm = Hbm(SMALL, "mru")
    x, y = hbm.malloc(2048), hbm.malloc(2048)
    hbm.free(x)
    hbm.free(y)
    assert hbm.stats()["hbm.cached_bytes"] == 4096
    assert hbm.malloc(2000).address == y.address  # same aligned size, most recent first
    assert hbm.malloc(1536).address != x.address  # a different size is not a hit
    assert hbm.stats()["hbm.cached_bytes"] == 2048


def test_mru_flushes_cache_before_oom():
    hbm = Hbm(SMALL, "mru")
    halves = [hbm.malloc(hbm.capacity // 2) for _ in range(2)]
    for b in halves:
        hbm.free(b)
    assert hbm.stats()["hbm.free_bytes"] == 0
    whole = hbm.malloc(hbm.capacity)  # only fits once the cached halves coalesce
    assert whole.address == 0 and hbm.stats()["hbm.cached_bytes"] == 0


def test_unknown_strategy_is_a_config_error():
    with pytest.raises(ConfigError, match="allocator"):
        Hbm(SMALL, "buddy_of_mine")


def test_contents_are_lazy_zero_and_isolated():
    hbm = Hbm(DeviceConfig.preset("npu-m"))  # 16 GiB, but nothing is backed until touched
    big = hbm.malloc(8 * 1024**3)
    assert not hbm._backing
    assert not hbm.read(big.address + 4096, 16).any()
    assert not hbm._backing, "reading unwritten memory must not back it"
    hbm.write(big.address + 8, np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(hbm.read(big.address + 8, 16).view(np.int32), np.arange(4))
    hbm.free(big)
    again = hbm.malloc(1024)
    assert again.address == big.address
    assert not hbm.read(again.address, 1024).any(), "a new allocation reads as zeros"


@pytest.mark.parametrize("offset,nbytes", [(-8, 8), (1020, 8), (0, 2048), (4096, 1)])
def test_view_outside_an_allocation_faults(offset, nbytes):
    hbm = Hbm(SMALL)
    buf = hbm.malloc(1024)
    with pytest.raises(DmaFault, match="nearest"):
        hbm.view(buf.address + offset, nbytes)


def test_view_of_freed_memory_faults():
    hbm = Hbm(SMALL)
    buf = hbm.malloc(1024)
    hbm.view(buf.address, 1024)[:] = 7
    hbm.free(buf)
    with pytest.raises(DmaFault, match="nothing allocated"):
        hbm.read(buf.address, 4)
