"""Compute dispatch: kernels registered by the test, with their own cycles function."""

import numpy as np
import pytest

from npu_sim import Device, TensorSpec
from npu_sim.errors import KernelError
from tests.kernel_fixtures import FixedCost, fixed_cycles, put, registered_kernels


def scale_values(inputs, attrs):
    (x,) = inputs
    return [(x * np.float32(attrs["k"])).astype(np.float32)]


def scale_cycles(config, in_specs, out_specs, attrs, cores=1):
    # 1 cycle per 4 elements per core plus a fixed 100: simple enough to check by hand.
    return FixedCost(100 + in_specs[0].size // (4 * cores), macs=in_specs[0].size)


@pytest.fixture
def kernels():
    with registered_kernels({
        "TestScale": (scale_values, scale_cycles),
        "TestBoom": (lambda i, a: 1 / 0, fixed_cycles(50)),
        "TestWrongShape": (lambda i, a: [np.zeros(3, np.float32)], fixed_cycles(5)),
        "TestWrongDtype": (lambda i, a: [i[0].astype(np.float64)], fixed_cycles(5)),
        "TestBadCost": (scale_values, fixed_cycles(-3)),
    }):
        yield


def get(dev, buf, spec):
    return dev.hbm.read(buf.address, spec.nbytes).view(np.float32).reshape(spec.shape)


def test_kernel_runs_values_land_and_cores_are_held(kernels):
    dev = Device("npu-m")
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    spec = TensorSpec((64, 64), "float32")
    src, dst = put(dev, x), dev.malloc(x.nbytes)
    proc = dev.compute.execute("TestScale", [(src.address, spec)], [(dst.address, spec)],
                               {"k": 2.5}, cores=[0, 1], node="scale0")
    dev.synchronize()
    np.testing.assert_array_equal(get(dev, dst, spec), x * np.float32(2.5))
    expected = 100 + 4096 // (4 * 2)
    assert dev.now == expected
    s = dev.stats()
    assert s["core.0.busy_cycles"] == s["core.1.busy_cycles"] == expected
    assert s["core.2.busy_cycles"] == 0
    assert s["compute.kernels"] == 1 and s["compute.macs"] == 4096
    (rec,) = dev.trace.records
    assert (rec.kind, rec.name, rec.start, rec.end) == ("kernel", "scale0", 0, expected)
    assert rec.work["inputs"] == [[[64, 64], "float32"]] and rec.work["op"] == "TestScale"
    assert proc.value == rec.id


def test_two_kernels_on_different_cores_overlap_and_same_core_serialises(kernels):
    dev = Device("npu-m")
    spec = TensorSpec((1024,), "float32")
    x = put(dev, np.ones(1024, np.float32))
    outs = [dev.malloc(spec.nbytes) for _ in range(3)]
    one = 100 + 1024 // 4
    for out, core in zip(outs, (0, 1, 0), strict=True):
        dev.compute.execute("TestScale", [(x.address, spec)], [(out.address, spec)], {"k": 1},
                            cores=[core])
    dev.synchronize()
    spans = [(r.engine, r.start, r.end) for r in dev.trace.records]
    assert ("core1", 0, one) in spans and ("core0", 0, one) in spans
    assert ("core0", one, 2 * one) in spans
    assert dev.now == 2 * one


def test_timing_only_mode_never_touches_data(kernels):
    dev = Device("npu-m")
    spec = TensorSpec((256,), "float32")
    # Addresses need not even be allocated in timing-only mode.
    dev.compute.execute("TestScale", [(0, spec)], [(1 << 20, spec)], {"k": 3}, cores=[2],
                        functional=False)
    dev.synchronize()
    assert dev.now == 100 + 256 // 4 and not dev.hbm._backing


def test_deps_order_a_kernel_after_a_copy(kernels):
    dev = Device("npu-m")
    spec = TensorSpec((4096,), "float32")
    src, dst = dev.malloc(spec.nbytes), dev.malloc(spec.nbytes)
    x = np.arange(4096, dtype=np.float32)
    up = dev.memcpy_h2d_async(src, x)
    dev.compute.execute("TestScale", [(src.address, spec)], [(dst.address, spec)], {"k": -1},
                        cores=[0], deps=[up])
    dev.synchronize()
    np.testing.assert_array_equal(get(dev, dst, spec), -x)
    dma, kern = dev.trace.records
    assert kern.start == dma.end and kern.deps == (dma.id,)


@pytest.mark.parametrize("op,match", [
    ("TestBoom", "ZeroDivisionError"),
    ("TestWrongShape", r"expected shape \(16,\) dtype float32, got shape \(3,\)"),
    ("TestWrongDtype", "got shape .* dtype float64"),
    ("TestBadCost", "total_cycles=-3"),
])
def test_kernel_failures_are_typed_and_leave_the_device_usable(kernels, op, match):
    dev = Device("npu-m")
    spec = TensorSpec((16,), "float32")
    x, out = put(dev, np.ones(16, np.float32)), dev.malloc(64)
    dev.hbm.write(out.address, np.full(16, 7, np.float32))
    proc = dev.compute.execute(op, [(x.address, spec)], [(out.address, spec)], {"k": 2},
                               cores=[0, 3], node="bad")
    with pytest.raises(KernelError, match=match) as info:
        dev.synchronize()
    assert info.value.op == op and info.value.node == "bad"
    assert not proc.ok
    np.testing.assert_array_equal(get(dev, out, spec), np.full(16, 7, np.float32))
    assert dev.compute.cores[0].count == dev.compute.cores[3].count == 0
    dev.compute.execute("TestScale", [(x.address, spec)], [(out.address, spec)], {"k": 2},
                        cores=[0, 3])
    dev.synchronize()
    np.testing.assert_array_equal(get(dev, out, spec), np.full(16, 2, np.float32))


def test_bad_launches_raise_at_once(kernels):
    dev = Device("npu-m")
    spec = TensorSpec((16,), "float32")
    buf = dev.malloc(64)
    args = ([(buf.address, spec)], [(buf.address, spec)], {"k": 1})
    with pytest.raises(KernelError, match="distinct core indices in"):
        dev.compute.execute("TestScale", *args, cores=[0, 0])
    with pytest.raises(KernelError, match=r"in \[0, 4\)"):
        dev.compute.execute("TestScale", *args, cores=[4])
    with pytest.raises(KernelError, match="registered: .*TestScale"):
        dev.compute.execute("NoSuchOp", *args, cores=[0])
    with pytest.raises(KernelError, match="not inside one live allocation"):
        dev.compute.execute("TestScale", [(buf.address + 4096, spec)], args[1], {"k": 1},
                            cores=[0])
    dev.synchronize()
    assert dev.now == 0 and len(dev.trace) == 0
