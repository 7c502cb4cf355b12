"""DMA: bytes are conserved, faults move nothing, and timing follows the chunk model."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim import Device, DeviceConfig
from npu_sim.config import MiB
from npu_sim.dma import DMA_ALIGNMENT, HOST_IOVA_BASE
from npu_sim.errors import DmaFault

SMALL = DeviceConfig.preset("os32").replace(hbm_bytes=4 * MiB, dma_chunk_bytes=4096,
                                            dma_channels=3)


@settings(max_examples=40)
@given(nbytes=st.integers(1, 20_000), dev_slot=st.integers(0, 1000),
       host_off=st.integers(0, 63), seed=st.integers(0, 2**32 - 1))
def test_round_trip_conserves_bytes(nbytes, dev_slot, host_off, seed):
    dev = Device(SMALL)
    buf = dev.malloc(32 * 1024)
    dev_off = (dev_slot * DMA_ALIGNMENT) % (buf.nbytes - nbytes + 1) // DMA_ALIGNMENT * 4
    data = np.random.default_rng(seed).integers(0, 256, host_off + nbytes, dtype=np.uint8)
    back = np.zeros(host_off + nbytes + 5, np.uint8)
    src, dst = dev.map_host(data), dev.map_host(back)
    up = dev.dma.transfer(src + host_off, buf.address + dev_off, nbytes)
    dev.dma.transfer(buf.address + dev_off, dst + host_off, nbytes, deps=[up])
    dev.synchronize()
    np.testing.assert_array_equal(back[host_off:host_off + nbytes], data[host_off:])
    assert not back[:host_off].any() and not back[host_off + nbytes:].any()
    # Bytes outside the written range of the device buffer are untouched (still zero).
    mem = dev.hbm.read(buf.address, buf.nbytes)
    assert not mem[:dev_off].any() and not mem[dev_off + nbytes:].any()
    chunks = math.ceil(nbytes / SMALL.dma_chunk_bytes)
    s = dev.stats()
    assert s["dma.chunks"] == 2 * chunks
    assert s["dma.h2d.bytes"] == s["dma.d2h.bytes"] == nbytes
    h2d = [r for r in dev.trace.records if r.work["direction"] == "h2d"]
    assert len(h2d) == chunks and sum(r.work["bytes"] for r in h2d) == nbytes
    assert all(r.work["bytes"] <= SMALL.dma_chunk_bytes for r in h2d)


def test_d2d_copy_and_device_api_round_trip():
    dev = Device(SMALL)
    a, b = dev.malloc(10_000), dev.malloc(10_000)
    x = np.arange(2500, dtype=np.float32)
    y = np.zeros_like(x)
    up = dev.memcpy_h2d_async(a, x)
    mid = dev.memcpy_d2d_async(b, a, 6000, dst_offset=400, src_offset=0, deps=[up])
    dev.memcpy_d2h_async(y, b, deps=[mid])
    dev.synchronize()
    np.testing.assert_array_equal(y[100:1600], x[:1500])
    assert not y[:100].any() and not y[1600:].any()
    assert dev.stats()["dma.d2d.bytes"] == 6000
    assert dev.stats()["dma.busy_cycles.hbm"] > 0
    assert not dev.host_map._starts, "temporary host mappings are released after the copy"


def fault_cases(dev, buf, host, ro_host):
    return [
        ("not a multiple", host, buf.address + 2, 16),
        ("not inside one live allocation", host, buf.address + buf.size - 8, 16),
        ("not inside one mapping", host + 4090, buf.address, 16),
        ("positive int", host, buf.address, 0),
        ("positive int", host, buf.address, -4),
        ("both", host, ro_host, 8),
        ("read-only", buf.address, ro_host, 8),
        ("not inside one live allocation", buf.address, buf.address + 4 * MiB, 8),
    ]


@pytest.mark.parametrize("case", range(8))
def test_faults_leave_memory_untouched(case):
    dev = Device(SMALL)
    buf = dev.malloc(4096)
    dev.hbm.write(buf.address, (np.arange(4096) % 251).astype(np.uint8))
    host = np.full(4096, 9, np.uint8)
    ro = np.full(64, 3, np.uint8)
    ro.flags.writeable = False
    iova, ro_iova = dev.map_host(host), dev.map_host(ro)
    match, src, dst, n = fault_cases(dev, buf, iova, ro_iova)[case]
    mem_before, host_before = dev.hbm.read(buf.address, 4096), host.copy()
    with pytest.raises(DmaFault, match=match):
        dev.dma.transfer(src, dst, n)
    dev.synchronize()
    np.testing.assert_array_equal(dev.hbm.read(buf.address, 4096), mem_before)
    np.testing.assert_array_equal(host, host_before)
    assert dev.stats()["dma.transfers"] == 0 and len(dev.trace) == 0 and dev.now == 0


def test_device_copy_bounds_are_checked_before_anything_moves():
    dev = Device(SMALL)
    buf = dev.malloc(100)
    with pytest.raises(DmaFault, match="outside"):
        dev.memcpy_h2d_async(buf, np.ones(101, np.uint8))
    with pytest.raises(DmaFault, match="outside"):
        dev.memcpy_d2h_async(np.ones(8, np.uint8), buf, src_offset=96)
    with pytest.raises(DmaFault, match="C-contiguous"):
        dev.memcpy_h2d_async(buf, np.ones((8, 8), np.uint8)[:, ::2])
    with pytest.raises(DmaFault, match="read-only"):
        ro = np.ones(8, np.uint8)
        ro.flags.writeable = False
        dev.memcpy_d2h_async(ro, buf)
    dev.free(buf)
    with pytest.raises(DmaFault, match="not a live buffer"):
        dev.memcpy_h2d_async(buf, np.ones(8, np.uint8))
    dev.synchronize()
    assert dev.stats()["dma.transfers"] == 0 and not dev.host_map._starts


def test_freeing_a_buffer_in_flight_faults_the_transfer():
    dev = Device(SMALL)
    buf = dev.malloc(64 * 1024)
    done = dev.memcpy_h2d_async(buf, np.ones(64 * 1024, np.uint8))
    dev.free(buf)
    # The fault names the range the first chunk addressed, starting at the freed buffer.
    with pytest.raises(DmaFault, match=rf"range \[{buf.address:#x}, \+\d+\) is not inside one "
                                       "live allocation"):
        dev.synchronize()
    assert not done.ok
    # The device remains usable.
    again = dev.malloc(1024)
    dev.memcpy_h2d_async(again, np.ones(1024, np.uint8))
    dev.synchronize()
    assert dev.hbm.read(again.address, 1024).all()


def test_host_iova_base_separates_directions():
    dev = Device(SMALL)
    assert dev.map_host(np.zeros(4, np.uint8)) >= HOST_IOVA_BASE
    with pytest.raises(DmaFault, match="no mapping"):
        dev.unmap_host(HOST_IOVA_BASE + 12345)


# -- timing by hand ---------------------------------------------------------------------------


def h2d_finish(config, nbytes):
    dev = Device(config)
    buf = dev.malloc(nbytes)
    dev.memcpy_h2d_async(buf, np.zeros(nbytes, np.uint8))
    dev.synchronize()
    return dev.now


def test_100mib_h2d_matches_the_chunk_model():
    cfg = DeviceConfig.preset("npu-m")
    total = 100 * MiB
    chunks = math.ceil(total / (10 * MiB))
    setup = math.ceil(cfg.dma_setup_ns * cfg.clock_ghz)  # 1000 ns at 1.2 GHz = 1200 cycles
    per_chunk_link = math.ceil(10 * MiB / (cfg.host_link_gbps / cfg.clock_ghz))
    # Cycle counts are integers: exact. (Setup is 0.2% of the total, so a 1% tolerance could not
    # tell "setup paid per chunk" from "setup skipped".)
    one = h2d_finish(cfg.replace(dma_channels=1), total)
    assert one == chunks * (setup + per_chunk_link)
    many = h2d_finish(cfg, total)  # 4 channels: setup hidden behind the link
    assert many == setup + chunks * per_chunk_link
    link_bound = total / (cfg.host_link_gbps / cfg.clock_ghz)
    times = [h2d_finish(cfg.replace(dma_channels=k), total) for k in (1, 2, 8)]
    assert times[0] > times[1] >= times[2] >= link_bound
    assert times[1] == times[2] == many  # two channels already saturate the link
    assert times[2] - link_bound < setup + chunks  # one setup plus per-chunk rounding


def test_more_channels_help_when_setup_dominates():
    # Small chunks with a long setup: channels overlap setups until the link saturates.
    cfg = SMALL.replace(dma_setup_ns=20_000.0)  # 20k cycles of setup vs 256 of link per chunk
    nbytes = 16 * SMALL.dma_chunk_bytes
    link = math.ceil(SMALL.dma_chunk_bytes / cfg.host_link_bytes_per_cycle)
    t1 = h2d_finish(cfg.replace(dma_channels=1), nbytes)
    t4 = h2d_finish(cfg.replace(dma_channels=4), nbytes)
    assert t1 == 16 * (20_000 + link)
    # 4 waves of 4 chunks. In the first wave the 4th chunk waits for 3 links; after that each
    # channel's next setup ends exactly as the link frees, so the offset persists.
    assert t4 == 4 * (20_000 + link) + 3 * link
    assert t4 >= nbytes / cfg.host_link_bytes_per_cycle


def test_timing_is_deterministic():
    cfg = SMALL
    assert h2d_finish(cfg, 123_457) == h2d_finish(cfg, 123_457)
