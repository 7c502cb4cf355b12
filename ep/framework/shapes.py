"""Shape inference and graph rewriting on a model without the bytes of its weights.

ONNX's shape inference and onnxruntime's optimizer both take a serialized model: handing them a
model of gigabytes costs a copy and a parse of every weight, although neither needs a weight's
bytes, only its type and shape. :func:`without_weights` makes the stand-in they get (each weight
a typed graph input, its data not copied); :func:`infer_shapes` infers on it and writes the
inferred types back into the real model. Data propagation still folds what shapes are computed
from: ``Shape``, small constants, ``Concat`` of them.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .wire import tensor_value_info

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
    (data propagation on) as its ``value_info``, and its outputs typed. Raises what
    ``onnx.shape_inference.infer_shapes`` raises."""
    if not strict and not _inferable(model):
        return model
    light, _ = without_weights(model)
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=strict, data_prop=True)
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
