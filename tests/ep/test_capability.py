"""The NPU support table: decline reasons users can act on, and whole-model coverage."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from ep.framework.graph import GraphView
from ep.framework.partitioner import partition
from ep.npusim.capability import SUPPORT_TABLE, check_node, get_npu_capability
from tests.ep.graphgen import random_dags

RESNET = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx")


def _view(nodes, inputs, outputs=None, inits=(), opset=17, overrides=None):
    outputs = outputs or [helper.make_tensor_value_info(nodes[-1].output[0], 0, None)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return GraphView.from_model(model, dim_overrides=overrides)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _resize(mode: str) -> GraphView:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, name="up")
    return _view([node], [_vi("x", [1, 1, 2, 2])],
                 inits=[_const("scales", [1, 1, 2, 2], np.float32)])


def test_resize_cubic_is_declined_nearest_and_linear_are_supported():
    assert check_node(_resize("cubic"), 0) == (
        "Resize: mode=cubic not supported; supported: nearest, linear"
    )
    assert check_node(_resize("nearest"), 0) is None
    assert check_node(_resize("linear"), 0) is None


def test_dynamic_dimension_is_declined_until_overridden():
    node = helper.make_node("Relu", ["x"], ["y"])
    reason = check_node(_view([node], [_vi("x", ["batch", 4])]), 0)
    assert reason == ("Relu: dynamic dimension 'batch' on input 'x'; set a dim override "
                      "(add_free_dimension_override_by_name, npu-sim --dim batch=VALUE)")
    assert check_node(_view([node], [_vi("x", ["batch", 4])], overrides={"batch": 2}), 0) is None
    unknown_rank = check_node(_view([node], [_vi("x", None)]), 0)
    assert unknown_rank is not None and unknown_rank.startswith("Relu: unknown shape of input 'x'")
    # A dimension shape inference could not work out (it invents 'unk__N') is "unknown".
    nonzero = helper.make_node("NonZero", ["x"], ["nz"])
    after = helper.make_node("Cast", ["nz"], ["y"], to=TensorProto.INT64)
    view = _view([nonzero, after], [_vi("x", [4])])
    assert view.tensor_type("nz")[1][1].startswith("unk__")
    assert check_node(view, 1) == "Cast: unknown dimension 1 on input 'nz'"


def test_reshape_shape_must_be_constant():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    runtime = _view([node], [_vi("x", [2, 3]), _vi("shape", [2], TensorProto.INT64)])
    # y's shape is unknown too, but the runtime shape input is the cause, so it is the reason.
    assert check_node(runtime, 0) == (
        "Reshape: input 'shape' must be constant (an initializer or Constant output)"
    )
    from_init = _view([node], [_vi("x", [2, 3])], inits=[_const("shape", [3, 2])])
    assert check_node(from_init, 0) is None
    from_constant_node = _view(
        [helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]), node], [_vi("x", [2, 3])]
    )
    assert check_node(from_constant_node, 1) is None


def test_unknown_op_lists_what_is_supported():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])
    view = _view([node], [_vi("boxes", [1, 4, 4]), _vi("scores", [1, 1, 4])])
    reason = check_node(view, 0)
    assert reason.startswith("NonMaxSuppression: not supported by the NPU; supported: ")
    listed = reason.split("supported: ", 1)[1].split(", ")
    assert listed == sorted(SUPPORT_TABLE) and "Conv" in listed


def test_op_of_another_domain_is_not_taken_for_the_default_domain_op():
    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    assert "not supported by the NPU" in check_node(GraphView.from_model(model), 0)


def test_opset_out_of_range():
    # Reshape-1 (opset < 5) took the shape as an attribute; the NPU implements Reshape-5 on.
    node = helper.make_node("Reshape", ["x"], ["y"], shape=[3, 2])
    view = _view([node], [_vi("x", [2, 3])], outputs=[_vi("y", [3, 2])], opset=4)
    assert check_node(view, 0) == "Reshape: opset 4 not supported; supported opsets 5..23"
    gelu = _view([helper.make_node("Gelu", ["x"], ["y"])], [_vi("x", [2])], opset=19)
    assert check_node(gelu, 0).startswith("Gelu: opset 19 not supported")


def test_dtype_outside_the_table_is_declined():
    view = _view([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2], TensorProto.DOUBLE)])
    assert check_node(view, 0) == (
        "Relu: dtype float64 of input 'x' not supported; supported: "
        "float32, float16, bfloat16, int8, int32, int64"
    )
    ints = _view([helper.make_node("Sigmoid", ["x"], ["y"])], [_vi("x", [2], TensorProto.INT32)])
    assert "dtype int32" in check_node(ints, 0)


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (helper.make_node("Slice", ["x", "s", "e"], ["y"]), "input 'starts' must be constant"),
        (helper.make_node("Unsqueeze", ["x", "s"], ["y"]), "input 'axes' must be constant"),
        (helper.make_node("ReduceSum", ["x", "s"], ["y"]), "input 'axes' must be constant"),
        (helper.make_node("Clip", ["x", "s"], ["y"]), "input 'min' must be constant"),
    ],
)
def test_other_inputs_that_must_be_constant(node, reason):
    inputs = [_vi("x", [2, 2]), _vi("s", [1], TensorProto.INT64)]
    elem = TensorProto.FLOAT
    if node.op_type == "Clip":
        inputs[1] = _vi("s", [], TensorProto.FLOAT)
    inits = [_const("e", [1])]
    out_shape = {"Slice": [1, 2], "Unsqueeze": [1, 2, 2], "ReduceSum": [1, 2], "Clip": [2, 2]}
    view = _view([node], inputs, outputs=[_vi("y", out_shape[node.op_type], elem)], inits=inits)
    assert check_node(view, 0) == f"{node.op_type}: {reason} (an initializer or Constant output)"


def test_capability_groups_connected_supported_nodes_and_skips_assigned():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Resize", ["a", "", "scales"], ["b"], mode="cubic", name="B"),
        helper.make_node("Sigmoid", ["b"], ["c"], name="C"),
        helper.make_node("Neg", ["c"], ["d"], name="D"),
        helper.make_node("Tanh", ["x"], ["e"], name="E"),
    ]
    outputs = [_vi("d", None, 0), _vi("e", None, 0)]
    view = _view(nodes, [_vi("x", [1, 1, 2, 2])], outputs=outputs,
                 inits=[_const("scales", [1, 1, 2, 2], np.float32)])
    caps, reasons = get_npu_capability(view)
    # Edges join nodes; A and E only share the graph input x, so they stay apart.
    assert [c.nodes for c in caps] == [(0,), (2, 3), (4,)]
    assert reasons == {1: "Resize: mode=cubic not supported; supported: nearest, linear"}
    caps, reasons = get_npu_capability(view, assigned={3})
    assert [c.nodes for c in caps] == [(0,), (2,), (4,)] and 3 not in reasons
    caps, _ = get_npu_capability(view.with_assigned({0}))
    assert [c.nodes for c in caps] == [(2, 3), (4,)]


def test_light_resnet50_is_supported_whole():
    view = GraphView.from_model(onnx.load(RESNET))
    caps, reasons = get_npu_capability(view)
    assert reasons == {}
    assert sorted(i for c in caps for i in c.nodes) == list(range(len(view.nodes)))
    assert len(view.nodes) > 400


class _TableEP:
    """A minimal NPU-like EP over the support table, for the partitioning property below."""

    type = "NpuSimExecutionProvider"

    def get_capability(self, graph):
        return get_npu_capability(graph)[0]

    def decline_reasons(self, graph):
        return get_npu_capability(graph)[1]


@settings(max_examples=25, deadline=None)
@given(random_dags())
def test_random_dags_are_fully_supported_and_form_one_acyclic_plan(model):
    view = GraphView.from_model(model)
    caps, reasons = get_npu_capability(view)
    assert reasons == {}
    plan = partition(view, [_TableEP()])
    assert set(plan.assignment.values()) == {"NpuSimExecutionProvider"}
    assert sum(len(p.nodes) for p in plan.partitions) == len(view.nodes)


def test_nodes_downstream_of_a_pool_onnxruntime_shapes_differently_are_declined():
    # ceil_mode with a window starting in the end padding: ONNX shape inference says 4x4,
    # onnxruntime produces 3x3 (tests/ep/test_silent_differences.py); everything fed from the
    # pool, directly or not, would be compiled for the 4x4 it never receives.
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="before"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              pads=[1, 1, 1, 1], ceil_mode=1, name="pool"),
             helper.make_node("Relu", ["p"], ["q"], name="after"),
             helper.make_node("Sigmoid", ["q"], ["y"], name="later"),
             helper.make_node("Relu", ["x"], ["z"], name="beside")]
    view = _view(nodes, [_vi("x", [1, 1, 5, 5])],
                 [helper.make_tensor_value_info(o, 0, None) for o in ("y", "z")])
    caps, reasons = get_npu_capability(view)
    assert sorted(i for c in caps for i in c.nodes) == [0, 4]
    assert "ceil_mode" in reasons[1] and "disagree" in reasons[1]
    for i, tensor in ((2, "p"), (3, "q")):
        assert reasons[i].startswith(f"{nodes[i].op_type}: the shape of input '{tensor}' "
                                     f"depends on MaxPool 'pool', for which ")


def test_a_pool_both_agree_on_declines_nothing_downstream():
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              ceil_mode=1, name="pool"),
             helper.make_node("Relu", ["p"], ["y"], name="after")]
    caps, reasons = get_npu_capability(_view(nodes, [_vi("x", [1, 1, 6, 6])]))
    assert reasons == {} and [c.nodes for c in caps] == [(0, 1)]
