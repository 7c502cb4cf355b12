"""The compiler's topological sort against the definition it implements: repeated passes, each
taking every node whose inputs are known, in the given order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from ep import errors
from ep.npusim.compiler.ir import _toposorted


def by_passes(graph) -> list:
    known = {vi.name for vi in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:
            return sorted({i for n in pending for i in n.input if i not in known})[:5]
        pending = [n for n in pending if all(n is not r for r in ready)]
        for n in ready:
            known.update(n.output)
        ordered.extend(ready)
    return ordered


@st.composite
def graphs(draw):
    n = draw(st.integers(0, 12))
    names = ["x"] + [f"t{k}" for k in range(n)] + ["", "nowhere"]
    nodes = []
    for k in range(n):
        # Mostly earlier tensors (a DAG); sometimes any tensor (cycles, unproduced inputs).
        pool = names[: k + 1] if draw(st.integers(0, 9)) else names
        inputs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        nodes.append(helper.make_node("Add", inputs, [f"t{k}"], name=f"n{k}"))
    order = draw(st.permutations(range(n)))
    return helper.make_graph([nodes[k] for k in order], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])


@settings(max_examples=300)
@given(graphs())
def test_toposort_matches_the_pass_by_pass_definition(graph):
    expected = by_passes(graph)
    if expected and isinstance(expected[0], str):
        with pytest.raises(errors.InvalidGraph) as info:
            _toposorted(graph)
        assert info.value.message.endswith(f"nothing produces: {expected}")
    else:
        assert [n.name for n in _toposorted(graph)] == [n.name for n in expected]
