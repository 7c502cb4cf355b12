"""Run one model on ``ep.InferenceSession`` and on onnxruntime CPU, and classify the outcome.

============================  ================================================================
outcome                       meaning
============================  ================================================================
``equal``                     every output within its dtype's tolerance of onnxruntime's
``refused-alike``             onnxruntime refused the model; ep refused with the same error class
``refused-differently``       both refused, with different error classes
``typed-error``               ep raised an :class:`ep.errors.OrtError`; onnxruntime ran it
``different``                 values, dtypes or shapes differ
``ep-ran-ort-refused``        ep returned outputs for a model onnxruntime refuses
``raw-exception``             ep raised an exception that is not an ``OrtError``
``crash`` / ``hang``          the worker process died / ran out of time in ep (see ``campaign``)
``onnxruntime-crash``         ... in onnxruntime's reference run (``onnxruntime-hang`` alike)
============================  ================================================================

``equal`` and ``refused-alike`` give onnxruntime's result. A ``different`` outcome is localized
(:func:`localize`): every intermediate tensor becomes an output, the first node whose output
differs while its inputs agree is named, and that node alone is rerun on onnxruntime with
ep's inputs; if ep's output matches that, the difference is *amplified*: tolerated differences
upstream that a discontinuous or steep op (``Floor``, ``Less``, ``Cos`` of a large value) grew.
The reference is the one :func:`ep.testing.compare.reference_outputs` picks (node by node for
float16 graphs; onnxruntime's whole-model result is accepted too). When onnxruntime refuses a
model at its default optimization level but runs it at the basic level (the one ep applies),
the basic level's result is the reference and ``reference`` says so.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ep.testing.compare import compare, reference_outputs

OK = ("equal", "refused-alike")
NPU = "NpuSimExecutionProvider"
PROVIDERS = (NPU, "CPUExecutionProvider")


def run_case(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             localize_differences: bool = True, optimize: bool = True,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The outcome of ``model`` with ``feeds``: ``outcome``, ``detail``, node counts.

    ``optimize=False`` runs ep without onnxruntime's basic graph optimizations, so the
    partitioner sees the graph as written (``Constant`` nodes, shape subgraphs unfolded), and
    judges it against onnxruntime without optimizations too. ``progress`` is told each stage
    (``"onnxruntime"``, ``"ep"``) before it starts, so a process that dies can say which one
    killed it."""
    import ep
    from ep.errors import OrtError

    result: dict[str, Any] = {"nodes": sum(n.op_type != "Constant" for n in model.graph.node),
                              "optimized": optimize}
    if progress:
        progress("onnxruntime")
    # without optimizations on both sides: onnxruntime's QDQ optimizers change values (they
    # drop a QuantizeLinear -> DequantizeLinear pair, its rounding with it)
    level = None if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want, whole, _, ort_error = reference_outputs(model, feeds, level=level)
    if ort_error is not None and (basic := _basic_reference(model, feeds)) is not None:
        # onnxruntime's own extended optimizations broke the model (its QDQ propagation
        # inserts a QuantizeLinear of the wrong type at opset 21); ep runs the basic ones
        result["reference"] = ("onnxruntime CPU at the basic optimization level; its default "
                               f"level refused the model: {_short(ort_error, 150)}")
        want = whole = basic
        ort_error = None
    options = ep.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ep.GraphOptimizationLevel.ORT_DISABLE_ALL
    if progress:
        progress("ep")
    try:
        session = ep.InferenceSession(model.SerializeToString(), options,
                                      providers=list(PROVIDERS), enable_fallback=0)
        result.update(_coverage(session))
        got = session.run(None, dict(feeds))
    except OrtError as exc:
        if ort_error is None:
            return {**result, "outcome": "typed-error", "detail": _short(exc)}
        same = type(exc).__name__ == type(ort_error).__name__
        return {**result, "outcome": "refused-alike" if same else "refused-differently",
                "detail": f"ep {type(exc).__name__}, onnxruntime {type(ort_error).__name__}: "
                          f"{_short(ort_error)}"}
    except Exception as exc:  # noqa: BLE001 - what the fuzzer exists to find
        return {**result, "outcome": "raw-exception",
                "detail": f"{type(exc).__name__}: {_short(exc)}",
                "traceback": traceback.format_exc(limit=-6)}
    if ort_error is not None:
        return {**result, "outcome": "ep-ran-ort-refused", "detail": _short(ort_error)}
    problems = _differences(model, got, want, whole)
    if not problems:
        return {**result, "outcome": "equal", "detail": ""}
    out = {**result, "outcome": "different", "detail": "; ".join(problems)}
    if localize_differences:
        out.update(localize(model, feeds, options))
    return out


def _basic_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                     ) -> list[np.ndarray] | None:
    """onnxruntime's outputs with only its basic graph optimizations, or None if it refuses
    at that level too."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(model.SerializeToString(), so,
                                       providers=["CPUExecutionProvider"])
        return session.run(None, dict(feeds))
    except Exception:  # noqa: BLE001 - refused at the basic level as well
        return None


def _coverage(session: Any) -> dict[str, int]:
    """Non-Constant nodes of the partitioned graph, and how many the NPU runs."""
    ops = {n.name: n.op_type for n in session.model.graph.node}
    assigned = session.get_node_assignment()
    real = [name for name, op in ops.items() if op != "Constant"]
    return {"partitioned_nodes": len(real),
            "npu_nodes": sum(assigned.get(name) == NPU for name in real)}


def _differences(model: onnx.ModelProto, got, want, whole) -> list[str]:
    problems = []
    names = [o.name for o in model.graph.output]
    for name, g, w, o in zip(names, got, want, whole, strict=True):
        if why := compare(np.asarray(g), np.asarray(w)):
            if w is o or compare(np.asarray(g), np.asarray(o)):
                problems.append(f"{name}: {why}")
    return problems


def localize(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             options: Any = None) -> dict[str, Any]:
    """Name the node where ep first departs from onnxruntime (see the module doc):
    ``{"culprit": op type, "amplified": bool, "where": text}``; ``options`` are ep's
    session options."""
    import ep

    exposed, order = _expose_all(model)
    level = None
    if options is not None and options.graph_optimization_level == (
            ep.GraphOptimizationLevel.ORT_DISABLE_ALL):
        level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want, whole, _, ort_error = reference_outputs(exposed, feeds, level=level)
    try:
        got = ep.InferenceSession(exposed.SerializeToString(), options,
                                  providers=list(PROVIDERS),
                                  enable_fallback=0).run(None, dict(feeds))
    except Exception as exc:  # noqa: BLE001 - exposing tensors changed the outcome
        return {"where": f"not localized: with every tensor exposed ep raised {exc!r:.200}"}
    if ort_error is not None or want is None or whole is None:
        return {"where": "not localized: onnxruntime refused the exposed model"}
    names = [o.name for o in exposed.graph.output]
    ep_values = dict(zip(names, got, strict=True))
    bad = {n for n, g, w, o in zip(names, got, want, whole, strict=True)
           if compare(np.asarray(g), np.asarray(w)) and compare(np.asarray(g), np.asarray(o))}
    for node in order:
        outs = [o for o in node.output if o in bad]
        if not outs or any(i in bad for i in node.input):
            continue
        env = {**_constants(model), **feeds, **ep_values}
        try:
            alone = _run_alone(model, node, env)
        except Exception as exc:  # noqa: BLE001
            return {"culprit": node.op_type, "where": f"{node.name}: rerun failed {exc!r:.100}"}
        amplified = all(not compare(np.asarray(ep_values[o]), np.asarray(alone[o]))
                        for o in outs)
        return {"culprit": node.op_type, "amplified": amplified,
                "where": f"{node.op_type} node {node.name!r} output {outs[0]!r}"}
    return {"where": "not localized: no tensor differs once every tensor is an output"}


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and ``Constant`` node values (``value`` attribute) by name."""
    out = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value":
                out[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    return out


def _expose_all(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """A copy with every typed intermediate tensor as a graph output; the nodes in order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in inferred.graph.value_info}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(inferred)
    have = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for o in node.output:
            if o in typed and o not in have and node.op_type != "Constant":
                exposed.graph.output.append(typed[o])
    del exposed.graph.value_info[:]
    return exposed, list(model.graph.node)


def _run_alone(model: onnx.ModelProto, node: onnx.NodeProto,
               env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [i for i in dict.fromkeys(node.input) if i]
    values = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(np.asarray(env[n]).dtype), np.shape(env[n]))
        for n in inputs]
    graph = helper.make_graph([node], "alone", values,
                              [onnx.ValueInfoProto(name=o) for o in node.output if o])
    one = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(one.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    outs = session.run(None, {n: env[n] for n in inputs})
    return dict(zip([o for o in node.output if o], outs, strict=True))


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."
