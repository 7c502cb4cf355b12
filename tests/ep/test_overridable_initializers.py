"""Overridable initializers: initializers a model also lists as graph inputs, which a run may
feed (``torch.onnx.export(..., keep_initializers_as_inputs=True)`` writes every weight so, and
IR 3 models must). Side by side with the installed onnxruntime: what the session lists, what a
run computes with and without a fed value, and what a bad feed raises (ep/framework/graph.py,
``GraphView.overridable``).
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import ep
from tests.ep.npusim_graphs import matmul_add, random_feed

torch = pytest.importorskip("torch")


def exported_cnn() -> bytes:
    """A small CNN as torch's exporter writes it with its weights as graph inputs."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.randn(1, 3, 8, 8),), buffer, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False,
                      keep_initializers_as_inputs=True)
    return buffer.getvalue()


def with_weights_as_inputs(model: onnx.ModelProto, ir_version: int | None = None) -> bytes:
    for tensor in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(
            tensor.name, tensor.data_type, list(tensor.dims)))
    if ir_version is not None:
        model.ir_version = ir_version
    return model.SerializeToString()


def listed(session) -> tuple[list, list]:
    return ([(a.name, a.shape, a.type) for a in session.get_inputs()],
            [(a.name, a.shape, a.type) for a in session.get_overridable_initializers()])


def outcome(session, feeds) -> list[np.ndarray] | str:
    try:
        return session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return type(exc).__name__


MODELS = {
    "torch, keep_initializers_as_inputs": exported_cnn,
    "IR 4, a MatMul's weight and bias": lambda: with_weights_as_inputs(
        matmul_add(m=2, k=16, n=8, seed=5)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_overridable_initializers_are_listed_fed_and_defaulted_as_onnxruntime_does(name):
    data = MODELS[name]()
    model = onnx.ModelProto.FromString(data)
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    session = ep.InferenceSession(data)
    assert listed(session) == listed(reference)
    overridable = [a.name for a in reference.get_overridable_initializers()]
    assert overridable, "the model has initializers listed as inputs"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8), dtype=np.float32)} \
        if name.startswith("torch") else random_feed(model)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(1)
    cases = [feeds]  # the defaults
    for tensor in overridable[:3] + overridable[-2:]:  # some weights, then the last (a bias)
        fed = (values[tensor] + rng.standard_normal(values[tensor].shape)).astype(
            values[tensor].dtype)
        cases.append({**feeds, tensor: fed})
    cases.append(feeds)  # the defaults again: a fed value lasts one run
    for case in cases:
        want, got = outcome(reference, case), outcome(session, case)
        assert not isinstance(want, str) and not isinstance(got, str), (want, got)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_an_ir3_models_initializers_are_not_overridable():
    """IR 3 lists every initializer as an input; onnxruntime lists none as overridable and
    refuses a feed of one ("Invalid input name")."""
    model = matmul_add(m=2, k=16, n=8, seed=5)
    data = with_weights_as_inputs(model, ir_version=3)
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    session = ep.InferenceSession(data)
    assert listed(session) == listed(reference)
    assert not session.get_overridable_initializers()
    w = numpy_helper.to_array(model.graph.initializer[0])
    feeds = random_feed(model)
    for case in (feeds, {**feeds, "w": w * 2}):
        want, got = outcome(reference, case), outcome(session, case)
        if isinstance(want, str):
            assert got == want == "InvalidArgument"
        else:
            np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", ["another type", "another shape", "another rank"])
def test_a_bad_feed_of_an_overridable_initializer_is_refused_as_onnxruntime_refuses_it(bad):
    model = matmul_add(m=2, k=16, n=8, seed=5)
    data = with_weights_as_inputs(model)
    w = numpy_helper.to_array(model.graph.initializer[0])
    fed = {"another type": w.astype(np.float64), "another shape": w[:4],
           "another rank": w.reshape(-1)}[bad]
    feeds = {**random_feed(model), "w": fed}
    want = outcome(ort.InferenceSession(data, providers=["CPUExecutionProvider"]), feeds)
    got = outcome(ep.InferenceSession(data), feeds)
    assert isinstance(want, str) and got == want


def test_an_epcontext_model_keeps_them_overridable(tmp_path):
    """The EPContext model lists them as inputs with their initializers, as the source did:
    its sessions default them and take fed values alike."""
    model = matmul_add(m=2, k=16, n=8, seed=5)
    path = tmp_path / "m.onnx"
    path.write_bytes(with_weights_as_inputs(model))
    options = ep.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(path), options)
    loaded = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"))
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert listed(loaded) == listed(reference)
    w = numpy_helper.to_array(model.graph.initializer[0])
    for feeds in (random_feed(model), {**random_feed(model), "w": w * 2}):
        np.testing.assert_allclose(loaded.run(None, feeds)[0], reference.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
