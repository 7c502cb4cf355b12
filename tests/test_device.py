"""The Device API on every preset and allocator strategy."""

import numpy as np
import pytest

from npu_sim import HOST_IOVA_BASE, Device, DeviceConfig
from npu_sim.config import PRESETS
from npu_sim.errors import ConfigError, DmaFault, HbmOutOfMemory, InvalidFree
from npu_sim.hbm import ALLOCATORS


@pytest.fixture(params=[(p, a) for p in sorted(PRESETS) for a in sorted(ALLOCATORS)],
                ids=lambda pa: f"{pa[0]}-{pa[1]}")
def dev(request):
    preset, allocator = request.param
    return Device(preset, allocator=allocator)


def test_round_trip_and_counters(dev):
    x = np.random.default_rng(0).standard_normal((37, 129)).astype(np.float32)
    a, b = dev.malloc(x.nbytes), dev.malloc(x.nbytes)
    y = np.zeros_like(x)
    up = dev.memcpy_h2d_async(a, x)
    mid = dev.memcpy_d2d_async(b, a, x.nbytes, deps=[up])
    dev.memcpy_d2h_async(y, b, deps=[mid])
    dev.synchronize()
    np.testing.assert_array_equal(y, x)
    s = dev.stats()
    assert s["dma.h2d.bytes"] == s["dma.d2h.bytes"] == s["dma.d2d.bytes"] == x.nbytes
    assert s["dma.transfers"] == 3 and s["device.cycles"] == dev.now > 0
    align = dev.config.hbm_alignment
    assert s["hbm.bytes_in_use"] == 2 * (-(-x.nbytes // align) * align)
    assert len(dev.trace) == s["dma.chunks"]
    dev.reset_stats()
    s = dev.stats()
    assert s["dma.h2d.bytes"] == 0 and s["hbm.alloc_calls"] == 0
    assert s["hbm.peak_bytes_in_use"] == s["hbm.bytes_in_use"] > 0


def test_construction():
    assert Device().config == DeviceConfig.preset("npu-m")
    assert Device("os32").config.cores == 1
    cfg = DeviceConfig.preset("npu-s").replace(dma_channels=3)
    dev = Device(cfg)
    assert dev.config is cfg and dev.now == 0 and len(dev.compute.cores) == 2
    assert Device().id != Device().id
    with pytest.raises(ConfigError, match="preset"):
        Device("npu-xxl")
    with pytest.raises(ConfigError, match="config"):
        Device(42)
    with pytest.raises(ConfigError, match="allocator"):
        Device(allocator="worst_fit")


def test_buffers_belong_to_their_device():
    a, b = Device("os32"), Device("os32")
    buf = a.malloc(1024)
    with pytest.raises(InvalidFree, match="not a live allocation"):
        b.free(buf)
    with pytest.raises(DmaFault, match="not a live buffer"):
        b.memcpy_h2d_async(buf, np.zeros(4, np.uint8))
    a.free(buf)


def test_oom_message_names_sizes():
    dev = Device("os32")
    with pytest.raises(HbmOutOfMemory, match=r"npu.hbm: cannot allocate 2.0 GiB \(free 1.0 GiB"):
        dev.malloc(2 * 1024**3)


def test_empty_copy_completes_without_moving_anything():
    dev = Device("os32")
    buf = dev.malloc(512)
    done = dev.memcpy_h2d_async(buf, np.zeros(0, np.float32))
    dev.synchronize()
    assert done.ok and dev.stats()["dma.transfers"] == 0


def test_map_host_gives_distinct_host_addresses():
    dev = Device("os32")
    x, y = np.zeros(10, np.uint8), np.zeros(5000, np.uint8)
    ix, iy = dev.map_host(x), dev.map_host(y)
    assert ix >= HOST_IOVA_BASE and iy >= ix + 4096
    dev.unmap_host(ix)
    dev.unmap_host(iy)


def test_same_inputs_same_cycles():
    def run():
        dev = Device("npu-s")
        bufs = [dev.malloc(n) for n in (3 * 2**20, 17 * 2**20, 4096)]
        for b in bufs:
            dev.memcpy_h2d_async(b, np.ones(b.nbytes, np.uint8))
        dev.synchronize()
        return dev.now, [(r.engine, r.start, r.end) for r in dev.trace.records]

    assert run() == run()


def test_trace_recorder_ids_deps_and_validation():
    from npu_sim.trace import TraceRecorder

    tr = TraceRecorder()
    a = tr.record("dma", "dma0", "npu.dma0", "x", 0, 10, work={"bytes": 64})
    b = tr.record("kernel", "core1", "npu.core1", "k", 10, 25, deps=[a, a])
    assert (a, b) == (0, 1) and len(tr) == 2
    assert tr.records[1].deps == (0,) and tr.records[1].cycles == 15
    with pytest.raises(ValueError, match="kind"):
        tr.record("dram", "x", "npu", "n", 0, 1)
    with pytest.raises(ValueError, match="start"):
        tr.record("sync", "x", "npu", "n", 5, 1)
    with pytest.raises(ValueError, match="deps"):
        tr.record("sync", "x", "npu", "n", 0, 1, deps=[7])
    tr.clear()
    assert len(tr) == 0 and tr.record("sync", "x", "npu", "n", 0, 0) == 2


def _other_device_event():
    other = Device("npu-s")
    return other.memcpy_h2d_async(other.malloc(64), np.zeros(4, np.float32))


@pytest.mark.parametrize(("call", "text"), [
    (lambda d, b: d.memcpy_h2d_async(b, np.array([object()] * 4)), "dtype object holds Python"),
    (lambda d, b: d.memcpy_h2d_async(b, np.array(["ab", "c"])), r"dtype <U2 holds"),
    (lambda d, b: d.memcpy_d2h_async(np.empty(4, object), b), "dtype object holds Python"),
    (lambda d, b: d.memcpy_h2d_async(b, np.zeros(4, np.float32), deps=[3]),
     r"deps\[0\] is int 3; expected an event returned by this device"),
    (lambda d, b: d.memcpy_h2d_async(b, np.zeros(4, np.float32), deps=3),
     "deps must be a sequence of events"),
    (lambda d, b: d.memcpy_d2d_async(b, b, 4, deps=[_other_device_event()]),
     r"deps\[0\] is an event of another device"),
])
def test_bad_host_arrays_and_dependencies_are_dma_faults(dev, call, text):
    """Never numpy's TypeError or simpy's AttributeError; the device stays usable."""
    buf = dev.malloc(1024)
    with pytest.raises(DmaFault, match=text):
        call(dev, buf)
    data = np.arange(8, dtype=np.float32)
    arrived = dev.memcpy_h2d_async(buf, data)
    out = np.empty_like(data)
    dev.memcpy_d2h_async(out, buf, deps=[arrived])
    dev.synchronize()
    np.testing.assert_array_equal(out, data)
