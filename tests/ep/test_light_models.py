"""The nine ``light_*.onnx`` models of onnx's backend test data, end to end on the NPU.

Each model (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512 with ConstantOfShape weights) must load, run entirely on the NPU (no node left to the
CPU: the opset-9 Dropouts' unread masks are dead outputs, not a reason to decline) and match
onnxruntime's CPU provider on the same inputs. SqueezeNet also goes through an EPContext round
trip: the generated context model reloads and gives the same outputs bit for bit.

Eight of them end in a Softmax of logits that are all equal in exact arithmetic (every class
has the same constant weights), from 0.47 to 2.6e31: the probabilities then tell only how the
GEMM rounded equal sums (OpenBLAS's Haswell kernel sums rows 6-11 of every 12 in another order
than MLAS, a last-bit difference that a Softmax of 6.8e9 turns into 0 or 1/498). So the logits
are compared with onnxruntime, and the probabilities wherever its logits are not tied.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ep
from ep.framework import epcontext as E
from ep.models import sample_input

NPU = "NpuSimExecutionProvider"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
          "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light(name: str) -> Path:
    return LIGHT / f"light_{name}.onnx"


def test_the_nine_models_are_there() -> None:
    assert sorted(p.name for p in LIGHT.glob("light_*.onnx")) == sorted(
        light(name).name for name in MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_runs_on_the_npu_and_matches_onnxruntime(name: str) -> None:
    path = light(name)
    model = onnx.load(path)
    feeds = sample_input(model)
    session = ep.InferenceSession(str(path), providers=[NPU])
    assert session.get_decline_reasons() == {}
    partitions = session.get_partitions()
    assert {p["provider"] for p in partitions} == {NPU}
    # Every node of the graph as partitioned (after onnxruntime's basic optimizations) is on it.
    assert set(session.get_node_assignment().values()) == {NPU}
    assert sum(len(p["nodes"]) for p in partitions) == len(session.get_node_assignment())

    got = session.run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
    logits = _softmax_logits(model)
    if logits is None:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        return
    # The same model with its Softmax's input as an output too, on both sides.
    model.graph.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT,
                                                                 None))
    data = model.SerializeToString()
    (g, g_logits), (w, w_logits) = (ep.InferenceSession(data, providers=[NPU]).run(None, feeds),
                                    ort.InferenceSession(data, providers=["CPUExecutionProvider"])
                                    .run(None, feeds))
    np.testing.assert_array_equal(g, got[0])  # the extra output changed nothing
    np.testing.assert_allclose(g_logits, w_logits, rtol=1e-4, atol=1e-5)
    if np.ptp(w_logits) > 1e-4 * np.abs(w_logits).max() + 1e-5:  # not tied
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    else:  # tied: ours are the Softmax of our own logits
        shifted = np.exp(g_logits.astype(np.float64) - g_logits.max(axis=1, keepdims=True))
        np.testing.assert_allclose(g, shifted / shifted.sum(axis=1, keepdims=True), rtol=1e-5,
                                   atol=1e-7)


def _softmax_logits(model: onnx.ModelProto) -> str | None:
    """The input of the Softmax (over axis 1 of 2-D logits) producing the model's only output,
    or None when the output is not a Softmax's."""
    producer = {out: node for node in model.graph.node for out in node.output}
    node = producer.get(model.graph.output[0].name)
    if len(model.graph.output) != 1 or node is None or node.op_type != "Softmax":
        return None
    return node.input[0]


def test_squeezenet_epcontext_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "squeezenet.onnx"
    shutil.copyfile(light("squeezenet"), src)
    feeds = sample_input(onnx.load(src))
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    compiled = ep.InferenceSession(str(src), so, providers=[NPU])
    expected = compiled.run(None, feeds)

    ctx_path = tmp_path / "squeezenet_ctx.onnx"
    ctx = onnx.load(ctx_path)
    assert [n.op_type for n in ctx.graph.node] == ["EPContext"]  # the whole model on the NPU
    assert E.is_ep_context_node(ctx.graph.node[0])
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".bin")]) == 1

    reloaded = ep.InferenceSession(str(ctx_path), providers=[NPU])
    got = reloaded.run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert np.array_equal(g, e)
