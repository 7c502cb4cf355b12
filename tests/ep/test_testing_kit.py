"""The testing kit itself: strategies draw what they promise, the comparison catches what it
must (per-dtype tolerances, NaN/Inf, refusals), failures are saved and replay."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.provider import CompiledNode, ComputeCapability, ExecutionProvider
from ep.testing import Mismatch, assert_matches_onnxruntime, reference_crashes, replay
from ep.testing.compare import compare, load_case
from ep.testing.strategies import (
    CONFIG_VARIATIONS,
    KINDS,
    cpu_only_ops,
    device_configs,
    feeds,
    fill,
    models,
    npu_ops,
)
from npu_sim import Device, DeviceConfig


def _ort(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, inputs)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(KINDS), st.data())
def test_models_are_valid_and_run_on_onnxruntime(kind, data):
    model = data.draw(models(kind, dtypes=("float32", "float16")))
    onnx.checker.check_model(model, full_check=True)
    inputs = data.draw(feeds(model))
    outs = _ort(model, inputs)
    declared = [o.type.tensor_type for o in model.graph.output]
    for out, decl in zip(outs, declared, strict=True):
        assert out.dtype == helper.tensor_dtype_to_np_dtype(decl.elem_type)
        assert out.shape == tuple(d.dim_value for d in decl.shape.dim)


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_models_use_only_the_ops_asked_for(data):
    ops = data.draw(st.sets(st.sampled_from(["Relu", "Add", "Mul", "Transpose", "Softmax"]),
                            min_size=1))
    model = data.draw(models("arbitrary", ops=sorted(ops), cpu_ops=("Softplus",)))
    assert {n.op_type for n in model.graph.node} <= ops | {"Softplus"}


def test_cpu_only_ops_are_declined_by_the_npu():
    assert cpu_only_ops() and not set(cpu_only_ops()) & npu_ops()


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_models_shrink_to_a_single_node(data):
    # The smallest draw is one node: what a failing model shrinks towards.
    model = data.draw(models("cnn", min_nodes=1, max_nodes=1))
    assert len(model.graph.node) in (1, 2)  # a family may emit a pair (Flatten + Gemm)


@pytest.mark.parametrize(("kind", "op"), [("arbitrary", "Softmax"), ("cnn", "MaxPool"),
                                          ("transformer", "LayerNormalization")])
def test_a_failing_model_shrinks_to_the_one_node_it_needs(kind, op):
    # hypothesis shrinks a model that "fails" (contains op) to that op alone.
    fails = settings(database=None, derandomize=True, max_examples=500,
                     suppress_health_check=list(HealthCheck))
    model = find(models(kind), lambda m: any(n.op_type == op for n in m.graph.node),
                 settings=fails)
    assert [n.op_type for n in model.graph.node] == [op]


def _transpose_matmul(perm: list[int], dtype: int) -> onnx.ModelProto:
    """Transpose(perm) of a (2, 5, 8)-like input into a MatMul with a constant B."""
    shape = [2, 5, 8, 3][: len(perm)]
    moved = [shape[p] for p in perm]
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("MatMul", ["t", "w"], ["y"])],
        "probe", [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, moved[:-1] + [3])],
        initializer=[numpy_helper.from_array(np.ones((moved[-1], 3), np_dtype), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("perm", "dtype"), [([1, 0, 2], TensorProto.FLOAT16),
                                             ([1, 2, 0], TensorProto.FLOAT16),
                                             ([0, 2, 1], TensorProto.FLOAT16),
                                             ([1, 0, 2], TensorProto.FLOAT)])
def test_the_crash_probe_says_what_the_installed_onnxruntime_does(perm, dtype):
    """The probe's answer against a session made in a child process here (1.32.0 crashes on
    the first two, not on the others)."""
    import subprocess
    import sys

    model = _transpose_matmul(perm, dtype)
    child = subprocess.run(
        [sys.executable, "-c", "import sys, onnxruntime as ort; ort.InferenceSession("
         "sys.stdin.buffer.read(), providers=['CPUExecutionProvider'])"],
        input=model.SerializeToString(), capture_output=True, timeout=120, check=False)
    assert reference_crashes.crashes(model) == (child.returncode < 0)
    assert reference_crashes.suspect(model) == (dtype == TensorProto.FLOAT16)


@pytest.mark.parametrize("crashes", [True, False])
def test_float16_models_leave_out_what_onnxruntime_crashes_on(monkeypatch, crashes):
    """No drawn model is one onnxruntime crashes on: with the probe saying every suspect one
    does, none is drawn; saying none does, they are."""
    monkeypatch.setattr(reference_crashes, "crashes", lambda model: crashes)
    search = settings(database=None, derandomize=True, max_examples=1000,
                      suppress_health_check=list(HealthCheck))
    strategy = models("transformer", ops=["Transpose", "MatMul"], cpu_ops=(),
                      dtypes=("float16",), input_shape=(2, 5, 8))
    if crashes:
        with pytest.raises(NoSuchExample):
            find(strategy, reference_crashes.suspect, settings=search)
    else:
        assert reference_crashes.suspect(find(strategy, reference_crashes.suspect,
                                              settings=search))


def test_fill_styles():
    shape = (4, 5)
    assert not fill("zeros", shape, np.float32, 0).any()
    assert (fill("negative", shape, np.float32, 1) < 0).all()
    assert np.abs(fill("large", shape, np.float32, 2)).max() > 100
    special = fill("special", (20, 20), np.float16, 3)
    assert np.isnan(special).any() and np.isposinf(special).any() and np.isneginf(special).any()
    assert fill("normal", shape, np.float32, 7).dtype == np.float32
    np.testing.assert_array_equal(fill("mixed", shape, np.float32, 9),
                                  fill("mixed", shape, np.float32, 9))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["npu-s", "npu-m", "npu-l", "os32"]), st.data())
def test_device_configs_are_valid_variants_of_the_preset(preset, data):
    config = data.draw(device_configs(preset))
    base = DeviceConfig.preset(preset)
    changed = {k for k, v in config.to_dict().items() if v != base.to_dict()[k]}
    assert changed <= set(CONFIG_VARIATIONS)
    assert DeviceConfig.from_dict(config.to_dict()) == config
    Device(config).malloc(4096)


# -- the comparison -------------------------------------------------------------------------


def test_float32_tolerance_is_rtol_1e4_atol_1e5():
    want = np.array([1.0, 0.0, 1000.0], np.float32)
    assert compare(want + np.float32(1e-4) * want, want) is None
    assert compare(np.array([1.0, 9e-6, 1000.1], np.float32), want) is None
    assert "beyond" in compare(np.array([1.0, 2e-5, 1000.0], np.float32), want)
    assert "beyond" in compare(np.array([1.0002, 0.0, 1000.0], np.float32), want)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_types_allow_one_ulp(dtype):
    want = np.array([1.0, -2.0, 0.0], dtype)
    one_up = want.view(np.uint16).copy()
    one_up[:2] += 1  # one ulp away in magnitude, both signs
    assert compare(one_up.view(dtype), want) is None
    two_up = want.view(np.uint16).copy()
    two_up[1] += 2
    assert "ulp" in compare(two_up.view(dtype), want)
    # -0 and +0 are 0 ulp apart; the smallest subnormals straddling zero are 2 apart.
    assert compare(np.array([-0.0], dtype), np.array([0.0], dtype)) is None
    tiny = np.array([1], np.uint16).view(dtype)
    assert "ulp" in compare(-tiny, tiny)


def test_nan_and_inf_must_match():
    want = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare(want.copy(), want) is None
    assert "NaN/Inf" in compare(np.array([0.0, np.inf, 1.0], np.float32), want)
    assert "NaN/Inf" in compare(np.array([np.nan, -np.inf, 1.0], np.float32), want)
    assert "NaN/Inf" in compare(np.array([np.nan, np.inf, np.nan], np.float32), want)
    assert "NaN/Inf" in compare(np.array([np.nan, 3e38, 1.0], np.float32), want)


def test_integers_exact_and_quantized_within_one_step():
    want = np.array([0, 5, -7], np.int8)
    assert "differ" in compare(np.array([0, 6, -7], np.int8), want)
    assert compare(np.array([1, 6, -8], np.int8), want, quantized=True) is None
    assert "quantization step" in compare(np.array([2, 5, -7], np.int8), want, quantized=True)
    assert "dtype" in compare(want.astype(np.int32), want)
    assert "shape" in compare(want[:2], want)


# -- whole models ---------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class _Numpy(CompiledNode):
    """Relu computed wrong (+0.5); Add and Sub in the inputs' dtype, or in float32 with
    ``wide`` (rounded once at the end); Neg wrong by 2 ulp."""

    def __init__(self, fused, wide: bool) -> None:
        self.name, self.fused, self.wide = fused.name, fused, wide

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        consts = {t.name: numpy_helper.to_array(t) for t in self.fused.graph.initializer}
        env = {**consts, **dict(zip(self.fused.inputs, inputs, strict=True))}
        for node in self.fused.graph.node:
            args = [env[i].astype(np.float32) if self.wide else env[i] for i in node.input]
            if node.op_type == "Relu":
                out = np.maximum(args[0], 0) + np.float32(0.5)
            elif node.op_type == "Neg":
                bits = (-args[0]).view(np.uint16) + np.uint16(2)
                out = bits.view(np.float16)
            else:
                out = args[0] + args[1] if node.op_type == "Add" else args[0] - args[1]
            env[node.output[0]] = out
        return [env[o].astype(inputs[0].dtype) for o in self.fused.outputs]


class _BrokenEP(ExecutionProvider):
    """Takes every Relu, Neg, Add and Sub (see :class:`_Numpy`)."""

    type = "BrokenExecutionProvider"

    def __init__(self, wide: bool = False) -> None:
        super().__init__()
        self.wide = wide

    def get_capability(self, graph):
        take = [i for i, n in enumerate(graph.nodes) if n.op_type in ("Relu", "Neg", "Add",
                                                                        "Sub")]
        return [ComputeCapability(tuple(take))] if take else []

    def compile(self, fused_nodes):
        return [_Numpy(f, self.wide) for f in fused_nodes]


def test_mismatch_is_saved_and_replays(tmp_path, monkeypatch):
    monkeypatch.setenv("EP_TESTING_FAILURES", str(tmp_path))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    inputs = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
    with pytest.raises(Mismatch) as info:
        assert_matches_onnxruntime(model, inputs, providers=[_BrokenEP(),
                                                              "CPUExecutionProvider"])
    folder = info.value.folder
    assert folder.parent == tmp_path and str(folder) in str(info.value)
    assert "output 'y'" in str(info.value) and "whole model" in str(info.value)
    saved, saved_inputs, case = load_case(folder)
    assert saved == model
    np.testing.assert_array_equal(saved_inputs["x"], inputs["x"])
    assert case["providers"] == ["BrokenExecutionProvider", "CPUExecutionProvider"]
    out = onnx.TensorProto()
    out.ParseFromString((folder / "test_data_set_0" / "output_0.pb").read_bytes())
    np.testing.assert_array_equal(numpy_helper.to_array(out), _ort(model, inputs)[0])
    with pytest.raises(Mismatch):
        replay(folder, providers=[_BrokenEP(), "CPUExecutionProvider"])
    assert replay(folder, providers=["NpuSimExecutionProvider"])[0].shape == (2, 3)
    from ep.testing.__main__ import main

    npu_cpu = "NpuSimExecutionProvider,CPUExecutionProvider"
    assert main(["replay", str(folder), "--providers", npu_cpu]) == 0
    with pytest.warns(UserWarning, match="BrokenExecutionProvider"):
        assert main(["replay", str(folder)]) == 1  # a Python EP cannot be found by name
    assert len(list(tmp_path.iterdir())) == 3  # each failed comparison saved one more case


def _float16_model(ops: Sequence[str]) -> onnx.ModelProto:
    h = TensorProto.FLOAT16
    names = ("big", "small", "minus_big")
    return _model([helper.make_node(ops[0], ["small", "big"], ["t"]),
                   helper.make_node(ops[1], ["t", "minus_big"], ["y"])],
                  [helper.make_tensor_value_info(n, h, (64,)) for n in names],
                  [helper.make_tensor_value_info("y", h, (64,))])


def test_float16_graphs_are_compared_node_by_node(tmp_path, monkeypatch):
    monkeypatch.setenv("EP_TESTING_FAILURES", str(tmp_path))
    rng = np.random.default_rng(0)
    big = (1000 + 10 * rng.random(64)).astype(np.float16)
    inputs = {"big": big, "small": rng.random(64).astype(np.float16), "minus_big": -big}
    # Rounding t to float16 (ulp 0.5 near 1000) loses what float32 throughout keeps.
    rounded = ((inputs["small"] + big).astype(np.float16) - big).astype(np.float16)
    assert compare(inputs["small"], rounded) is not None
    model = _float16_model(["Add", "Add"])
    whole = _ort(model, inputs)[0]
    assert compare(whole, rounded) is not None  # onnxruntime chains these Adds in float32
    # An EP that rounds every tensor, as ONNX defines, passes; so does onnxruntime's own answer.
    # (Optimizations off: onnxruntime's basic level, run before partitioning, inserts casts to
    # float32 around the float16 Adds its CPU provider has no kernel for.)
    options = ep.SessionOptions()
    options.graph_optimization_level = ep.GraphOptimizationLevel.ORT_DISABLE_ALL
    ours = assert_matches_onnxruntime(model, inputs, providers=[_BrokenEP(wide=False)],
                                      sess_options=options)
    np.testing.assert_array_equal(ours[0], rounded)
    assert assert_matches_onnxruntime(model, inputs, providers=["CPUExecutionProvider"])
    # A wrong float16 result is judged against the node-by-node reference, and says so.
    neg = _model([helper.make_node("Neg", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT16, (4,))],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT16, (4,))])
    with pytest.raises(Mismatch, match="node by node") as info:
        assert_matches_onnxruntime(neg, {"x": np.ones(4, np.float16)}, providers=[_BrokenEP()],
                                   sess_options=options)
    assert "float16 chains in float32" in str(info.value) and "2 ulp" in str(info.value)


def test_a_refusal_must_be_typed_on_both_sides():
    # onnxruntime refuses a feed of the wrong shape; ep must refuse too, typed.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    assert assert_matches_onnxruntime(model, {"x": np.zeros((3, 2), np.float32)}) is None
    with pytest.raises(ep.InvalidArgument):
        ep.InferenceSession(model.SerializeToString()).run(None, {"x": np.zeros((3, 2),
                                                                                 np.float32)})


def test_plugin_fixtures(npu_device, npu_device_config, npu_session, pytestconfig,
                         request):
    assert npu_device.config == npu_device_config
    assert request.getfixturevalue("npu_device_name") in (
        pytestconfig.getoption("--npu-device") or ["npu-m"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))
    model = _model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [x], [y])
    session = npu_session(model.SerializeToString())
    assert session.get_node_assignment() == {"neg": "NpuSimExecutionProvider"}
    assert session.get_provider_options()["NpuSimExecutionProvider"]["device"] == \
        npu_device_config.name
    check = request.getfixturevalue("assert_matches_onnxruntime")
    assert check(model) is not None
    assert math.isclose(float(session.run(None, {"x": np.ones((2, 3), np.float32)})[0][0, 0]),
                        -1.0)
