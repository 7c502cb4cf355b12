"""docs/testing.md's EP-developer example runs: its code block is executed as a test module."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def example(name: str) -> str:
    """The ```python block following ``<!-- example: NAME -->`` in docs/testing.md."""
    text = DOC.read_text()
    match = re.search(rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"docs/testing.md has no example {name!r}"
    return match.group(1)


def test_ep_developer_ci_example_runs_and_its_ep_takes_nodes():
    namespace: dict = {"__name__": "testing_md_example"}
    exec(compile(example("ep-developer-ci"), str(DOC), "exec"), namespace)  # noqa: S102
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert len(tests) == 1
    tests[0]()  # the hypothesis test itself: raises if the EP differs from onnxruntime

    # The example's EP really runs nodes (not everything falls back to the CPU).
    from onnx import TensorProto, helper

    import ep

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="r"),
         helper.make_node("Softplus", ["r"], ["y"], name="s")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ep.InferenceSession(model.SerializeToString(), providers=[
        namespace["MyExecutionProvider"](), "CPUExecutionProvider"])
    assert session.get_node_assignment() == {"r": "MyExecutionProvider",
                                             "s": "CPUExecutionProvider"}
