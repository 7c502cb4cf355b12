"""Kernel inputs are read-only views of HBM: no copy, no writes, results snapshotted at once."""

import numpy as np
import pytest

from npu_sim import Device, TensorSpec
from npu_sim.errors import KernelError
from tests.kernel_fixtures import fixed_cycles, put, registered_kernels

SPEC = TensorSpec((256,), "float32")

seen: list[np.ndarray] = []


def _scribble(inputs, attrs):
    inputs[0][0] = 42.0  # a kernel must never modify its inputs
    return [inputs[0].copy()]


def _keep(inputs, attrs):
    seen.append(inputs[0])
    return [inputs[0] + 1]


@pytest.fixture
def kernels():
    seen.clear()
    with registered_kernels({
        "TestScribble": (_scribble, fixed_cycles(10)),
        "TestKeep": (_keep, fixed_cycles(10)),
        # Returns its input itself (as Identity/Reshape may): a view of HBM.
        "TestSameView": (lambda i, a: [i[0]], fixed_cycles(1000)),
        "TestFill": (lambda i, a: [np.full(SPEC.shape, 7.0, np.float32)], fixed_cycles(10)),
    }):
        yield


def test_inputs_are_read_only_views_of_hbm(kernels):
    dev = Device("npu-s")
    x = np.arange(256, dtype=np.float32)
    src, dst = put(dev, x), dev.malloc(SPEC.nbytes)
    dev.compute.execute("TestKeep", [(src.address, SPEC)], [(dst.address, SPEC)], {}, cores=[0])
    dev.synchronize()
    (view,) = seen
    assert not view.flags.writeable
    assert np.shares_memory(view, dev.hbm.view(src.address, SPEC.nbytes))
    np.testing.assert_array_equal(dev.hbm.read(dst.address, SPEC.nbytes).view(np.float32), x + 1)


def test_a_kernel_writing_its_input_fails_and_changes_nothing(kernels):
    dev = Device("npu-s")
    x = np.arange(256, dtype=np.float32)
    src, dst = put(dev, x), dev.malloc(SPEC.nbytes)
    proc = dev.compute.execute("TestScribble", [(src.address, SPEC)], [(dst.address, SPEC)], {},
                               cores=[0], node="n1")
    with pytest.raises(KernelError, match="n1.*read-only"):
        dev.synchronize()
    assert not proc.ok
    np.testing.assert_array_equal(dev.hbm.read(src.address, SPEC.nbytes).view(np.float32), x)
    assert not dev.hbm.read(dst.address, SPEC.nbytes).any()


def test_a_result_viewing_an_input_is_the_value_at_compute_time(kernels):
    """The view is written cycles later; meanwhile another core overwrites the input."""
    dev = Device("npu-m")
    x = np.arange(256, dtype=np.float32)
    src, dst = put(dev, x), dev.malloc(SPEC.nbytes)
    dev.compute.execute("TestSameView", [(src.address, SPEC)], [(dst.address, SPEC)], {},
                        cores=[0])
    dev.compute.execute("TestFill", [], [(src.address, SPEC)], {}, cores=[1])
    dev.synchronize()
    np.testing.assert_array_equal(dev.hbm.read(dst.address, SPEC.nbytes).view(np.float32), x)
    assert (dev.hbm.read(src.address, SPEC.nbytes).view(np.float32) == 7).all()
