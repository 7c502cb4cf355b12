"""The differential fuzzer itself: a derandomized sample of generated models gives
onnxruntime's result, the generator is valid, broad and independent, and the campaign
machinery (workers, hangs, crashes, minimization, tables) works.

The full campaign is ``python -m ep.testing.fuzz --seed S --count 1000 --workers 2 --out DIR``
(see ``docs/conformance.md``); CI runs :data:`SAMPLE` models of seed :data:`SEED` in process.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import onnx
import pytest

import ep.testing.fuzz as fuzz
from ep.testing.fuzz import OK, feeds, generate, run_case
from ep.testing.fuzz.__main__ import BEGIN, END, main, write_docs
from ep.testing.fuzz.campaign import _Worker, summarize
from ep.testing.fuzz.minimize import minimize
from ep.testing.fuzz.worker import feed_seed, optimized

SEED = 2026
SAMPLE = 150


def test_generated_models_give_onnxruntimes_result() -> None:
    results = []
    for index in range(SAMPLE):
        model = generate(SEED, index)
        result = run_case(model, feeds(model, feed_seed(SEED, index)),
                          optimize=optimized(index))
        results.append((index, result))
    failed = [(i, r["outcome"], r["detail"], r.get("where")) for i, r in results
              if r["outcome"] not in OK]
    assert not failed, failed
    summary = summarize([r for _, r in results])
    assert summary["npu_share"] >= 0.75, summary


def test_generator_is_deterministic_valid_and_broad() -> None:
    ops: set[str] = set()
    for index in range(150):
        model = generate(5, index)
        assert model == generate(5, index)
        onnx.checker.check_model(model, full_check=True)
        ops |= {n.op_type for n in model.graph.node}
    assert len(ops) >= 90, sorted(ops)
    assert {"Softplus", "TopK", "CumSum", "Tile", "Mod"} <= ops  # ops the NPU declines too


def test_generator_shares_no_code_with_the_compiler() -> None:
    for path in Path(fuzz.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("ep.npusim", "npu_sim", "firmware_model",
                                            "ep.testing.strategies")), (path.name, name)


def test_campaign_writes_tables_and_docs_block(tmp_path: Path) -> None:
    out = tmp_path / "out"
    docs = tmp_path / "conformance.md"
    docs.write_text("# Conformance\n\ntext kept\n")
    args = ["--seed", "3", "--count", "4", "--workers", "1", "--out", str(out),
            "--docs", str(docs)]
    assert main(args) in (0, 1)
    data = json.loads((out / "results.json").read_text())
    assert [r["index"] for r in data["results"]] == [0, 1, 2, 3]
    assert data["summary"]["models"] == 4
    assert "| outcome | models | share |" in (out / "results.md").read_text()
    once = docs.read_text()
    write_docs(docs, (out / "results.md").read_text())
    assert docs.read_text() == once  # regenerating replaces the block, keeps the rest
    assert once.startswith("# Conformance\n\ntext kept\n") and once.count(BEGIN) == 1
    assert once.index(BEGIN) < once.index(END)


@pytest.mark.parametrize("script, outcome", [
    ("import time; time.sleep(30)", "hang"),
    ("import os; os._exit(3)", "crash (exit status 3)"),
])
def test_worker_hang_and_crash_are_outcomes(tmp_path: Path, script: str, outcome: str) -> None:
    worker = _Worker(0, 1.0, tmp_path / "log")
    worker.args = [sys.executable, "-c", script]
    worker.send({"seed": 0, "index": 0})
    assert worker.read(1.0) == outcome
    worker.stop()


def test_minimize_keeps_the_failure_and_shrinks() -> None:
    model = next(m for m in (generate(9, i) for i in range(50))
                 if sum(n.op_type != "Constant" for n in m.graph.node) >= 8
                 and any(n.op_type == "Softplus" for n in m.graph.node))

    def fails(m: onnx.ModelProto) -> bool:
        return any(n.op_type == "Softplus" for n in m.graph.node)

    small = minimize(model, 0, fails=fails)
    assert [n.op_type for n in small.graph.node if n.op_type != "Constant"] == ["Softplus"]
    onnx.checker.check_model(small, full_check=True)


def test_a_difference_is_localized_to_its_node() -> None:
    # onnxruntime's LRN keeps a running sum of squares (adding the channel entering the
    # window, subtracting the one leaving), which cancels when a huge value leaves; the NPU
    # sums each window (float64 agrees with it to 4e-6, onnxruntime is 3e-3 off).
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,6,1,1] x) => (float[1,6,1,1] y) {
            y = LRN <alpha = 0.0037, beta = 0.59, bias = 1.42, size = 5> (x)
        }""")
    import numpy as np

    x = np.array([-4.2, -5469.7, -0.54, -3.04, -6.8, 1.27], np.float32).reshape(1, 6, 1, 1)
    result = run_case(model, {"x": x})
    if result["outcome"] == "equal":
        pytest.skip("this onnxruntime sums LRN windows exactly")
    assert result["outcome"] == "different" and result["culprit"] == "LRN", result
    assert result["amplified"] is False
