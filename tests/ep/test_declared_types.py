"""The types a session reports for its inputs and outputs, and the shapes a model declares that
inference contradicts, against the installed onnxruntime on the same model.

Three differences these found: a value that is not a tensor (a scikit-learn classifier's
``seq(map(int64,tensor(float)))``, a sequence, a map, an optional) was reported as
``tensor(undefined)``; an output dim nobody could work out was reported by the name ONNX's
inference made up for it (``unk__0``) where onnxruntime says None; and a model whose declared
shapes went stale (an edited or re-exported graph: declared ``[1, 200]``, computed
``[1, 204]``) was refused, where onnxruntime warns, resolves the shape and runs it
(``ep.framework.shapes``, ``ep.framework.node_args``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import ep

RNG = np.random.default_rng(0)
X3 = RNG.random((4, 3), dtype=np.float32)


def described(session) -> tuple[list, list]:
    return ([(a.name, a.type, a.shape) for a in session.get_inputs()],
            [(a.name, a.type, a.shape) for a in session.get_outputs()])


def same_as_onnxruntime(model: onnx.ModelProto, feeds: dict) -> ep.InferenceSession:
    """Create and run ``model`` in both; the descriptions and outputs must be the same."""
    data = model.SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(data)
    assert described(ours) == described(theirs)
    for got, want in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True):
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        else:
            assert repr(got) == repr(want)
    return ours


def make(nodes, inputs, outputs, value_info=(), initializers=(), ml=False) -> onnx.ModelProto:
    opsets = [h.make_opsetid("", 18)] + ([h.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    graph = h.make_graph(nodes, "g", inputs, outputs, list(initializers),
                         value_info=list(value_info))
    return h.make_model(graph, opset_imports=opsets)


def tensor(name: str, elem: int = T.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def typed(name: str, type_proto: onnx.TypeProto) -> onnx.ValueInfoProto:
    return h.make_value_info(name, type_proto)


def zipmap() -> tuple[onnx.ModelProto, dict]:
    """A scikit-learn classifier as skl2onnx writes it: labels, and one map per row."""
    probabilities = h.make_sequence_type_proto(
        h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))
    nodes = [h.make_node("LinearClassifier", ["X"], ["label", "p"], domain="ai.onnx.ml",
                         coefficients=[0.1, 0.2, 0.3, -0.1, 0.5, 0.2], intercepts=[0.1, -0.2],
                         classlabels_ints=[0, 1], post_transform="LOGISTIC"),
             h.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml",
                         classlabels_int64s=[0, 1])]
    return make(nodes, [tensor("X", shape=[None, 3])],
                [tensor("label", T.INT64, [None]), typed("probabilities", probabilities)],
                ml=True), {"X": X3}


def sequences() -> tuple[onnx.ModelProto, dict]:
    floats = h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, [3]))
    nodes = [h.make_node("SequenceInsert", ["s", "a"], ["longer"]),
             h.make_node("SequenceAt", ["longer", "i"], ["at"]), h.make_node("Relu", ["at"], ["r"])]
    inputs = [typed("s", floats), tensor("a", shape=[3]), tensor("i", T.INT64, [])]
    return make(nodes, inputs, [tensor("r", shape=[3]), typed("longer", floats)]), {
        "s": [X3[0], -X3[1]], "a": X3[2], "i": np.array(1, np.int64)}


def dictionary() -> tuple[onnx.ModelProto, dict]:
    entries = h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(T.FLOAT, []))
    node = h.make_node("DictVectorizer", ["m"], ["v"], domain="ai.onnx.ml",
                       string_vocabulary=["a", "b", "c"])
    return make([node], [typed("m", entries)], [tensor("v", shape=[None, 3])], ml=True), {
        "m": {"a": 1.0, "c": 3.0}}


def optional(given: bool) -> tuple[onnx.ModelProto, dict]:
    maybe = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2]))
    node = h.make_node("OptionalHasElement", ["o"], ["has"])
    return make([node], [typed("o", maybe)], [tensor("has", T.BOOL, [])]), {
        "o": np.ones(2, np.float32) if given else None}


@pytest.mark.parametrize("build", [zipmap, sequences, dictionary, lambda: optional(True),
                                   lambda: optional(False)],
                         ids=["zipmap", "sequences", "map", "optional", "optional-none"])
def test_values_that_are_not_tensors_are_described_as_onnxruntime_does(build) -> None:
    same_as_onnxruntime(*build())


@pytest.mark.parametrize("declared", [[None], None, ["n"], ["unk__0"]],
                         ids=["unnamed-dim", "no-shape", "named", "named-like-inference"])
@pytest.mark.parametrize("op", ["ReduceSum", "NonZero"])
def test_output_dims_inference_cannot_work_out_are_unknown(declared, op) -> None:
    """ONNX's inference names such a dim ``unk__N``; onnxruntime names none. A name the model
    gives itself is the model's, even one that looks like inference's."""
    if op == "ReduceSum":
        node = h.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=0)
        inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")]
        out = tensor("Y", shape=declared)
    else:
        node = h.make_node("NonZero", ["X"], ["Y"])
        inits = []
        out = tensor("Y", T.INT64, None if declared is None else [2, *declared])
    model = make([node], [tensor("X", shape=[None, 3])], [out], initializers=inits)
    same_as_onnxruntime(model, {"X": X3 - 0.5})


@pytest.mark.parametrize("name", ["batch", "unk__0"])
@pytest.mark.parametrize("stale", [False, True], ids=["", "stale-value-info"])
def test_a_symbolic_input_dim_reaches_the_outputs_by_its_name(name, stale) -> None:
    """tf2onnx names its inputs' unknown dims ``unk__N`` itself: those are the model's names.
    With a stale ``value_info`` the shapes are resolved the slow way, to the same names."""
    nodes = [h.make_node("Relu", ["X"], ["R"]),
             h.make_node("ReduceSum", ["R", "axes"], ["Y"], keepdims=0)]
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = make(nodes, [tensor("X", shape=[name, 3])], [tensor("Y")], initializers=[axes],
                 value_info=[tensor("R", shape=[name, 5])] if stale else [])
    session = same_as_onnxruntime(model, {"X": X3})
    assert session.get_outputs()[0].shape == [name]


STALE = [[1, 200], [1, 204, 1], [2, 102], ["n", 200], [None, 200], [2, "n"]]


@pytest.mark.parametrize("stale", STALE, ids=str)
@pytest.mark.parametrize("where", ["output", "value_info"])
def test_a_stale_declared_shape_is_resolved_as_onnxruntime_resolves_it(stale, where) -> None:
    """Declared ``stale``, computed ``[1, 204]``: onnxruntime keeps what agrees, makes the dims
    that do not unknown (a rank that does not, the whole shape), and runs the model; so does
    the session, where it once refused it (the compiler's inference found the contradiction)."""
    nodes = [h.make_node("Relu", ["X"], ["R"]), h.make_node("Mul", ["R", "X"], ["Y"])]
    x = RNG.standard_normal((1, 204)).astype(np.float32)
    if where == "output":
        model = make(nodes, [tensor("X", shape=[1, 204])], [tensor("Y", shape=stale)])
    else:
        model = make(nodes, [tensor("X", shape=[1, 204])], [tensor("Y")],
                     value_info=[tensor("R", shape=stale)])
    same_as_onnxruntime(model, {"X": x})


def test_a_dim_resolved_unknown_is_unknown_to_the_providers_too() -> None:
    """A provider sees the graph onnxruntime resolved: the dim a stale ``value_info``
    contradicted is unknown to the nodes that write and read it, so the NPU, which needs
    static shapes, declines them and says why (onnxruntime's inference goes on from the
    resolved shape, which is how ``Y`` still has its dims)."""
    w = onnx.numpy_helper.from_array(RNG.standard_normal((204, 8)).astype(np.float32), "w")
    nodes = [h.make_node("Relu", ["X"], ["R"]), h.make_node("MatMul", ["R", "w"], ["Y"])]
    model = make(nodes, [tensor("X", shape=[1, 204])], [tensor("Y")],
                 value_info=[tensor("R", shape=[1, 200])], initializers=[w])
    session = same_as_onnxruntime(model, {"X": RNG.standard_normal((1, 204), np.float32)})
    assert session.get_outputs()[0].shape == [1, 8]
    assert set(session.get_node_assignment().values()) == {"CPUExecutionProvider"}
    assert session.get_decline_reasons()["MatMul_1"] == {
        "NpuSimExecutionProvider": "MatMul: unknown dimension 1 on input 'R'"}


def test_an_epcontext_model_declares_no_invented_dim(tmp_path) -> None:
    """The EPContext model keeps the outputs as onnxruntime's graph holds them: a dim nobody
    could work out is written unknown, not by inference's name for it, and the session loaded
    from it describes its outputs as onnxruntime describes the source's."""
    nodes = [h.make_node("Relu", ["X"], ["R"]), h.make_node("NonZero", ["R"], ["Y"])]
    model = make(nodes, [tensor("X", shape=[4, 3])], [tensor("Y", T.INT64)])
    source = tmp_path / "m.onnx"
    onnx.save(model, source)
    options = ep.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(source), options)
    ctx = onnx.load(tmp_path / "m_ctx.onnx")
    assert "EPContext" in {n.op_type for n in ctx.graph.node}
    written = [d for vi in (*ctx.graph.output, *ctx.graph.value_info)
               for d in vi.type.tensor_type.shape.dim]
    assert not any(d.dim_param.startswith("unk__") for d in written)
    theirs = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    loaded = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"))
    assert described(loaded) == described(theirs)
    np.testing.assert_array_equal(loaded.run(None, {"X": X3 - 0.5})[0],
                                  theirs.run(None, {"X": X3 - 0.5})[0])


def scalar_input_model() -> bytes:
    """``Y = X + relu(S)``, ``S`` declared a scalar (a shape with no dims)."""
    nodes = [h.make_node("Relu", ["S"], ["R"]), h.make_node("Add", ["X", "R"], ["Y"])]
    return make(nodes, [tensor("X", shape=[2, 3]), tensor("S", shape=[])],
                [tensor("Y")]).SerializeToString()


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (2, 3)], ids=str)
def test_an_input_declared_a_scalar_takes_a_feed_of_any_shape(shape) -> None:
    """onnxruntime checks no shape for an input declared with no dims: a scalar input fed
    ``np.array([t])`` runs (the session refused it: "Invalid rank for input")."""
    feeds = {"X": X3[:2], "S": np.full(shape, -0.5 if shape == () else 0.25, np.float32)}
    theirs = ort.InferenceSession(scalar_input_model(), providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(scalar_input_model(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours.run(None, feeds)[0], theirs.run(None, feeds)[0])


def test_an_npu_partition_compiled_for_a_scalar_fails_another_shape_as_an_ep_fault(
        capsys) -> None:
    """The NPU compiled ``relu(S)`` for the declared scalar; fed ``(1,)``, the run is an
    ``EP_FAIL`` naming both shapes, as an EP compiled for static shapes fails in onnxruntime,
    and onnxruntime's EP-error fallback runs it on the CPU provider, with its values."""
    feeds = {"X": X3[:2], "S": np.full((1,), 0.25, np.float32)}
    strict = ep.InferenceSession(scalar_input_model(), enable_fallback=0)
    assert set(strict.get_node_assignment().values()) == {"NpuSimExecutionProvider"}
    with pytest.raises(ep.EPFail, match=r"expected shape \(\) float32, got shape \(1,\)"):
        strict.run(None, feeds)
    theirs = ort.InferenceSession(scalar_input_model(), providers=["CPUExecutionProvider"])
    falls_back = ep.InferenceSession(scalar_input_model())
    np.testing.assert_array_equal(falls_back.run(None, feeds)[0], theirs.run(None, feeds)[0])
    assert "Falling back to ['CPUExecutionProvider'] and retrying." in capsys.readouterr().out


def test_a_type_no_schema_allows_is_refused_as_onnxruntime_refuses_it() -> None:
    """``Sin`` of a bfloat16 tensor: no ``Sin`` schema takes it, and onnxruntime refuses the
    model (``INVALID_GRAPH``) before any provider sees it. The session ran it on the NPU,
    which does bfloat16."""
    nodes = [h.make_node("Cast", ["X"], ["B"], to=T.BFLOAT16), h.make_node("Sin", ["B"], ["S"]),
             h.make_node("Cast", ["S"], ["Y"], to=T.FLOAT)]
    data = make(nodes, [tensor("X", shape=[4])], [tensor("Y", shape=[4])]).SerializeToString()
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(ep.InvalidGraph) as ours:
        ep.InferenceSession(data)
    assert type(theirs.value).__name__ == "InvalidGraph"
    assert str(ours.value) == str(theirs.value)


def test_an_output_numpy_cannot_hold_is_onnxruntime_runtime_error(capsys) -> None:
    """A bfloat16 output: onnxruntime's binding raises a plain ``RuntimeError`` (numpy has no
    bfloat16), not an EP fault. The session raised ``EPFail`` and its EP-error fallback
    retried the run first, printing that it did."""
    node = h.make_node("Cast", ["X"], ["Y"], to=T.BFLOAT16)
    data = make([node], [tensor("X", shape=[2])], [tensor("Y", T.BFLOAT16, [2])]
                ).SerializeToString()
    feeds = {"X": np.array([1.5, 2.0], np.float32)}
    with pytest.raises(RuntimeError) as theirs:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    with pytest.raises(ep.RuntimeException) as ours:
        ep.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert type(theirs.value) is RuntimeError
    assert str(theirs.value) in ours.value.message
    assert "Falling back" not in capsys.readouterr().out
