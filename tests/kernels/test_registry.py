"""The kernel registry holds every op of the activation, elementwise, norm, reduce and shape
families, and an unknown name is refused with the list of registered ones."""

from __future__ import annotations

import numpy as np
import pytest

from npu_sim.errors import KernelError
from npu_sim.kernels import kernel, lookup, names, unregister_kernel

OPS = """
Relu LeakyRelu PRelu Clip Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Softmax LogSoftmax
LayerNormalization BatchNormalization Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Min Max
Sum Mean ReduceMean ReduceSum ReduceMax ReduceMin ReduceL2 Reshape Flatten Transpose Concat Split
Slice Squeeze Unsqueeze Gather Expand Where Cast Identity Dropout Pad
""".split()


@pytest.mark.parametrize("op", OPS)
def test_op_is_registered(op):
    entry = lookup(op)
    assert entry.name == op
    assert callable(entry.values)


def test_unknown_name_lists_registered_kernels():
    with pytest.raises(KernelError, match="no kernel registered") as info:
        lookup("NoSuchOp", node="n7")
    message = str(info.value)
    assert info.value.op == "NoSuchOp" and info.value.node == "n7"
    for op in ("Relu", "Softmax", "Pad", "ReduceL2"):
        assert op in message


def test_registering_a_name_twice_is_refused():
    with pytest.raises(KernelError, match="already registered"):
        kernel("Relu")(lambda inputs, attrs: [])


def test_a_user_kernel_registers_and_runs():
    @kernel("TestOnlyDouble")
    def double(inputs, attrs):
        return [inputs[0] * 2]

    try:
        assert "TestOnlyDouble" in names()
        out = lookup("TestOnlyDouble").values([np.arange(3)], {})
        np.testing.assert_array_equal(out[0], [0, 2, 4])
    finally:
        unregister_kernel("TestOnlyDouble")
    assert "TestOnlyDouble" not in names()
