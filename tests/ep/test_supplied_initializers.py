"""``SessionOptions.add_initializer`` and ``add_external_initializers``, side by side with the
installed onnxruntime (ep/framework/initializers.py).

onnxruntime reads an added ``OrtValue``'s memory, so every value here is kept alive for as long
as a session may read it: a value dropped early made onnxruntime 1.32 crash (a segmentation
fault, in a separate process while this test was written).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import ep
from tests.ep.test_external_data import FEED, MODEL, saved

W = numpy_helper.to_array(MODEL.graph.initializer[0])  # "w", (16, 8) float32
BIAS = numpy_helper.to_array(MODEL.graph.initializer[1])
KEPT: list[object] = []  # every array and OrtValue handed to a session, alive to the end


def value(array: np.ndarray) -> ort.OrtValue:
    array = np.ascontiguousarray(array)
    made = ort.OrtValue.ortvalue_from_numpy(array)
    KEPT.extend((array, made))
    return made


def both(model: str | bytes, add) -> tuple[object, object]:
    """What onnxruntime and ep do with ``model`` when ``add(options)`` adds the values:
    outputs on FEED, or the error class raised."""
    outcomes = []
    for module in (ort, ep):
        options = module.SessionOptions()
        add(options)
        try:
            kwargs = {"providers": ["CPUExecutionProvider"]} if module is ort else {}
            outcomes.append(module.InferenceSession(model, options, **kwargs).run(None, FEED))
        except Exception as exc:  # noqa: BLE001 - the class is what is compared
            outcomes.append(type(exc).__name__)
    return outcomes[0], outcomes[1]


def same(want: object, got: object) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    else:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["doubled weights", "ones for the bias", "a name the model "
                                  "lacks", "a graph input's name", "another type"])
def test_add_initializer_replaces_the_models_as_onnxruntime_does(case):
    def add(options) -> None:
        if case == "doubled weights":
            options.add_initializer("w", value(W * 2))
        elif case == "ones for the bias":
            options.add_initializer("bias", value(np.ones_like(BIAS)))
        elif case == "a name the model lacks":
            options.add_initializer("nope", value(W))
        elif case == "a graph input's name":
            options.add_initializer("x", value(FEED["x"]))
        else:
            options.add_initializer("w", value(W.astype(np.float64)))

    want, got = both(MODEL.SerializeToString(), add)
    same(want, got)
    if case == "doubled weights":  # the value was used, not the model's
        plain = ort.InferenceSession(MODEL.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, FEED)[0]
        assert not np.allclose(got[0], plain)


def test_an_added_initializer_of_other_dimensions_is_refused_at_creation():
    """onnxruntime creates the session and fails its run (the Gemm's "Dimension mismatch",
    ``InvalidArgument``); the session is refused when created, naming both shapes."""
    options = ep.SessionOptions()
    options.add_initializer("w", value(W[:4]))
    with pytest.raises(ep.Fail, match=r"'w'.*float\[4, 8\].*float\[16, 8\]"):
        ep.InferenceSession(MODEL.SerializeToString(), options)


@pytest.mark.parametrize("case", ["the file's data", "other values", "no file at all",
                                  "another type", "other dimensions", "a name the model lacks",
                                  "an initializer held in the model"])
def test_add_external_initializers_supplies_external_data_as_onnxruntime_does(tmp_path, case):
    path = saved(tmp_path)
    model = str(path)
    if case == "no file at all":
        os.unlink(tmp_path / "m.data")
    if case == "an initializer held in the model":
        model = MODEL.SerializeToString()

    def add(options) -> None:
        names, values = ["w", "bias"], [W, BIAS]
        if case == "other values":
            values = [W * 3, BIAS - 1]
        elif case == "another type":
            values = [W.astype(np.float64), BIAS]
        elif case == "other dimensions":
            values = [W[:4], BIAS]
        elif case == "a name the model lacks":
            names = ["w", "nope"]
        options.add_external_initializers(names, [value(v) for v in values])

    want, got = both(model, add)
    same(want, got)


def test_the_arguments_are_checked_as_onnxruntime_checks_them():
    options = ep.SessionOptions()
    reference = ort.SessionOptions()
    w = value(W)
    for target in (options, reference):
        target.add_initializer("w", w)
    with pytest.raises(ep.InvalidArgument, match="already been added: w"):
        options.add_initializer("w", w)
    with pytest.raises(RuntimeError, match="already been added: w"):
        reference.add_initializer("w", w)
    for target in (options, reference):  # a numpy array is not an OrtValue
        with pytest.raises(RuntimeError, match="must be an OrtValue"):
            target.add_initializer("v", W)
        with pytest.raises(TypeError):
            target.add_initializer(3, w)
        with pytest.raises(RuntimeError, match="equal length"):
            target.add_external_initializers(["a", "b"], [w])
        with pytest.raises(TypeError):
            target.add_external_initializers("a", w)
    assert set(options.initializers) == {"w"} and not options.external_initializers


def test_a_model_compiled_with_an_added_initializer_keeps_its_value(tmp_path):
    """``ModelCompiler`` reads the options' initializers as a session does: the EPContext
    model it writes computes with the added value."""
    path = tmp_path / "m.onnx"
    onnx.save(MODEL, path)
    options = ep.SessionOptions()
    options.add_initializer("w", value(W * 2))
    ep.ModelCompiler(options, str(path)).compile_to_file(str(tmp_path / "m_ctx.onnx"))
    reference = ort.SessionOptions()
    reference.add_initializer("w", value(W * 2))
    want = ort.InferenceSession(str(path), reference,
                                providers=["CPUExecutionProvider"]).run(None, FEED)
    got = ep.InferenceSession(str(tmp_path / "m_ctx.onnx")).run(None, FEED)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
