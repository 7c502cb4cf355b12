"""``assert_matches_onnxruntime``: the model on ``ep.InferenceSession`` against onnxruntime CPU.

Tolerances follow the dtype of each output:

==========================  ===============================================================
float32, float64            ``|got - want| <= atol + rtol * |want|``, rtol 1e-4, atol 1e-5
float16, bfloat16           at most ``ulps`` (1) units in the last place apart
integers, bool, strings     exactly equal
quantized (u)int8 outputs   at most ``quant_steps`` (1) quantization step apart: an output
                            made by QuantizeLinear / QLinear* (through layout ops)
==========================  ===============================================================

NaN must match NaN and infinities must match in sign, everywhere. A graph with float16 or
bfloat16 tensors is compared against onnxruntime run *node by node* (one-node sessions, so every
tensor is rounded to its type as ONNX defines), because onnxruntime's CPU provider runs many
float16 chains in float32 between the casts it inserts, which rounds less often than the model
says. An output matching onnxruntime's whole-model result is accepted as well (that is
what an EP delegating to onnxruntime computes); the failure message says which reference it
used.

When onnxruntime refuses the model (or its inputs) the EP must refuse too, with a typed
:class:`ep.errors.OrtError`. On any mismatch the model, the inputs and onnxruntime's outputs are
saved in the layout of onnx's backend test cases (``model.onnx``,
``test_data_set_0/input_K.pb``, ``output_K.pb``) plus ``case.json``, in a new folder under
``$EP_TESTING_FAILURES`` (default: the system temp folder) that the message names;
:func:`replay` reruns the comparison from it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from .strategies import random_inputs

DEFAULT_PROVIDERS = ("NpuSimExecutionProvider", "CPUExecutionProvider")
HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                            "QLinearMatMul", "QLinearAdd", "QLinearMul", "QGemm",
                            "QLinearAveragePool", "QLinearGlobalAveragePool",
                            "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat"})
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                        "MaxPool", "Concat", "Split", "Slice", "Gather", "Pad", "Expand",
                        "Resize", "DepthToSpace", "SpaceToDepth", "Tile"})
NODE_BY_NODE = ("onnxruntime run node by node (one-node sessions: every tensor rounded to its "
                "type as ONNX defines), because onnxruntime's CPU provider runs many float16 "
                "chains in float32 between the casts it inserts; onnxruntime's whole-model "
                "result differs too")


class Mismatch(AssertionError):
    """The EP and onnxruntime disagree; ``folder`` holds the saved, replayable case."""

    def __init__(self, message: str, folder: Path | None) -> None:
        super().__init__(message)
        self.folder = folder


def assert_matches_onnxruntime(
    model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    feeds: Mapping[str, np.ndarray] | None = None,
    providers: Sequence[Any] | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    ulps: int = 1,
    quant_steps: int = 1,
    sess_options: Any = None,
) -> list[np.ndarray] | None:
    """Run ``model`` on ``ep.InferenceSession`` (``providers``, default NPU then CPU) and on
    onnxruntime's CPU provider with ``feeds`` (default: deterministic normal values) and raise
    :class:`Mismatch` unless every output agrees within the tolerances of its dtype (see the
    module doc). Returns the EP's outputs, or None when both refused the model alike."""
    import ep
    from ep.errors import OrtError

    proto, source = _load(model)
    feeds = dict(random_inputs(proto, 0) if feeds is None else feeds)
    want, whole, reference, ort_error = reference_outputs(proto, feeds, source)
    chosen = list(DEFAULT_PROVIDERS if providers is None else providers)
    tolerances = dict(rtol=rtol, atol=atol, ulps=ulps, quant_steps=quant_steps)

    def fail(problem: str) -> Mismatch:
        folder = save_case(proto, feeds, want, {"providers": [_provider_name(p) for p in chosen],
                                                "tolerances": tolerances, "problem": problem})
        return Mismatch(f"{problem}\nreference: {reference}\nsaved to {folder} (replay: "
                        f"python -m ep.testing replay {folder})", folder)

    try:
        session = ep.InferenceSession(source, sess_options, providers=chosen,
                                      enable_fallback=0)  # an NPU fault is not re-run on CPU
        got = session.run(None, feeds)
    except OrtError as exc:
        if ort_error is not None:
            return None
        raise fail(f"ep raised {type(exc).__name__}: {exc}; onnxruntime ran the model") from exc
    except Exception as exc:
        raise fail(f"ep raised an untyped {type(exc).__name__}: {exc} (onnxruntime "
                   f"{'refused too: ' + str(ort_error) if ort_error else 'ran the model'})"
                   ) from exc
    if ort_error is not None:
        raise fail(f"onnxruntime refused the model ({type(ort_error).__name__}: {ort_error}) "
                   "but ep returned outputs")
    assert want is not None
    names = [o.name for o in proto.graph.output]
    quantized = quantized_outputs(proto)
    problems = []
    assert whole is not None
    for name, g, w, o in zip(names, got, want, whole, strict=True):
        q = name in quantized
        if why := compare(np.asarray(g), np.asarray(w), quantized=q, **tolerances):
            if w is o or compare(np.asarray(g), np.asarray(o), quantized=q, **tolerances):
                problems.append(f"output {name!r}: {why}")
    if len(got) != len(want):
        problems.append(f"ep returned {len(got)} outputs, onnxruntime {len(want)}")
    if problems:
        raise fail("ep differs from onnxruntime:\n  " + "\n  ".join(problems))
    return list(got)


def reference_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                      source: str | bytes | None = None, level: Any = None) -> tuple[
        list[np.ndarray] | None, list[np.ndarray] | None, str, Exception | None]:
    """onnxruntime's answer for ``model``: ``(want, whole, label, error)``.

    ``whole`` is onnxruntime's whole-model result; ``want`` the reference to hold the EP to:
    ``whole``, or for a graph with float16/bfloat16 tensors onnxruntime run node by node
    (``label`` says which). ``error`` is onnxruntime's exception when it refused the model or
    its inputs (then both outputs are None). ``source`` is the model's path or bytes when
    onnxruntime should load it from there (external data); ``level`` an
    ``onnxruntime.GraphOptimizationLevel`` for the whole-model session (default: onnxruntime's).
    """
    half = _has_half_tensors(model)
    label = NODE_BY_NODE if half else "onnxruntime CPU (whole model)"
    try:
        whole = _cpu_session(model if source is None else source, level).run(None, dict(feeds))
        want = _node_by_node(model, feeds) if half and not _has_subgraphs(model) else whole
    except Exception as exc:  # noqa: BLE001 - any onnxruntime failure is "it refused"
        return None, None, label, exc
    return want, whole, label, None


def compare(got: np.ndarray, want: np.ndarray, *, rtol: float = 1e-4, atol: float = 1e-5,
            ulps: int = 1, quant_steps: int = 1, quantized: bool = False) -> str | None:
    """None if ``got`` matches ``want`` within the tolerance of ``want``'s dtype, else why."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, onnxruntime {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape}, onnxruntime {want.shape}"
    if got.size == 0:
        return None
    kind = want.dtype
    if kind.kind == "f" or kind.name == "bfloat16":
        with np.errstate(invalid="ignore"):
            return _compare_floats(got, want, rtol, atol, ulps)
    if quantized and kind.kind in "iu":
        dist = np.abs(got.astype(np.int64) - want.astype(np.int64))
        if (dist > quant_steps).any():
            k = tuple(int(i) for i in np.argwhere(dist > quant_steps)[0])
            return (f"{int((dist > quant_steps).sum())} elements more than {quant_steps} "
                    f"quantization step apart; first at {k}: {got[k]} vs {want[k]}")
        return None
    if not np.array_equal(got, want):
        k = tuple(int(i) for i in np.argwhere(got != want)[0])
        return (f"{int((got != want).sum())} of {want.size} elements differ (exact dtype "
                f"{kind}); first at {k}: {got[k]} vs {want[k]}")
    return None


def _compare_floats(got: np.ndarray, want: np.ndarray, rtol: float, atol: float,
                    ulps: int) -> str | None:
    wide = want.astype(np.float64)
    g64 = got.astype(np.float64)
    nan_diff = np.isnan(g64) != np.isnan(wide)
    inf_diff = (np.isinf(wide) | np.isinf(g64)) & (g64 != wide) & ~np.isnan(wide)
    odd = nan_diff | inf_diff
    if odd.any():
        k = tuple(int(i) for i in np.argwhere(odd)[0])
        return (f"{int(odd.sum())} elements differ in NaN/Inf; first at {k}: {got[k]} vs "
                f"{want[k]}")
    finite = np.isfinite(wide)
    if want.dtype.itemsize == 2:
        dist = np.abs(_ordered(got) - _ordered(want))
        bad = finite & (dist > ulps)
        if bad.any():
            k = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{int(bad.sum())} of {want.size} elements more than {ulps} ulp apart; "
                    f"first at {k}: {got[k]} vs {want[k]} ({int(dist[k])} ulp)")
        return None
    err = np.where(finite, np.abs(g64 - wide), 0.0)
    bad = err > atol + rtol * np.abs(np.where(finite, wide, 0.0))
    if bad.any():
        k = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} of {want.size} elements beyond rtol {rtol} / atol {atol}; "
                f"first at {k}: {got[k]} vs {want[k]}; max abs error {err.max():g}")
    return None


def _ordered(a: np.ndarray) -> np.ndarray:
    """16-bit floats as integers in value order (ulp distance is a difference of these)."""
    bits = a.view(np.uint16).astype(np.int64)
    mag = bits & 0x7FFF
    return np.where(bits & 0x8000, -mag, mag)


# -- references ----------------------------------------------------------------------------


def _load(model: onnx.ModelProto | str | os.PathLike[str] | bytes
          ) -> tuple[onnx.ModelProto, str | bytes]:
    """The model and what the sessions are given. A path is read as a session reads it (its
    external data found and checked as onnxruntime does, ``ep.framework.external_data``): a
    file neither could load raises the session's error."""
    if isinstance(model, onnx.ModelProto):
        return model, model.SerializeToString()
    if isinstance(model, bytes):
        return onnx.load_from_string(model), model
    from ep.framework.pipeline import load_model

    return load_model(os.fspath(model), {})[0], os.fspath(model)


def _has_half_tensors(model: onnx.ModelProto) -> bool:
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    if any(v.type.tensor_type.elem_type in HALF_TYPES for v in values):
        return True
    if any(t.data_type in HALF_TYPES for t in graph.initializer):
        return True
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    except Exception:  # noqa: BLE001 - no inference: judge by what the model declares
        return False
    return any(v.type.tensor_type.elem_type in HALF_TYPES for v in inferred)


def _cpu_session(model: onnx.ModelProto | str | bytes, level: Any = None
                 ) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    if level is not None:
        so.graph_optimization_level = level
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _has_subgraphs(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def _node_by_node(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Each node in its own onnxruntime session, in a topological order."""
    env: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t)
                                  for t in model.graph.initializer}
    env.update(feeds)
    pending = list(model.graph.node)
    while pending:
        ready = [n for n in pending if all(not i or i in env for i in n.input)]
        if not ready:
            raise ValueError("the graph has a cycle or reads a tensor nothing produces")
        for node in ready:
            env.update(zip(node.output, _run_node(model, node, env), strict=True))
            pending.remove(node)
    return [env[o.name] for o in model.graph.output]


def _run_node(model: onnx.ModelProto, node: onnx.NodeProto,
              env: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    inputs = [i for i in dict.fromkeys(node.input) if i]
    values = []
    for name in inputs:
        arr = np.asarray(env[name])
        elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
        values.append(helper.make_tensor_value_info(name, elem, arr.shape))
    outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = helper.make_graph([node], "one_node", values, outputs)
    one = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    results = _cpu_session(one).run(None, {n: env[n] for n in inputs})
    it = iter(results)
    return [next(it) if o else np.empty(0) for o in node.output]


def quantized_outputs(model: onnx.ModelProto) -> set[str]:
    """The graph outputs produced by quantization (judged within one quantization step)."""
    producer = {o: n for n in model.graph.node for o in n.output}

    def quantized(tensor: str, depth: int = 0) -> bool:
        node = producer.get(tensor)
        if node is None or depth > 64:
            return False
        if node.op_type in QUANTIZING_OPS:
            return True
        return node.op_type in LAYOUT_OPS and bool(node.input) and quantized(node.input[0],
                                                                            depth + 1)

    return {o.name for o in model.graph.output if quantized(o.name)}


# -- saved cases -----------------------------------------------------------------------------


def _provider_name(p: Any) -> Any:
    if isinstance(p, str):
        return p
    if isinstance(p, tuple | list):
        return [_provider_name(p[0]), {str(k): str(v) for k, v in dict(p[1]).items()}]
    return getattr(p, "type", type(p).__name__)


def save_case(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
              outputs: Sequence[np.ndarray] | None, info: Mapping[str, Any]) -> Path:
    """Write a replayable case (onnx backend test layout plus ``case.json``); its folder."""
    base = os.environ.get("EP_TESTING_FAILURES") or None
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ep-mismatch-", dir=base))
    onnx.save(model, folder / "model.onnx")
    data = folder / "test_data_set_0"
    data.mkdir()
    for k, (name, arr) in enumerate(feeds.items()):
        (data / f"input_{k}.pb").write_bytes(
            numpy_helper.from_array(np.asarray(arr), name).SerializeToString())
    names = [o.name for o in model.graph.output]
    for k, (name, arr) in enumerate(zip(names, outputs or [], strict=False)):
        (data / f"output_{k}.pb").write_bytes(
            numpy_helper.from_array(np.asarray(arr), name).SerializeToString())
    (folder / "case.json").write_text(json.dumps(dict(info), indent=2, default=str))
    return folder


def load_case(folder: str | os.PathLike[str]) -> tuple[onnx.ModelProto,
                                                       dict[str, np.ndarray], dict[str, Any]]:
    """The model, the inputs and ``case.json`` of a case saved by a failed comparison."""
    folder = Path(folder)
    model = onnx.load(folder / "model.onnx")
    feeds = {}
    for path in sorted((folder / "test_data_set_0").glob("input_*.pb"),
                       key=lambda p: int(p.stem.split("_")[1])):
        tensor = onnx.TensorProto()
        tensor.ParseFromString(path.read_bytes())
        feeds[tensor.name] = numpy_helper.to_array(tensor)
    return model, feeds, json.loads((folder / "case.json").read_text())


def replay(folder: str | os.PathLike[str],
           providers: Sequence[Any] | None = None) -> list[np.ndarray] | None:
    """Rerun :func:`assert_matches_onnxruntime` on a saved case, with its tolerances and its
    providers (registered names; pass ``providers`` for an EP given as an instance)."""
    model, feeds, info = load_case(folder)
    if providers is None:
        providers = [tuple(p) if isinstance(p, list) else p for p in info["providers"]]
    return assert_matches_onnxruntime(model, feeds, providers, **info["tolerances"])
