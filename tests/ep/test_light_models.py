"""The nine ``light_*.onnx`` models of onnx's backend test data, end to end on the NPU.

Each model (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512 with ConstantOfShape weights) must load, run entirely on the NPU (no node left to the
CPU: the opset-9 Dropouts' unread masks are dead outputs, not a reason to decline) and match
onnxruntime's CPU provider on the same inputs. SqueezeNet also goes through an EPContext round
trip: the generated context model reloads and gives the same outputs bit for bit.
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
    feeds = sample_input(onnx.load(path))
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
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


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
