"""Partitioner, CPU provider and plan executor: assignment, acyclicity, boundaries, results."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ep.errors import EPFail, InvalidArgument
from ep.framework.cpu import CPUExecutionProvider
from ep.framework.executor import PlanExecutor
from ep.framework.graph import GraphView
from ep.framework.partitioner import PartitionPlan, partition
from ep.framework.provider import (
    CompiledNode,
    ComputeCapability,
    ExecutionProvider,
    FusedNode,
    ProviderContext,
)
from ep.framework.tensors import check_model_tensors
from tests.ep.graphgen import random_dags, random_feeds, reference_eval


class NumpyCompiled(CompiledNode):
    """Runs a fused subgraph with the numpy reference evaluator (independent of ORT)."""

    def __init__(self, fused: FusedNode, log: list[str] | None = None) -> None:
        self.name = fused.name
        self.fused = fused
        self.log = log

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.log is not None:
            self.log.append(self.name)
        feeds = dict(zip(self.fused.inputs, inputs, strict=True))
        return [np.array(v) for v in reference_eval(self.fused.graph, feeds, self.fused.outputs)]


class SubsetEP(ExecutionProvider):
    """A test EP supporting the nodes named in ``names``; offers them as one group (the
    partitioner must split it) or one group per node."""

    def __init__(self, type_: str, names: set[str], one_group: bool = True) -> None:
        super().__init__()
        self.type = type_
        self.names = names
        self.one_group = one_group
        self.log: list[str] = []

    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        ours = [i for i, n in enumerate(graph.names) if n in self.names and i not in graph.assigned]
        if not ours:
            return []
        if self.one_group:
            return [ComputeCapability(tuple(ours))]
        return [ComputeCapability((i,)) for i in ours]

    def decline_reasons(self, graph: GraphView) -> dict[int, str]:
        return {i: "not in the test subset" for i, n in enumerate(graph.names)
                if n not in self.names}

    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        return [NumpyCompiled(f, self.log) for f in fused_nodes]


def compile_plan(plan: PartitionPlan, providers: Sequence[ExecutionProvider]):
    by_type = {p.type: p for p in providers}
    by_type.setdefault("CPUExecutionProvider", CPUExecutionProvider())
    compiled = {}
    for part in plan.partitions:
        [node] = by_type[part.provider].compile([plan.fused_node(part)])
        compiled[part.name] = node
    return compiled


def assert_valid_plan(graph: GraphView, plan: PartitionPlan) -> None:
    seen = [i for p in plan.partitions for i in p.nodes]
    assert sorted(seen) == list(range(len(graph.nodes))), "every node exactly once"
    assert len({p.name for p in plan.partitions}) == len(plan.partitions)
    assert set(plan.assignment) == set(graph.names)
    where = {i: k for k, p in enumerate(plan.partitions) for i in p.nodes}
    for k, part in enumerate(plan.partitions):
        assert list(part.nodes) == sorted(part.nodes)
        for name in part.inputs:
            assert name not in graph.initializers
            p = graph.producer(name)
            # Every edge into a partition comes from an earlier one: the order is topological,
            # so the partition graph has no cycle.
            assert (p is None and name in graph.inputs) or where[p] < k
        for i in part.nodes:
            assert plan.assignment[graph.names[i]] == part.provider
            for name in graph.node_inputs(i):
                p = graph.producer(name)
                if p is not None and where[p] != k:
                    assert name in part.inputs
                    assert name in plan.partitions[where[p]].outputs


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _vi(name, shape=(2, 2)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def diamond():
    """A(npu) -> B(cpu) -> C(npu) with A -> C too: {A, C} as one partition is a cycle."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="B"),
        helper.make_node("Add", ["a", "b"], ["c"], name="C"),
    ]
    return _model(nodes, [_vi("x")], [_vi("c", None)])


def test_group_that_would_close_a_cycle_through_another_provider_is_split():
    graph = GraphView.from_model(diamond())
    npu = SubsetEP("TestNpuExecutionProvider", {"A", "C"})
    plan = partition(graph, [npu])
    assert [(p.name, p.provider, p.nodes) for p in plan.partitions] == [
        ("TestNpu_0", "TestNpuExecutionProvider", (0,)),
        ("CPU_0", "CPUExecutionProvider", (1,)),
        ("TestNpu_1", "TestNpuExecutionProvider", (2,)),
    ]
    assert plan.partitions[0].outputs == ["a"]
    assert plan.partitions[2].inputs == ["a", "b"] and plan.partitions[2].outputs == ["c"]
    assert plan.reasons == {"B": {"TestNpuExecutionProvider": "not in the test subset"}}
    assert_valid_plan(graph, plan)
    x = np.array([[-1, 2], [3, -4]], np.float32)
    compiled = compile_plan(plan, [npu])
    (out,) = PlanExecutor(graph, plan, compiled).run({"x": x})
    (want,) = ort.InferenceSession(diamond().SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert npu.log == ["TestNpu_0", "TestNpu_1"]


def test_convex_group_stays_whole_and_cpu_nodes_merge_across_branches():
    # x -> A -> B -> C (npu, one chain), x -> D, x -> E (cpu, independent): one partition each.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Neg", ["a"], ["b"], name="B"),
        helper.make_node("Tanh", ["b"], ["c"], name="C"),
        helper.make_node("Sigmoid", ["x"], ["d"], name="D"),
        helper.make_node("Neg", ["x"], ["e"], name="E"),
    ]
    graph = GraphView.from_model(_model(nodes, [_vi("x")], [_vi(n, None) for n in "cde"]))
    plan = partition(graph, [SubsetEP("TestNpuExecutionProvider", {"A", "B", "C"})])
    assert [(p.name, sorted(graph.names[i] for i in p.nodes)) for p in plan.partitions] == [
        ("TestNpu_0", ["A", "B", "C"]),
        ("CPU_0", ["D", "E"]),
    ]
    assert plan.partitions[0].outputs == ["c"]
    assert plan.partitions[1].outputs == ["d", "e"]


def test_first_come_first_served_and_already_assigned_nodes_are_dropped():
    graph = GraphView.from_model(diamond())
    first = SubsetEP("FirstExecutionProvider", {"A"})
    greedy = SubsetEP("GreedyExecutionProvider", {"A", "B", "C"})
    # Ignores graph.assigned, as a careless EP might: its claim on A must not count.
    greedy.get_capability = lambda g: [ComputeCapability((0, 1, 2))]
    plan = partition(graph, [first, greedy])
    assert plan.assignment == {"A": "FirstExecutionProvider", "B": "GreedyExecutionProvider",
                               "C": "GreedyExecutionProvider"}
    assert [p.name for p in plan.partitions] == ["First_0", "Greedy_0"]
    assert_valid_plan(graph, plan)


def test_cpu_in_the_list_is_asked_last_and_providers_see_assigned_nodes():
    graph = GraphView.from_model(diamond())
    seen: list[frozenset[int]] = []
    npu = SubsetEP("TestNpuExecutionProvider", {"B"})
    original = npu.get_capability
    npu.get_capability = lambda g: (seen.append(g.assigned), original(g))[1]
    plan = partition(graph, [CPUExecutionProvider(), npu])
    assert seen == [frozenset()]
    assert plan.assignment["B"] == "TestNpuExecutionProvider"
    assert plan.assignment["A"] == plan.assignment["C"] == "CPUExecutionProvider"
    assert [p.name for p in plan.partitions] == ["CPU_0", "TestNpu_0", "CPU_1"]


def test_bad_capability_index_and_duplicate_providers_are_typed_errors():
    graph = GraphView.from_model(diamond())
    bad = SubsetEP("BadExecutionProvider", set())
    bad.get_capability = lambda g: [ComputeCapability((0, 7))]
    with pytest.raises(EPFail, match="BadExecutionProvider.*7.*0..2"):
        partition(graph, [bad])
    with pytest.raises(InvalidArgument, match="more than once"):
        partition(graph, [SubsetEP("XExecutionProvider", set()),
                          SubsetEP("XExecutionProvider", set())])


def test_fused_node_is_a_typed_standalone_graph_with_only_its_initializers():
    w1 = numpy_helper.from_array(np.ones((2, 2), np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((2, 2), 2, np.float32), "w2")
    nodes = [
        helper.make_node("Add", ["x", "w1"], ["a"], name="A"),
        helper.make_node("Mul", ["a", "w2"], ["b"], name="B"),
        helper.make_node("Relu", ["b"], ["c"], name="C"),
    ]
    graph = GraphView.from_model(_model(nodes, [_vi("x")], [_vi("c", None)], inits=[w1, w2]))
    plan = partition(graph, [SubsetEP("TestNpuExecutionProvider", {"B", "C"})])
    cpu_part, npu_part = plan.partitions
    assert npu_part.inputs == ["a"] and npu_part.outputs == ["c"]
    fused = plan.fused_node(npu_part)
    assert fused.name == "TestNpu_0" and fused.source_nodes == (1, 2)
    assert [t.name for t in fused.graph.initializer] == ["w2"]
    assert [n.name for n in fused.graph.node] == ["B", "C"]
    [inp] = fused.graph.input
    assert inp.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [2, 2]
    model = helper.make_model(fused.graph, opset_imports=fused.opset_imports, ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    assert [t.name for t in plan.fused_node(cpu_part).graph.initializer] == ["w1"]


def test_fused_node_references_the_sessions_weights_without_copying_them():
    big = np.arange(1024, dtype=np.float32).reshape(32, 32)
    w = numpy_helper.from_array(big, "w")
    small = numpy_helper.from_array(np.ones(32, np.float32), "s")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="A"),
             helper.make_node("Add", ["a", "s"], ["b"], name="B")]
    model = _model(nodes, [_vi("x", [2, 32])], [_vi("b", None)], inits=[w, small])
    weights = check_model_tensors(model)
    assert list(weights) == ["w"] and np.array_equal(weights["w"], big)
    graph = GraphView.from_model(model, owned=True, weights=weights)
    assert graph.weight("w") is weights["w"] and graph.constant("w") is weights["w"]
    assert graph.weight("s") is None and np.array_equal(graph.constant("s"), np.ones(32))
    plan = partition(graph, [SubsetEP("TestNpuExecutionProvider", {"A", "B"})])
    fused = plan.fused_node(plan.partitions[0])
    assert not fused.body.initializer  # nothing copied until an EP asks for the graph
    assert fused.initializers["w"] is graph.initializers["w"]
    assert fused.values["w"] is weights["w"] and "s" not in fused.values
    assert [t.name for t in fused.graph.initializer] == ["w", "s"]
    assert np.array_equal(numpy_helper.to_array(fused.graph.initializer[0]), big)


def test_a_weight_value_of_another_type_or_shape_is_not_taken():
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="A")]
    model = _model(nodes, [_vi("x", [16, 16])], [_vi("y", None)], inits=[w])
    stale = {"w": np.zeros((16, 8), np.float32)}  # as if the tensor had been replaced since
    graph = GraphView.from_model(model, weights=stale)
    assert graph.weight("w") is None
    assert np.array_equal(graph.constant("w"), np.ones((16, 16), np.float32))


def test_executor_frees_intermediates_after_their_last_consumer():
    graph = GraphView.from_model(diamond())
    npu = SubsetEP("TestNpuExecutionProvider", {"A"})
    plan = partition(graph, [npu])  # A | B, C on CPU
    compiled = compile_plan(plan, [npu])
    refs: dict[str, weakref.ref] = {}
    alive_during_last: list[bool] = []

    class Spy(CompiledNode):
        def __init__(self, inner: CompiledNode) -> None:
            self.name, self.inner = inner.name, inner

        def run(self, inputs):
            if self.name == "CPU_0":
                gc.collect()
                alive_during_last.append(refs["x"]() is not None)
            outs = self.inner.run(inputs)
            if self.name == "TestNpu_0":
                refs["a"] = weakref.ref(outs[0])
            return outs

    x = np.ones((2, 2), np.float32)
    refs["x"] = weakref.ref(x)
    spied = {k: Spy(v) for k, v in compiled.items()}
    (out,) = PlanExecutor(graph, plan, spied).run({"x": x})
    del x
    gc.collect()
    assert alive_during_last == [True]  # the caller still holds its feed
    assert refs["a"]() is None  # the NPU partition's output was dropped once CPU_0 ran
    assert out.shape == (2, 2)


def test_executor_rejects_bad_feeds_and_outputs():
    graph = GraphView.from_model(diamond())
    plan = partition(graph, [])
    executor = PlanExecutor(graph, plan, compile_plan(plan, []))
    x = np.ones((2, 2), np.float32)
    # The executor is where session feeds are checked, with onnxruntime's messages.
    with pytest.raises(ValueError, match=r"Required inputs \(\['x'\]\) are missing"):
        executor.run({})
    with pytest.raises(InvalidArgument, match="Invalid input name: y"):
        executor.run({"x": x, "y": x})
    with pytest.raises(InvalidArgument, match="Invalid output name:a"):
        executor.run({"x": x}, ["a"])
    with pytest.raises(InvalidArgument,
                       match=r"Actual: \(tensor\(double\)\) , expected: \(tensor\(float\)\)"):
        executor.run({"x": x.astype(np.float64)})
    with pytest.raises(InvalidArgument, match="invalid dimensions for input: x"):
        executor.run({"x": np.ones((2, 3), np.float32)})
    with pytest.raises(InvalidArgument, match="no compiled node"):
        PlanExecutor(graph, plan, {})


def test_cpu_provider_threads_from_session_config_and_bad_values():
    graph = GraphView.from_model(diamond())
    plan = partition(graph, [])
    fused = [plan.fused_node(p) for p in plan.partitions]
    cpu = CPUExecutionProvider(ProviderContext(session_config={
        "session.intra_op.num_threads": "1"}))
    [node] = cpu.compile(fused)
    assert node._session.get_session_options().intra_op_num_threads == 1
    bad = CPUExecutionProvider(ProviderContext(provider_options={"intra_op_num_threads": "x"}))
    with pytest.raises(InvalidArgument, match="intra_op_num_threads='x'"):
        bad.compile(fused)


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.data())
def test_random_dags_partition_acyclic_and_compute_what_onnxruntime_computes(model, data):
    graph = GraphView.from_model(model)
    names = sorted(graph.names)
    first = set(data.draw(st.lists(st.sampled_from(names), unique=True), label="first"))
    second = set(data.draw(st.lists(st.sampled_from(names), unique=True), label="second"))
    providers = [
        SubsetEP("FirstExecutionProvider", first, one_group=data.draw(st.booleans())),
        SubsetEP("SecondExecutionProvider", second, one_group=data.draw(st.booleans())),
    ]
    plan = partition(graph, providers)
    assert_valid_plan(graph, plan)
    for name in names:
        expected = (
            "FirstExecutionProvider" if name in first
            else "SecondExecutionProvider" if name in second
            else "CPUExecutionProvider"
        )
        assert plan.assignment[name] == expected
    feeds = random_feeds(model)
    got = PlanExecutor(graph, plan, compile_plan(plan, providers)).run(feeds)
    want = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    assert len(got) == len(want) == len(graph.outputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _acyclic_after_merge(graph: GraphView, cluster_of: dict[int, int], a: int, b: int) -> bool:
    """Brute force: is the cluster graph acyclic once clusters ``a`` and ``b`` are one?"""
    label = {i: (a if c == b else c) for i, c in cluster_of.items()}
    succ: dict[int, set[int]] = {c: set() for c in label.values()}
    for i in range(len(graph.nodes)):
        for name in graph.node_inputs(i):
            p = graph.producer(name)
            if p is not None and label[p] != label[i]:
                succ[label[p]].add(label[i])
    pending = {c: 0 for c in succ}
    for targets in succ.values():
        for t in targets:
            pending[t] += 1
    ready = [c for c, n in pending.items() if n == 0]
    done = 0
    while ready:
        c = ready.pop()
        done += 1
        for t in succ[c]:
            pending[t] -= 1
            if pending[t] == 0:
                ready.append(t)
    return done == len(succ)


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=9), st.data())
def test_merge_rule_matches_brute_force_cycle_check(model, data):
    from ep.framework.partitioner import _Quotient

    graph = GraphView.from_model(model)
    quotient = _Quotient(graph)
    n = len(graph.nodes)
    for _ in range(data.draw(st.integers(0, 2 * n), label="merges")):
        roots = sorted(quotient.members)
        if len(roots) < 2:
            break
        a, b = data.draw(st.lists(st.sampled_from(roots), min_size=2, max_size=2, unique=True))
        cluster_of = {i: r for r in roots for i in quotient.members[r]}
        expected = _acyclic_after_merge(graph, cluster_of, a, b)
        assert quotient.can_merge(a, b) == quotient.can_merge(b, a) == expected
        if expected:
            quotient.merge(a, b)
    # The incrementally kept reach sets equal reachability recomputed from scratch.
    for r in quotient.members:
        seen, stack = set(), list(quotient.succ[r])
        while stack:
            c = stack.pop()
            if c not in seen:
                seen.add(c)
                stack.extend(quotient.succ[c])
        bits = sum(1 << i for c in seen for i in quotient.members[c])
        assert quotient.reach[r] == bits
