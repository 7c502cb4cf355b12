"""Models the installed onnxruntime crashes on, which :mod:`.strategies` keeps out of its draws.

:func:`~ep.testing.assert_matches_onnxruntime` runs onnxruntime in the test's own process (a
child process per example would cost more than the example), so a model that makes onnxruntime
segfault ends the whole test run instead of failing one example. Each known crash is probed
once per process, in a child process, with the smallest model that shows it: the strategies
avoid the pattern only while the installed onnxruntime still crashes on it, and draw it again
once a release fixes it.
"""

from __future__ import annotations

import functools
import subprocess
import sys

_HALF_TRANSPOSE_MATMUL = """
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

half = TensorProto.FLOAT16
graph = helper.make_graph(
    [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
     helper.make_node("MatMul", ["t", "w"], ["y"])],
    "probe", [helper.make_tensor_value_info("x", half, [2, 5, 8])],
    [helper.make_tensor_value_info("y", half, [5, 2, 3])],
    initializer=[numpy_helper.from_array(np.ones((8, 3), np.float16), "w")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
"""


@functools.cache
def half_transpose_matmul() -> bool:
    """Whether onnxruntime crashes creating a session (default optimizations) for a float16
    Transpose that keeps the last axis (``perm=[1, 0, 2]``) feeding a MatMul with a constant B.
    onnxruntime 1.32.0 does (a segmentation fault); the kit's property test drew such a
    transformer-like model."""
    try:
        result = subprocess.run([sys.executable, "-c", _HALF_TRANSPOSE_MATMUL],
                                capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return True  # it hangs instead: keep the pattern out all the same
    return result.returncode < 0  # killed by a signal; an exception would exit with 1
