"""Models the installed onnxruntime crashes on, which :mod:`.strategies` keeps out of its draws.

:func:`~ep.testing.assert_matches_onnxruntime` runs onnxruntime in the test's own process (a
child process per example would cost more than the example), so a model that makes onnxruntime
segfault ends the whole test run instead of failing one example. onnxruntime 1.32.0 segfaults
creating a session (default optimizations) for some float16 graphs where a Transpose feeds a
MatMul with a constant B (``perm=[1, 0, 2]``, ``[1, 2, 0]`` and ``[1, 2, 0, 3]`` do, others do
not, also through an identity Transpose between them). Rather than guess the rule, the
strategies ask :func:`crashes` about every drawn model of that family (:func:`suspect`): it
creates the session in a child process, once per distinct model (0.1-1 s). A
release that fixes the crash gets those models drawn again.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import onnx

_CREATE = """
import sys
import onnxruntime as ort
ort.InferenceSession(sys.stdin.buffer.read(), providers=["CPUExecutionProvider"])
"""


def suspect(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is of the family onnxruntime 1.32.0 crashes on: float16 tensors, a
    Transpose, and a MatMul whose B is an initializer."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    half = any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for v in graph.input)
    return half and any(n.op_type == "Transpose" for n in graph.node) and \
        any(n.op_type == "MatMul" and n.input[1] in constants for n in graph.node)


def crashes(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime dies (a signal, or no answer in 2 minutes) creating a session for
    ``model`` with its default options, asked in a child process."""
    return _crashes(model.SerializeToString())


@functools.lru_cache(maxsize=1024)
def _crashes(data: bytes) -> bool:
    try:
        result = subprocess.run([sys.executable, "-c", _CREATE], input=data,
                                capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return True  # it hangs instead: keep the model out all the same
    return result.returncode < 0  # killed by a signal; refusing the model exits with 1
