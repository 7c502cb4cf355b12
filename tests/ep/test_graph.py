"""GraphView: topological order, names, inferred types, attributes, constants, bad graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from ep.errors import InvalidGraph
from ep.framework.graph import GraphView
from tests.ep.graphgen import random_dags


def _model(nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits),
                              value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_nodes_are_sorted_topologically_and_stably():
    # b reads a's output but is listed first; c is independent and keeps its place after b.
    nodes = [
        helper.make_node("Relu", ["a_out"], ["b_out"], name="b"),
        helper.make_node("Neg", ["x"], ["c_out"], name="c"),
        helper.make_node("Sigmoid", ["x"], ["a_out"], name="a"),
    ]
    view = GraphView.from_model(_model(nodes, [_vi("x", [2])], [_vi("b_out", None)]))
    assert view.names == ["c", "a", "b"]
    assert [n.name for n in view.graph.node] == ["c", "a", "b"]
    assert view.producer("a_out") == 1
    assert view.consumers("x") == [0, 1]
    assert view.consumers("a_out") == [2]
    assert view.producer("x") is None


def test_unnamed_and_duplicate_names_become_unique():
    nodes = [
        helper.make_node("Relu", ["x"], ["y1"]),
        helper.make_node("Relu", ["y1"], ["y2"], name="r"),
        helper.make_node("Relu", ["y2"], ["y3"], name="r"),
        helper.make_node("Relu", ["y3"], ["y4"], name="Relu_3"),
    ]
    view = GraphView.from_model(_model(nodes, [_vi("x", [2])], [_vi("y4", None)]))
    assert view.names[0] == "Relu_0"
    assert view.names[1] == "r"
    assert len(set(view.names)) == 4
    assert view.names[3] == "Relu_3"
    assert [n.name for n in view.nodes] == view.names


def test_types_from_inference_with_symbolic_and_overridden_dims():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT16),
    ]
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    model = _model(nodes, [_vi("x", ["batch", 4])], [_vi("z", None, 0)], inits=[w])
    view = GraphView.from_model(model)
    assert view.tensor_type("x") == ("float32", ("batch", 4))
    assert view.tensor_type("y") == ("float32", ("batch", 5))
    assert view.tensor_type("z") == ("float16", ("batch", 5))
    assert view.tensor_type("w") == ("float32", (4, 5))
    assert view.tensor_type("nonexistent") == (None, None)
    assert view.inputs == ["x"] and view.outputs == ["z"]
    fixed = GraphView.from_model(model, dim_overrides={"batch": 8})
    assert fixed.tensor_type("x") == ("float32", (8, 4))
    assert fixed.tensor_type("z") == ("float16", (8, 5))
    # The caller's model is not modified.
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    with pytest.raises(InvalidGraph, match="batch"):
        GraphView.from_model(model, dim_overrides={"batch": -1})


def test_types_through_a_model_function_and_declared_ones_of_contrib_nodes(monkeypatch):
    # A node of a model-local function is inferred through the function's body; a node ONNX
    # has no schema for (an EPContext node) keeps the types its model declares.
    body = [helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Flatten", ["b"], ["c"])]
    fn = helper.make_function("my", "ReluFlat", ["a"], ["c"], body,
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("ReluFlat", ["x"], ["y"], domain="my")], "g",
                              [_vi("x", [2, 3, 4])], [_vi("y", None, 0)])
    model = helper.make_model(graph, functions=[fn], ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("my", 1)])
    assert GraphView.from_model(model).tensor_type("y") == ("float32", (2, 12))
    inferred = []  # from here on: which models ONNX's inference is asked about
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda m, **kw: inferred.append(m) or real(m, **kw))
    GraphView.from_model(model)
    assert len(inferred) == 1  # the function's body is inferable
    contrib = helper.make_graph(
        [helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", embed_mode=1,
                          ep_cache_context="")], "g", [_vi("x", [2, 3])], [_vi("y", [6])],
        value_info=[_vi("x", [2, 3])])
    view = GraphView.from_model(helper.make_model(contrib, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]))
    assert view.tensor_type("y") == ("float32", (6,))
    assert view.tensor_type("x") == ("float32", (2, 3))
    assert len(inferred) == 1  # nothing to infer in the contrib node: ONNX was not asked


def test_unknown_rank_is_none_and_non_device_dtype_is_none():
    nodes = [helper.make_node("Identity", ["s"], ["t"]), helper.make_node("Relu", ["f"], ["g"])]
    inputs = [_vi("s", [2], TensorProto.STRING), _vi("f", None)]
    view = GraphView.from_model(_model(nodes, inputs, [_vi("t", None, 0), _vi("g", None, 0)]))
    assert view.tensor_type("s") == (None, (2,))
    assert view.tensor_type("t") == (None, (2,))
    assert view.tensor_type("f") == ("float32", None)
    assert view.tensor_type("g") == ("float32", None)


def test_data_propagation_makes_reshape_shapes_static():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["y", "s"], ["z"]),
    ]
    model = _model(nodes, [_vi("x", [2, 3]), _vi("y", [6])], [_vi("z", None)])
    assert GraphView.from_model(model).tensor_type("z") == ("float32", (2, 3))


def test_attrs_are_plain_python():
    t = numpy_helper.from_array(np.array([1.5, 2.5], np.float32))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=t),
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], auto_pad="NOTSET",
                         strides=[1, 1]),
        helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.25),
        helper.make_node("Constant", [], ["s"], value_strings=["a", "b"]),
    ]
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    view = GraphView.from_model(
        _model(nodes, [_vi("x", [1, 1, 2, 2])], [_vi("z", None), _vi("c", None)], inits=[w])
    )
    by_name = dict(zip([n.op_type + str(i) for i, n in enumerate(view.nodes)], range(4),
                       strict=True))
    conv = view.attrs(by_name["Conv1"])
    assert conv == {"kernel_shape": (1, 1), "auto_pad": "NOTSET", "strides": (1, 1)}
    assert view.attrs(by_name["LeakyRelu2"]) == {"alpha": 0.25}
    assert view.attrs(by_name["Constant3"]) == {"value_strings": ("a", "b")}
    value = view.attrs(by_name["Constant0"])["value"]
    assert isinstance(value, np.ndarray) and value.tolist() == [1.5, 2.5]


def test_constants_from_initializers_and_constant_nodes():
    nodes = [
        helper.make_node("Constant", [], ["c"], value_ints=[2, 3]),
        helper.make_node("Constant", [], ["f"], value_float=0.5),
        helper.make_node("Reshape", ["x", "c"], ["y"]),
        helper.make_node("Add", ["y", "b"], ["z"]),
    ]
    b = numpy_helper.from_array(np.full((2, 3), 7, np.float32), "b")
    view = GraphView.from_model(_model(nodes, [_vi("x", [6])], [_vi("z", None)], inits=[b]))
    assert view.constant("c").tolist() == [2, 3] and view.constant("c").dtype == np.int64
    assert view.constant("f") == np.float32(0.5)
    assert view.constant("b").shape == (2, 3) and (view.constant("b") == 7).all()
    assert view.constant("x") is None and view.constant("y") is None
    assert view.initializers.keys() == {"b"}


def test_opset_lookup():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1])], [_vi("y", None)],
                   opset=13)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    view = GraphView.from_model(model)
    assert view.opset() == 13 and view.opset("ai.onnx") == 13
    assert view.opset("com.microsoft") == 1
    assert view.opset("org.example") == 0


def test_cycle_is_invalid_graph_naming_the_nodes():
    nodes = [
        helper.make_node("Add", ["x", "b_out"], ["a_out"], name="A"),
        helper.make_node("Relu", ["a_out"], ["b_out"], name="B"),
    ]
    model = _model(nodes, [_vi("x", [2])], [_vi("a_out", [2])])
    with pytest.raises(InvalidGraph, match="cycle") as info:
        GraphView.from_model(model)
    assert "'A'" in str(info.value) and "'B'" in str(info.value)
    assert info.value.code == 10


def test_missing_input_is_invalid_graph_naming_node_and_tensor():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    with pytest.raises(InvalidGraph, match="'adder'.*'ghost'"):
        GraphView.from_model(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_tensor_produced_twice_is_invalid_graph():
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="one"),
        helper.make_node("Neg", ["x"], ["y"], name="two"),
    ]
    with pytest.raises(InvalidGraph, match="'y'.*'two'.*'one'"):
        GraphView.from_model(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))


def test_subgraph_outer_scope_reads_order_the_node_after_the_producer():
    then_out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])
    then_graph = helper.make_graph([helper.make_node("Identity", ["outer"], ["o"])], "then",
                                   [], [then_out])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else",
                                   [], [then_out])
    nodes = [
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph,
                         name="if"),
        helper.make_node("Relu", ["x"], ["outer"], name="producer"),
    ]
    model = _model(nodes, [_vi("x", [2]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", None)])
    view = GraphView.from_model(model)
    assert view.names == ["producer", "if"]
    assert set(view.node_inputs(1)) == {"cond", "outer", "x"}
    assert view.consumers("outer") == [1]


@settings(max_examples=30)
@given(random_dags())
def test_random_dags_sort_so_every_input_is_produced_earlier(model: onnx.ModelProto):
    view = GraphView.from_model(model)
    assert sorted(view.names) == sorted(set(view.names))
    assert len(view.nodes) == len(model.graph.node)
    for i, node in enumerate(view.nodes):
        for name in node.input:
            p = view.producer(name)
            assert p is None or p < i
            assert i in view.consumers(name)
        for name in node.output:
            assert view.producer(name) == i
            assert view.tensor_type(name)[0] == "float32"
