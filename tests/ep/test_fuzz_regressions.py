"""Reproducers the differential fuzzer (``python -m ep.testing.fuzz``) found, minimized.

Each case is the minimized model in ONNX's textual syntax and the seed of its inputs
(``ep.testing.fuzz.feeds``); it must give onnxruntime's result, judged in the same test
against the installed onnxruntime by :func:`ep.testing.fuzz.run_case` (equal within the
dtype's tolerance, or refused with the same error class). ``UNOPTIMIZED`` cases run ep without
onnxruntime's graph optimizations, so the partitioner sees the graph as written.
"""

from __future__ import annotations

import onnx.parser
import pytest

from ep.testing.fuzz import OK, feeds, run_case

CASES = {
    # An empty weight (Expand's shape ``[]``) made no WEIGHTS region, but the launch still
    # resolved its address there: "program has no WEIGHTS region allocated".
    "expand-empty-shape": (7000181, """
        <ir_version: 8, opset_import: ["" : 17]>
        fuzz (float[2,3] t1) => (float[2,3] t4) <int64[0] c3 = {}> {
            t4 = Expand (t1, c3)
        }"""),
    # A declined MaxPool (ceil_mode window in the end padding) makes a shape onnxruntime does
    # not: the NPU compiled its consumer for the inferred (5,6,3,3) and got (5,6,2,3).
    "consumer-of-ceil-mode-pool": (7000294, """
        <ir_version: 8, opset_import: ["" : 17]>
        fuzz (float[5,6,4,4] in1) => (bool[5,6,3,3] t18) {
            t5 = MaxPool <ceil_mode = 1, kernel_shape = [1, 3], pads = [0, 1, 0, 2],
                          strides = [2, 2]> (in1)
            t18 = IsInf (t5)
        }"""),
    # SAME_UPPER with a stride wider than the window needs negative padding: onnxruntime
    # refuses (RuntimeException); the NPU ran it, then the CPU fallback's refusal was EPFail.
    "same-pad-negative": (11000617, """
        <ir_version: 8, opset_import: ["" : 17]>
        fuzz (float[3,4,6] t17) => (float[3,4,3] t19) {
            t19 = MaxPool <auto_pad = "SAME_UPPER", kernel_shape = [1], strides = [2]> (t17)
        }"""),
    # Resize by 0.5 of a length-1 axis gives an empty output: the NPU kernel faulted.
    "resize-to-empty": (13000104, """
        <ir_version: 8, opset_import: ["" : 13]>
        fuzz (float[4,2,1,1] t36) => (float[4,2,0,1] t50) <float[4] c49 = {1, 1, 0.5, 1}> {
            t50 = Resize <mode = "linear"> (t36, "", c49)
        }"""),
    # The misshapen pool's shape flows on through a CPU node (Trilu) to an NPU node (Max),
    # which was compiled for the inferred shape; onnxruntime itself fails at Max.
    "misshapen-pool-two-nodes-down": (13000835, """
        <ir_version: 10, opset_import: ["" : 21]>
        fuzz (float[2,6,6] in1, int64 c7) => (float[2,6,4] t12)
             <float[4] c11 = {0.13610739, -1.2890853, 1.6479315, 1.0126888}> {
            t1 = MaxPool <auto_pad = "VALID", ceil_mode = 1, kernel_shape = [1],
                          strides = [2]> (in1)
            t9 = Trilu <upper = 0> (t1, c7)
            t12 = Max (t9, c11)
        }"""),
    # Empty tensors: onnxruntime refuses these; the NPU ran them (or faulted with EPFail).
    "reshape-empty-to-scalar": (14000362, """
        <ir_version: 10, opset_import: ["" : 21]>
        fuzz (float[8,0] t15) => (float t33) {
            c31 = Constant <value = int64[0] {}> ()
            t33 = Reshape (t15, c31)
        }"""),
    "layernorm-of-nothing": (14000495, """
        <ir_version: 10, opset_import: ["" : 21]>
        fuzz (float[0,6,5] t34) => (float[0,6,5] t44)
             <float[0,6,5] c42 = {}, float[0,6,5] c43 = {}> {
            t44 = LayerNormalization <axis = -3, epsilon = 0.001> (t34, c42, c43)
        }"""),
    # ONNX shape inference gives ConvTranspose a negative dimension when the padding exceeds
    # the output: the NPU compiler failed with InvalidGraph, onnxruntime's is InvalidArgument.
    "negative-inferred-dimension": (20261184783497, """
        <ir_version: 8, opset_import: ["" : 18]>
        fuzz (float[2,5,1,5] t39) => (float[2,2,-1,5] t56) <float[5,2,3,1] c55 = {
            0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
            1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0}> {
            t56 = ConvTranspose <kernel_shape = [3, 1], pads = [2, 0, 2, 0],
                                 strides = [1, 1]> (t39, c55)
        }"""),
}
UNOPTIMIZED = {
    "argmin-over-nothing": (14000071, """
        <ir_version: 10, opset_import: ["" : 20]>
        fuzz (float[0] t25) => (int64[1] t31) {
            t31 = ArgMin <axis = -1, keepdims = 1, select_last_index = 0> (t25)
        }"""),
    "argmax-over-nothing": (14000576, """
        <ir_version: 8, opset_import: ["" : 18]>
        fuzz (float[0,3] t2) => (int64[3] t4) {
            t4 = ArgMax <axis = -2, keepdims = 0, select_last_index = 0> (t2)
        }"""),
    # Constants split from their consumers: without graph optimizations the Constant ``c``
    # lands in the NPU partition of the first Expand, the second Expand after a CPU node in
    # another; its shape input was a partition input there, so its output shape was symbolic
    # and the compiler failed the session ("has symbolic dimension 'unk__0'").
    "constant-split-from-consumer": (13000703, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,1,4] x) => (float[2,3,4] y) {
            c = Constant <value = int64[3] {2, 3, 4}> ()
            a = Expand (x, c)
            b = Softplus (a)
            m = ReduceMean <axes = [1], keepdims = 1> (b)
            e = Expand (m, c)
            y = Relu (e)
        }"""),
    # A Constant whose only consumer falls back to the CPU: the NPU partition holding it
    # alone has nothing to produce.
    "constant-alone-in-a-partition": (0, """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            c = Constant <value = float[1] {2.0}> ()
            y = Mod <fmod = 1> (x, c)
        }"""),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fuzz_reproducer_gives_onnxruntimes_result(name: str) -> None:
    seed, text = CASES[name]
    model = onnx.parser.parse_model(text)
    result = run_case(model, feeds(model, seed))
    assert result["outcome"] in OK, result


@pytest.mark.parametrize("name", sorted(UNOPTIMIZED))
def test_unoptimized_reproducer_gives_onnxruntimes_result(name: str) -> None:
    seed, text = UNOPTIMIZED[name]
    model = onnx.parser.parse_model(text)
    result = run_case(model, feeds(model, seed), optimize=False)
    assert result["outcome"] in OK, result
