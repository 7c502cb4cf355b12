"""NpuSimExecutionProvider: options, and compiled graphs running on the simulated device vs ORT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ep import errors
from ep.framework.graph import GraphView
from ep.framework.partitioner import partition
from ep.framework.provider import ProviderContext
from ep.npusim import NpuSimExecutionProvider
from tests.ep.npusim_graphs import (
    as_fused,
    conv_bn_relu,
    matmul_add,
    model,
    ort_run,
    qdq_conv,
    qdq_matmul,
    random_feed,
    residual_block,
)

F = TensorProto.FLOAT
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def provider(**options: str) -> NpuSimExecutionProvider:
    return NpuSimExecutionProvider(ProviderContext(provider_options=options))


def run_on_npu(ep, m, feeds):
    fused = as_fused(m)
    (node,) = ep.compile([fused])
    return node.run([feeds[n] for n in fused.inputs])


@pytest.mark.parametrize("build", [conv_bn_relu, lambda: matmul_add(act="Relu"),
                                   residual_block], ids=["conv_bn_relu", "matmul_add",
                                                         "residual"])
def test_float_graphs_match_onnxruntime(build):
    m = build()
    feeds = random_feed(m)
    ep = provider()
    for got, want in zip(run_on_npu(ep, m, feeds), ort_run(m, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    stats = ep.run_stats()
    assert stats["cycles"] > 0
    assert stats["microseconds"] == pytest.approx(stats["cycles"] / (1.2 * 1000))
    assert set(stats["utilization"]) == {f"core.{c}" for c in range(4)} | {
        f"dma.{c}" for c in range(4)}
    assert all(0.0 <= u <= 1.0 for u in stats["utilization"].values())
    assert stats["counters"]["compute.kernels"] == len(ep.programs["NpuSim_0"].launches)


@pytest.mark.parametrize("build", [qdq_conv, lambda: qdq_conv(qtype=TensorProto.INT8,
                                                              per_channel=False), qdq_matmul],
                         ids=["conv_u8_per_channel", "conv_s8_per_tensor", "matmul"])
def test_quantized_graphs_match_onnxruntime_within_one_lsb(build):
    # QLinear* accumulate exactly in int32 and requantize once; ORT's literal DQ -> Conv -> Q
    # rounds a float32 sum, which can fall on the other side of a .5 boundary: at most 1 LSB.
    m = build()
    ep = provider()
    assert [launch.op for launch in _compiled_program(ep, m).launches][0].startswith("QLinear")
    for seed in range(3):
        feeds = random_feed(m, seed)
        (got,), (want,) = run_on_npu(ep, m, feeds), ort_run(m, feeds)
        assert got.dtype == want.dtype
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and np.mean(diff == 0) >= 0.98


def _compiled_program(ep, m):
    ep.compile([as_fused(m, "probe")])
    return ep.programs["probe"]


def test_light_resnet50_matches_onnxruntime():
    m = onnx.load(str(LIGHT / "light_resnet50.onnx"))
    # Its weights are all 0.02, so the softmax alone is uniform whatever the input: also
    # compare the logits and the last residual stage, which depend on the input.
    for name, shape in (("r174", (1, 1000)), ("r170", (1, 2048, 7, 7))):
        m.graph.output.append(helper.make_tensor_value_info(name, F, shape))
    ep = provider()
    fused = as_fused(m)
    (node,) = ep.compile([fused])
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    got = node.run([x])
    want = ort_run(m, {fused.inputs[0]: x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-4, atol=1e-5)
    report = ep.reports[fused.name].summary()
    assert report["fold_batchnorm"] == 53 and report["launches"] < 100
    assert report["arena_bytes"] <= 1.1 * report["arena_lower_bound"]


def test_timing_only_mode_returns_zeros_and_still_takes_time():
    m = conv_bn_relu()
    ep = provider(functional="0")
    (y,) = run_on_npu(ep, m, random_feed(m))
    assert y.shape == (1, 8, 10, 10) and not y.any()
    assert ep.run_stats()["cycles"] > 0


def test_dim_override_option_fixes_a_symbolic_dimension():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, [("x", F, ("batch", 4))], [("y", F, ("batch", 4))])
    ep = provider(batch="3")
    assert ep.dim_overrides == {"batch": 3}
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    (y,) = run_on_npu(ep, m, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_device_option_takes_a_preset_or_a_config_file(tmp_path):
    assert provider(device="os32").config.name == "os32"
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"preset": "npu-s", "name": "mine", "cores": 3}))
    ep = provider(device=str(path))
    assert (ep.config.name, ep.config.cores) == ("mine", 3)
    assert ep.programs == {}


@pytest.mark.parametrize("options, match", [
    ({"colour": "blue"}, "valid keys: device, functional, allocator"),
    ({"device": "npu-xl"}, "npu-m"),
    ({"device": "missing.toml"}, "missing.toml"),
    ({"functional": "yes"}, "'0' or '1'"),
    ({"allocator": "buddy"}, "best_fit"),
    ({"batch": "0"}, ">= 1"),
])
def test_bad_options_are_invalid_argument(options, match):
    with pytest.raises(errors.InvalidArgument, match=match):
        provider(**options)


def test_capability_and_decline_reasons_come_from_the_support_table():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="cubic")]
    m = model(nodes, [("x", F, (1, 1, 2, 2))], [("y", F, (1, 1, 4, 4))],
              {"scales": np.array([1, 1, 2, 2], np.float32)})
    graph = GraphView.from_model(m)
    ep = provider()
    caps = ep.get_capability(graph)
    assert [c.nodes for c in caps] == [(0,)]
    assert "cubic" in ep.decline_reasons(graph)[1]


def test_partitioning_checks_each_node_against_the_table_once(monkeypatch):
    """The partitioner asks get_capability then decline_reasons on one view: the support
    table is walked once, and a view get_capability never saw is still answered."""
    import ep.npusim.provider as npu_provider

    calls = []
    real = npu_provider.get_npu_capability

    def counting(view):
        calls.append(view)
        return real(view)

    monkeypatch.setattr(npu_provider, "get_npu_capability", counting)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="cubic")]
    m = model(nodes, [("x", F, (1, 1, 2, 2))], [("y", F, (1, 1, 4, 4))],
              {"scales": np.array([1, 1, 2, 2], np.float32)})
    graph = GraphView.from_model(m)
    ep = provider()
    plan = partition(graph, [ep])
    assert len(calls) == 1
    assert "cubic" in plan.reasons[graph.names[1]]["NpuSimExecutionProvider"]
    other = graph.with_assigned({0})
    assert "cubic" in ep.decline_reasons(other)[1]
    assert len(calls) == 2


def test_wrong_input_count_is_invalid_argument():
    ep = provider()
    (node,) = ep.compile([as_fused(conv_bn_relu())])
    with pytest.raises(errors.InvalidArgument, match="takes 1 inputs, got 2"):
        node.run([np.zeros((1, 3, 10, 10), np.float32)] * 2)


def test_run_stats_cover_every_npu_partition_of_the_run() -> None:
    """Two NPU partitions around a CPU node: the session's NPU stats are their sum, with each
    partition's own figures kept (only the last partition's used to be reported)."""
    import ep as ep_api
    from tests.ep.test_epcontext_load import npu_cpu_model
    from tests.ep.test_session import X

    session = ep_api.InferenceSession(npu_cpu_model().SerializeToString(),
                                      providers=["NpuSimExecutionProvider"])
    session.run(None, {"x": X})
    stats = session.get_run_stats()["NpuSimExecutionProvider"]
    parts = stats["partitions"]
    npu_parts = [p["name"] for p in session.get_partitions()
                 if p["provider"] == "NpuSimExecutionProvider"]
    assert sorted(parts) == sorted(npu_parts) and len(parts) == 2
    assert stats["cycles"] == sum(p["cycles"] for p in parts.values()) > max(
        p["cycles"] for p in parts.values())
    kernels = sum(p["counters"]["compute.kernels"] for p in parts.values())
    assert stats["counters"]["compute.kernels"] == kernels
    busy = sum(p["counters"]["core.0.busy_cycles"] for p in parts.values())
    assert stats["utilization"]["core.0"] == pytest.approx(busy / stats["cycles"])


def test_a_partial_run_executes_only_what_its_outputs_need() -> None:
    """npu_cpu_model (batch dimension symbolic): CPU_0 (Add, Softsign) -> NpuSim_0 (Relu) -> CPU_1
    (Mul -> y), and Add -> NpuSim_1 (Tanh -> z). Asking for z runs CPU_0 and NpuSim_1 only:
    neither NpuSim_0 nor CPU_1 launches anything."""
    import onnxruntime as ort

    import ep as ep_api
    from tests.ep.test_epcontext_load import npu_cpu_model
    from tests.ep.test_session import X

    model = npu_cpu_model().SerializeToString()
    session = ep_api.InferenceSession(model, providers=["NpuSimExecutionProvider"])
    owner = {n: p["name"] for p in session.get_partitions() for n in p["nodes"]}
    assert len({owner["add"], owner["relu"], owner["mul"], owner["tanh"]}) == 4
    (z,) = session.run(["z"], {"x": X})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["z"], {"x": X})
    np.testing.assert_allclose(z, want[0], rtol=1e-5, atol=1e-6)
    assert set(session.get_run_stats()["partition_wall_us"]) == {owner["add"], owner["tanh"]}
    partial = session.get_run_stats()["NpuSimExecutionProvider"]
    assert set(partial["partitions"]) == {owner["tanh"]}
    session.run(None, {"x": X})
    full = session.get_run_stats()["NpuSimExecutionProvider"]
    assert set(full["partitions"]) == {owner["tanh"], owner["relu"]}
    assert partial["counters"]["compute.kernels"] < full["counters"]["compute.kernels"]
