"""The operator catalogue (ep/npusim/ops) agrees with the device and with every table derived
from it: each supported op has a kernel, a price and a lowering, and the device has no kernel
the catalogue does not offer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.graph import GraphView
from ep.npusim import ops
from ep.npusim.capability import SUPPORT_TABLE, check_node
from ep.npusim.compiler import compile_subgraph
from ep.npusim.compiler.ir import SubGraph
from ep.npusim.ops import CatalogueError, Fusion, Lowering, Op, Tiling
from ep.npusim.ops.__main__ import main, render
from ep.testing import assert_matches_onnxruntime
from npu_sim import DeviceConfig
from npu_sim import kernels as npu_kernels
from npu_sim.cost import KNOWN_OPS, op_cost
from npu_sim.cost.array_ops import ARRAY_OPS
from npu_sim.cost.vector_ops import ELEMENTWISE, VIEWS
from npu_sim.dtypes import TensorSpec
from npu_sim.kernels.activations import ACTIVATIONS

ENTRIES = ops.entries()
NPU = "NpuSimExecutionProvider"


@pytest.mark.parametrize("op", sorted(SUPPORT_TABLE))
def test_every_supported_op_has_a_kernel_a_price_and_a_lowering(op):
    entry = ENTRIES[op]
    assert isinstance(entry.lowering, Lowering) and isinstance(entry.tiling, Tiling)
    if entry.lowering is Lowering.FOLD:
        assert entry.kernel is None
        return
    kernel = npu_kernels.lookup(entry.kernel)
    assert kernel.cycles is not None or entry.kernel in KNOWN_OPS


def test_every_kernel_the_device_has_is_offered_by_the_catalogue():
    assert set(npu_kernels.names()) == {e.kernel for e in ENTRIES.values() if e.kernel}


@pytest.mark.parametrize("op", sorted(op for op, s in SUPPORT_TABLE.items() if s.check))
def test_every_check_says_what_it_requires(op):
    # its first docstring line is the "checks" column of docs/operators.md
    assert (SUPPORT_TABLE[op].check.__doc__ or "").strip()


def test_support_table_is_the_catalogues():
    assert set(SUPPORT_TABLE) == set(ENTRIES)
    assert all(SUPPORT_TABLE[op] is e.support for op, e in ENTRIES.items())


def test_the_operator_table_in_the_docs_is_the_catalogues(tmp_path):
    doc = Path(__file__).resolve().parents[2] / "docs" / "operators.md"
    assert doc.read_text() == render(), "docs/operators.md is stale: python -m ep.npusim.ops"
    assert main(["--check", "--doc", str(doc)]) == 0
    assert main(["--check", "--doc", str(tmp_path / "missing.md")]) == 1
    assert main(["--doc", str(tmp_path / "operators.md")]) == 0
    assert (tmp_path / "operators.md").read_text() == render()


def test_ops_priced_on_the_array_are_exactly_those_tiled_as_gemms():
    tiled = ops.ops_where(tiling=Tiling.GEMM) | ops.ops_where(tiling=Tiling.CONV)
    assert tiled == set(ARRAY_OPS)


def test_views_are_priced_as_views():
    assert ops.ops_where(lowering=Lowering.VIEW) == VIEWS


def test_fused_activations_are_applied_by_the_kernels_and_priced():
    fused = ops.ops_where(fusion=Fusion.ACTIVATION)
    assert fused == set(ACTIVATIONS) and fused <= set(ELEMENTWISE)
    assert ops.ops_where(fusion=Fusion.HOST) <= set(ARRAY_OPS)


@pytest.mark.parametrize("op", sorted(ops.ops_where(lowering=Lowering.FOLD)))
def test_folded_ops_never_launch(op):
    if op == "Constant":
        node = helper.make_node("Constant", [], ["c"],
                                value=numpy_helper.from_array(np.ones((2, 3), np.float32)))
        inits = []
    else:
        node = helper.make_node("ConstantOfShape", ["s"], ["c"],
                                value=numpy_helper.from_array(np.ones(1, np.float32)))
        inits = [numpy_helper.from_array(np.array([2, 3], np.int64), "s")]
    graph = helper.make_graph([node, helper.make_node("Add", ["x", "c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))],
                              initializer=inits)
    sub = SubGraph.from_fused(graph, [helper.make_opsetid("", 17)])
    compiled = compile_subgraph(sub, DeviceConfig.preset("npu-s"), name="p")
    assert [launch.op for launch in compiled.program.launches] == ["Add"]


def test_an_entry_without_a_kernel_or_twice_is_refused_at_registration():
    with pytest.raises(CatalogueError, match="no kernel 'Softplus' in npu_sim.kernels"):
        ops.register("Softplus", since=1)(type("Softplus", (Op,), {}))
    with pytest.raises(CatalogueError, match="Relu: already in the operator catalogue"):
        ops.register("Relu", since=6)(type("Relu", (Op,), {}))
    assert "Softplus" not in ops.entries()
    with pytest.raises(CatalogueError, match="catalogued: .*Conv"):
        ops.entry("Softplus")


def test_the_compiler_refuses_to_lower_an_op_outside_the_catalogue():
    graph = helper.make_graph([helper.make_node("Softplus", ["x"], ["y"], name="sp")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))])
    sub = SubGraph.from_fused(graph, [helper.make_opsetid("", 17)])
    with pytest.raises(ep.errors.NotImplemented, match="'sp' is Softplus, which is not in"):
        compile_subgraph(sub, DeviceConfig.preset("npu-s"), name="p")


def test_a_kernel_and_one_entry_are_all_an_op_needs_to_run_on_the_npu():
    def softplus(inputs, attrs):
        return [np.logaddexp(np.float32(0), inputs[0])]

    def cycles(config, in_specs, out_specs, attrs, cores=1):  # priced as one elementwise pass
        return op_cost(config, "Relu", in_specs, out_specs, {}, cores)

    node = helper.make_node("Softplus", ["x"], ["y"], name="n")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.linspace(-20, 20, 10, dtype=np.float32).reshape(2, 5)
    assert ep.InferenceSession(model.SerializeToString()).get_node_assignment()["n"] != NPU
    npu_kernels.register_kernel("Softplus", softplus, cycles=cycles)
    try:
        ops.register("Softplus", since=1)(type("Softplus", (Op,), {}))
        assert "Softplus" in SUPPORT_TABLE and "Softplus" not in ops.ops_where(tiling=Tiling.GEMM)
        session = ep.InferenceSession(model.SerializeToString())
        assert session.get_node_assignment()["n"] == NPU
        assert assert_matches_onnxruntime(model, {"x": x}) is not None
    finally:
        ops.remove("Softplus")
        npu_kernels.unregister_kernel("Softplus")
    assert "Softplus" not in SUPPORT_TABLE


# -- Upsample: had a kernel, but no price and no support row ----------------------------------


def _upsample(opset, mode, shape, scales):
    if opset >= 9:
        node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode, name="n")
        inits = [numpy_helper.from_array(np.array(scales, np.float32), "s")]
    else:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales, name="n")
        inits = []
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize(("mode", "shape", "scales"), [
    ("nearest", (1, 2, 3, 4), [1.0, 1.0, 2.0, 2.0]),
    ("nearest", (2, 2, 3, 4), [2.0, 1.0, 1.5, 2.5]),
    ("linear", (1, 2, 3, 4), [1.0, 1.0, 1.5, 2.5]),
    ("linear", (3, 4), [2.0, 3.0]),
])
def test_upsample_runs_on_the_npu_like_onnxruntime(opset, mode, shape, scales):
    model = _upsample(opset, mode, shape, scales)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = assert_matches_onnxruntime(model, {"x": x})
    assert out is not None
    assert ep.InferenceSession(model.SerializeToString()).get_node_assignment()["n"] == NPU


@pytest.mark.parametrize(("mode", "shape", "scales", "why"), [
    ("nearest", (1, 2, 3, 4), [1.0, 1.0, 0.5, 0.5], "every scale must be >= 1"),
    ("linear", (2, 2, 3, 4), [2.0, 1.0, 2.0, 2.0], "first two scales to be 1"),
])
def test_upsample_onnxruntime_refuses_is_declined_and_refused(mode, shape, scales, why):
    model = _upsample(9, mode, shape, scales)
    x = np.ones(shape, np.float32)
    assert assert_matches_onnxruntime(model, {"x": x}) is None  # both refuse, typed
    assert why in check_node(GraphView.from_model(model), 0)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_is_priced_as_the_resize_it_performs(mode):
    x, out = TensorSpec((2, 8, 6, 6)), TensorSpec((2, 8, 12, 12))
    scales = TensorSpec((4,))
    config = DeviceConfig.preset("npu-m")
    upsample = op_cost(config, "Upsample", [x, scales], [out], {"mode": mode})
    resize = op_cost(config, "Resize", [x, None, scales], [out], {"mode": mode})
    assert upsample.engine == "vector" and upsample.compute_cycles > 0
    assert upsample.compute_cycles == resize.compute_cycles
    # Resize has one more (empty) operand slot but the same bytes: the same total.
    assert upsample.total_cycles == resize.total_cycles
