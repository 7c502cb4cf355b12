"""onnxruntime's optimized graphs, kept across sessions of a model (ep.framework.optimized_graphs).

A model optimized again is not shown to onnxruntime again, and gets what onnxruntime gave the
first time; anything onnxruntime would see differently (a byte of the light model, a free
dimension override) is another key; each model gets its own weights back and a graph of its
own; the cache is bounded, thread-safe and empty in a forked child.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework import optimized_graphs, optimizer
from ep.framework.lru import MISSING
from ep.framework.optimized_graphs import OptimizedGraphs
from ep.framework.optimizer import optimize
from tests.ep.graphgen import random_dags
from tests.ep.test_graph_optimizations import (
    no_cpu_kernel_model,
    optimized_by_onnxruntime,
    shape_chain_model,
    tied_model,
)
from tests.forking import finishes_after_fork, needs_fork
from tests.threads import run_together

BASIC = int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)


class Counted:
    """The optimizer's step that shows onnxruntime a model, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = optimizer._optimized_by_onnxruntime

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)


@pytest.fixture
def shown(monkeypatch) -> Counted:
    """A fresh cache for the test, and the count of models shown to onnxruntime."""
    monkeypatch.setattr(optimizer, "GRAPHS", OptimizedGraphs())
    counted = Counted()
    monkeypatch.setattr(optimizer, "_optimized_by_onnxruntime", counted)
    return counted


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def folded_shape(model: onnx.ModelProto) -> list[int]:
    """The shape constant the Reshape of :func:`shape_chain_model` reads once folded."""
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
    tensor = next(t for t in model.graph.initializer if t.name == reshape.input[1])
    return numpy_helper.to_array(tensor).tolist()


def symbolic_chain(dims: list[int | str]) -> onnx.ModelProto:
    model = shape_chain_model()
    x = model.graph.input[0].type.tensor_type.shape
    for d, value in zip(x.dim, dims, strict=True):
        d.Clear()
        if isinstance(value, str):
            d.dim_param = value
        else:
            d.dim_value = value
    y = model.graph.output[0].type.tensor_type.shape.dim[0]
    y.CopyFrom(x.dim[0])
    return model


def test_a_model_optimized_again_is_not_shown_to_onnxruntime_again(shown, tmp_path: Path):
    model = shape_chain_model()
    first = optimize(model, BASIC)
    second = optimize(model, BASIC)
    assert shown.calls == 1
    assert optimizer.GRAPHS.hits == 1 and optimizer.GRAPHS.misses == 1
    assert second.SerializeToString() == first.SerializeToString()
    theirs = optimized_by_onnxruntime(model, tmp_path / "ort.onnx")
    assert ops(second) == ops(theirs) and folded_shape(second) == folded_shape(theirs)


def test_each_optimization_returns_a_graph_of_its_own(shown):
    model = shape_chain_model()
    first = optimize(model, BASIC)
    want = first.SerializeToString()
    del first.graph.node[:]  # a session edits its graph: the kept one must not change
    assert optimize(model, BASIC).SerializeToString() == want


def test_what_onnxruntime_sees_differently_is_another_key(shown, tmp_path: Path):
    """Two input shapes fold to two shape constants, each onnxruntime's own."""
    a, b = symbolic_chain([2, 3, 4]), symbolic_chain([4, 3, 4])
    got_a, got_b = optimize(a, BASIC), optimize(b, BASIC)
    assert shown.calls == 2 and len(optimizer.GRAPHS) == 2
    assert folded_shape(got_a) == folded_shape(optimized_by_onnxruntime(a, tmp_path / "a.onnx"))
    assert folded_shape(got_b) == folded_shape(optimized_by_onnxruntime(b, tmp_path / "b.onnx"))
    assert folded_shape(got_a) != folded_shape(got_b)


def input_dims(model: onnx.ModelProto) -> list[int | str]:
    return [d.dim_value or d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_free_dimension_overrides_are_part_of_the_key(shown):
    """onnxruntime fixes an overridden dimension in the graph it writes."""
    model = symbolic_chain(["N", 3, 4])
    assert input_dims(optimize(model, BASIC, {"N": 2})) == [2, 3, 4]
    assert input_dims(optimize(model, BASIC, {"N": 5})) == [5, 3, 4]
    assert input_dims(optimize(model, BASIC)) == ["N", 3, 4]
    assert shown.calls == 3
    assert input_dims(optimize(model, BASIC, {"N": 2})) == [2, 3, 4]
    assert shown.calls == 3


def test_each_model_gets_its_own_weights_back(shown):
    """Models that differ only in their weights' values share onnxruntime's graph (it never saw
    the values), and each gets its own weights."""
    a, b = tied_model(vocab=64), tied_model(vocab=64)
    w = numpy_helper.to_array(b.graph.initializer[0])
    b.graph.initializer[0].CopyFrom(numpy_helper.from_array(w + 1, "W"))
    got_a, got_b = optimize(a, BASIC), optimize(b, BASIC)
    assert shown.calls == 1
    assert got_a.graph.initializer[0] == a.graph.initializer[0]
    assert got_b.graph.initializer[0] == b.graph.initializer[0]


def test_a_refused_model_is_remembered_as_refused(shown):
    """A graph onnxruntime finds invalid is its ``InvalidGraph`` each time, shown once."""
    model = shape_chain_model()
    model.graph.node[-1].op_type = "NoSuchOp"
    for _ in range(2):
        with pytest.raises(ep.InvalidGraph, match="NoSuchOp"):
            optimize(model, BASIC)
    assert shown.calls == 1


def test_a_model_onnxruntime_cannot_load_is_remembered_so(shown):
    """One its CPU provider has no kernel for (double ``Tan``) is left as it is, shown once."""
    model = no_cpu_kernel_model()
    for _ in range(2):
        assert optimize(model, BASIC) is model
    assert shown.calls == 1


def test_sessions_of_a_model_created_again_give_onnxruntimes_values(shown):
    model = shape_chain_model().SerializeToString()
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(2):
        session = ep.InferenceSession(model, providers=["NpuSimExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4,
                                   atol=1e-5)
    assert shown.calls == 1


def test_threads_optimizing_one_model_get_the_same_graph(shown):
    model = shape_chain_model()
    results: list[bytes] = []

    def work(_: int) -> None:
        for _ in range(5):
            results.append(optimize(model, BASIC).SerializeToString())

    run_together(work, 4)
    assert len(results) == 20 and len(set(results)) == 1
    assert len(optimizer.GRAPHS) == 1 and 1 <= shown.calls <= 4


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=random_dags(max_nodes=8))
def test_a_kept_graph_is_the_graph_onnxruntime_makes_afresh(model):
    """Property: optimizing from the cache gives the bytes optimizing afresh gives."""
    graphs = OptimizedGraphs()
    real = optimizer.GRAPHS
    try:
        optimizer.GRAPHS = graphs
        fresh = optimize(model, BASIC).SerializeToString()
        kept = optimize(model, BASIC).SerializeToString()
    finally:
        optimizer.GRAPHS = real
    assert kept == fresh
    assert graphs.hits == 1


def key(n: int) -> optimized_graphs.Key:
    return optimized_graphs.key(bytes([n]), {})


def test_the_cache_keeps_the_most_recently_used_within_its_entries():
    graphs = OptimizedGraphs(entries=2)
    graphs.put(key(1), b"a")
    graphs.put(key(2), b"b")
    assert graphs.lookup(key(1)) == b"a"  # now the most recent
    graphs.put(key(3), None)  # a refusal is an entry too
    assert graphs.lookup(key(2)) is MISSING
    assert graphs.lookup(key(1)) == b"a" and graphs.lookup(key(3)) is None
    assert len(graphs) == 2


def test_the_cache_keeps_within_its_bytes():
    graphs = OptimizedGraphs(entries=10, max_bytes=400)
    graphs.put(key(1), b"x" * 101)  # over a quarter of the budget: not kept
    assert graphs.lookup(key(1)) is MISSING
    for n in range(2, 7):
        graphs.put(key(n), b"y" * 100)
    assert len(graphs) == 4 and graphs.lookup(key(2)) is MISSING
    assert all(graphs.lookup(key(n)) == b"y" * 100 for n in range(3, 7))
    graphs.clear()
    assert len(graphs) == 0 and graphs.hits == graphs.misses == 0


def test_the_key_is_the_bytes_and_the_overrides_in_any_order():
    assert optimized_graphs.key(b"m", {"a": 1, "b": 2}) == \
        optimized_graphs.key(b"m", {"b": 2, "a": 1})
    assert optimized_graphs.key(b"m", {"a": 1}) != optimized_graphs.key(b"m", {"a": 2})
    assert optimized_graphs.key(b"m", {}) != optimized_graphs.key(b"n", {})


@needs_fork
def test_a_child_forked_while_the_cache_is_locked_still_optimizes():
    model = shape_chain_model()
    optimize(model, BASIC)

    def child() -> None:
        assert len(optimizer.GRAPHS) == 0
        assert ops(optimize(model, BASIC)) == ops(optimize(model, BASIC))

    assert finishes_after_fork(optimizer.GRAPHS._lock, child)


def test_hidden_weight_generators_come_back_in_every_result(shown):
    """The weight generators hidden from onnxruntime stay out of the key's graph and come back
    in each result (a second optimization gets them too)."""
    shape = numpy_helper.from_array(np.array([64, 64], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["W"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("MatMul", ["x", "W"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for _ in range(2):
        assert ops(optimize(model, BASIC)) == ["ConstantOfShape", "MatMul"]
    assert shown.calls == 1
