"""Reproducers the differential fuzzer (``python -m ep.testing.fuzz``) found, minimized.

Each case is the minimized model in ONNX's textual syntax and the seed of its inputs
(``ep.testing.fuzz.feeds``); it must give onnxruntime's result, judged in the same test
against the installed onnxruntime by :func:`ep.testing.fuzz.run_case` (equal within the
dtype's tolerance, or refused with the same error class).
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
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fuzz_reproducer_gives_onnxruntimes_result(name: str) -> None:
    seed, text = CASES[name]
    model = onnx.parser.parse_model(text)
    result = run_case(model, feeds(model, seed))
    assert result["outcome"] in OK, result
