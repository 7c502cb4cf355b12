"""Shape inference and graph rewriting on a model without the bytes of its weights.

ONNX's shape inference and onnxruntime's optimizer both take a serialized model: handing them a
model of gigabytes costs a copy and a parse of every weight, although neither needs a weight's
bytes, only its type and shape. :func:`without_weights` makes the stand-in they get (each weight
a typed graph input, its data not copied); :func:`infer_shapes` infers on it and writes the
inferred types back into the real model. Data propagation still folds what shapes are computed
from: ``Shape``, small constants, ``Concat`` of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from .wire import tensor_value_info

INVENTED = "unk__"
"""The prefix of the names ONNX shape inference gives the dims it cannot work out."""

WEIGHT_BYTES = 1024
"""Initializers at least this large are weights: never folded, never copied for inference."""


def nbytes(tensor: onnx.TensorProto) -> int:
    """The tensor's size in bytes (0 for a type numpy has no size for)."""
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return 0
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize


def without_weights(model: onnx.ModelProto, threshold: int = WEIGHT_BYTES
                    ) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``model`` whose weights are typed graph inputs (their data not copied), and
    the index of each weight among the model's initializers."""
    weights = {t.name: k for k, t in enumerate(model.graph.initializer) if nbytes(t) >=
               threshold and t.data_type != onnx.TensorProto.STRING}
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version",
                  "doc_string"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.metadata_props.extend(model.metadata_props)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name, graph.doc_string = source.name, source.doc_string
    graph.node.extend(source.node)
    graph.input.extend(i for i in source.input if i.name not in weights)
    for name, k in weights.items():  # built in the graph's arena (wire.tensor_value_info)
        tensor = source.initializer[k]
        graph.input.add().MergeFromString(tensor_value_info(name, tensor.data_type,
                                                            tensor.dims))
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.initializer.extend(t for t in source.initializer if t.name not in weights)
    graph.sparse_initializer.extend(source.sparse_initializer)
    return light, weights


def infer_shapes(model: onnx.ModelProto, *, strict: bool = False) -> onnx.ModelProto:
    """``model`` (modified in place and returned) with every type ONNX shape inference finds
    (data propagation on) as its ``value_info``, and its outputs typed; declared types that
    inference contradicts resolved as onnxruntime resolves them (module docstring) unless
    ``strict``. Raises what ``onnx.shape_inference.infer_shapes`` raises."""
    if not strict and not _inferable(model):
        return model
    light, _ = without_weights(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError:
        if strict:
            raise
        inferred = _infer_resolving(light)
    graph = model.graph
    del graph.value_info[:]
    graph.value_info.extend(inferred.graph.value_info)
    if len(inferred.graph.output) == len(graph.output):
        del graph.output[:]
        graph.output.extend(inferred.graph.output)
    return model


def _inferable(model: onnx.ModelProto) -> bool:
    """Whether ONNX shape inference can type anything in ``model``: some node is an operator
    ONNX has a schema for or a function of the model. An EPContext model's nodes are neither
    (``com.microsoft`` contrib operators); inferring it copied and serialized the model for
    nothing, 2% of a small model's EPContext load."""
    functions = {(f.domain, f.name) for f in model.functions}
    return any(onnx.defs.has(node.op_type, "" if node.domain == "ai.onnx" else node.domain)
               or (node.domain, node.op_type) in functions for node in model.graph.node)


def _infer_resolving(light: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference (not strict) of ``light`` (edited), its declared types resolved as
    onnxruntime resolves them: a type inference contradicted is what the nodes reading it see,
    as onnxruntime's graph holds it, not refined by inferring its producer again. So each such
    tensor is inferred as a graph input of its resolved type, its producer writing a tensor of
    another name, whose type is dropped."""
    contradicted = _resolve_declared(light)
    graph = light.graph
    produced: set[str] = set()
    if contradicted:
        taken = {o for node in graph.node for o in node.output} | {i.name for i in graph.input}
        for node in graph.node:
            for k, out in enumerate(node.output):
                if out in contradicted:
                    node.output[k] = _free(f"{out}.produced", taken)
                    produced.add(node.output[k])
        graph.input.extend(helper.make_value_info(n, t) for n, t in contradicted.items())
        kept = [vi for vi in graph.value_info if vi.name not in contradicted]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    result = inferred.graph
    outputs = {o.name for o in result.output}
    kept = [vi for vi in result.value_info if vi.name not in produced]
    del result.value_info[:]
    result.value_info.extend(kept)
    result.value_info.extend(helper.make_value_info(n, t) for n, t in contradicted.items()
                             if n not in outputs)
    for output in result.output:
        if output.name in contradicted:
            output.type.CopyFrom(contradicted[output.name])
    return inferred


def _free(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with a number, not in ``taken`` (which it joins)."""
    free, k = name, 0
    while free in taken:
        k += 1
        free = f"{name}{k}"
    taken.add(free)
    return free


def _resolve_declared(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Make the tensor types ``model`` declares for node outputs agree with what inference
    finds when nothing is declared, as onnxruntime merges them (module docstring); the types
    inference contradicted, as resolved."""
    graph = model.graph
    declared = [vi for vi in (*graph.value_info, *graph.output)
                if vi.type.tensor_type.HasField("shape")]
    if not declared:
        return {}
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for output in bare.graph.output:
        output.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(bare, data_prop=True).graph
    found = {vi.name: vi.type for vi in (*inferred.value_info, *inferred.output)}
    named = {d.dim_param for vi in (*graph.input, *declared)
             for d in vi.type.tensor_type.shape.dim}
    contradicted = {}
    for vi in declared:
        source = found.get(vi.name)
        if source is not None and source.tensor_type.HasField("shape") and not _merge(
                source.tensor_type.shape, vi.type.tensor_type, named):
            contradicted[vi.name] = resolved = onnx.TypeProto()
            resolved.CopyFrom(vi.type)
    return contradicted


def _merge(source: onnx.TensorShapeProto, target: onnx.TypeProto.Tensor,
           named: set[str]) -> bool:
    """onnxruntime's ``MergeShapeInfo`` of an inferred shape into a declared tensor type:
    ONNX's ``mergeInShapeInfo`` (True), and where that fails, ``UnionShapeInfo`` (False). The
    names inference invented (not in ``named``) are unknown dims, as onnxruntime's inference
    leaves them."""
    dims = [None if d.dim_param.startswith(INVENTED) and d.dim_param not in named else d
            for d in source.dim]
    shape = target.shape
    if len(dims) != len(shape.dim):
        target.ClearField("shape")
        return False
    for s, t in zip(dims, shape.dim, strict=True):  # ONNX's mergeInDimensionInfo
        if s is None:
            continue
        if s.HasField("dim_value"):
            if t.HasField("dim_value") and t.dim_value != s.dim_value:
                _union(dims, shape.dim)  # over every dim, those merged before this one too
                return False
            t.dim_value = s.dim_value
        elif not t.HasField("dim_value") and not t.HasField("dim_param") and s.dim_param:
            t.dim_param = s.dim_param
    return True


def _union(source: list[onnx.TensorShapeProto.Dimension | None],
           target: Sequence[onnx.TensorShapeProto.Dimension]) -> None:
    """ONNX's ``UnionShapeInfo`` over dims of equal rank: a declared dim the inferred one does
    not equal (an unknown inferred dim included) becomes unknown."""
    for s, t in zip(source, target, strict=True):
        if not t.HasField("dim_value") and not t.HasField("dim_param"):
            continue
        same = s is not None and (
            (s.HasField("dim_value") and t.HasField("dim_value") and s.dim_value == t.dim_value)
            or (s.HasField("dim_param") and t.HasField("dim_param")
                and s.dim_param == t.dim_param))
        if not same:
            t.ClearField("dim_value")
            t.ClearField("dim_param")
