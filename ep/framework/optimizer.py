"""ONNX Runtime's basic graph optimizations, applied before partitioning.

ONNX Runtime runs its level-1 ("basic") graph transformers on the whole graph before it asks
any execution provider for capabilities: constant folding (``Shape -> Gather -> Concat`` chains
of static shapes become constants), redundant-node elimination (``Identity``, ``Dropout`` in
inference, no-op ``Cast``/``Slice``/``Expand``), ``Unsqueeze`` of constants, free-dimension
overrides. Every provider, the NPU included, therefore partitions the simplified graph. Rather
than re-implement those rewrites, :func:`optimize` asks onnxruntime itself: a CPU session at
``ORT_ENABLE_BASIC`` with ``optimized_model_filepath`` writes the graph it would partition.

Two rules keep it safe:

* **No weight is stored twice.** Constant folding makes new initializers. When a large weight
  has several consumers (a tied embedding read by ``Gather`` and, transposed, by the output
  projection), folding one consumer's path would keep the original *and* a transformed copy.
  Such weights are shielded: presented to onnxruntime as graph inputs, so nothing derived from
  them folds, and restored as initializers afterwards.
* **Best effort, never a failure.** A model onnxruntime's CPU provider cannot load (an operator
  it lacks, an ``EPContext`` node, a custom domain) is partitioned as it is: the optimizations
  are a simplification, and the session's own checks report what is really wrong.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import helper

SHIELD_BYTES = 1024
"""Initializers at least this large with more than one consumer are never folded."""

_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def optimize(model: onnx.ModelProto, level: int,
             free_dims: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """The graph onnxruntime would partition at optimization ``level`` (0: ``model`` itself).

    Levels above basic apply only the basic transformers here: the extended and layout ones
    rewrite into contrib operators for onnxruntime's own kernels, which ONNX Runtime applies
    after partitioning, to the nodes its CPU provider was assigned.
    """
    if int(level) < int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC) or not _optimizable(model):
        return model
    shielded = _shield_shared_weights(model)
    with tempfile.TemporaryDirectory(prefix="npusim-opt-") as tmp:
        target = Path(tmp) / "optimized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(target)
        options.log_severity_level = 4
        options.intra_op_num_threads = 1
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.data")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        for name, value in (free_dims or {}).items():
            options.add_free_dimension_override_by_name(name, int(value))
        try:
            ort.InferenceSession(_serialize(shielded.model, Path(tmp)), options,
                                 providers=["CPUExecutionProvider"])
            optimized = onnx.load(str(target), load_external_data=True)
        except Exception:  # onnxruntime cannot load it: partition the model as given
            return model
    return _tidy_inputs(shielded.restore(optimized, model), model)


def _tidy_inputs(optimized: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
    """Graph inputs as the source declares them, less the initializers folding removed: an
    initializer listed as a graph input (IR < 4 models) whose consumers were folded away is
    gone from the optimized model, but onnxruntime leaves its input entry behind."""
    initialized = {t.name: t for t in optimized.graph.initializer}
    required = {i.name for i in source.graph.input} - {t.name for t in source.graph.initializer}
    kept = []
    for entry in optimized.graph.input:
        if entry.name in required:
            kept.append(entry)
        elif entry.name in initialized:  # typed by its initializer: onnxruntime drops the shape
            tensor = initialized[entry.name]
            kept.append(helper.make_tensor_value_info(entry.name, tensor.data_type,
                                                      list(tensor.dims)))
    del optimized.graph.input[:]
    optimized.graph.input.extend(kept)
    # IR 3 requires every initializer to be a graph input; onnxruntime's output does not list
    # them, which IR 4 (initializers need not be inputs) describes exactly.
    optimized.ir_version = max(optimized.ir_version, 4)
    # onnxruntime imports every domain it knows; keep the source's, and any a rewrite used.
    used = {n.domain for n in optimized.graph.node}
    known = {o.domain for o in source.opset_import}
    opsets = [o for o in optimized.opset_import if o.domain in known or o.domain in used]
    del optimized.opset_import[:]
    optimized.opset_import.extend(opsets)
    return optimized


def _optimizable(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime's CPU provider could load the whole model: standard domains only
    (no EPContext nodes, no custom operators)."""
    domains = {n.domain for n in model.graph.node}
    return domains <= set(_STANDARD_DOMAINS) and model.graph.node


def _serialize(model: onnx.ModelProto, folder: Path) -> str | bytes:
    """Bytes for onnxruntime; a file (with external data) when the model passes protobuf's
    2 GiB limit."""
    if model.ByteSize() < (1 << 31) - (1 << 20):
        return model.SerializeToString()
    path = folder / "source.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="source.data")
    return os.fspath(path)


class _Shielded:
    """A copy of a model whose shared large weights are graph inputs, and how to undo it."""

    def __init__(self, model: onnx.ModelProto, names: list[str]) -> None:
        self.model = model
        self.names = names

    def restore(self, optimized: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
        """``optimized`` with the shielded weights initializers again, as in ``source``."""
        if not self.names:
            return optimized
        wanted = set(self.names)
        originals = {t.name: t for t in source.graph.initializer if t.name in wanted}
        declared = {i.name for i in source.graph.input}
        kept = [i for i in optimized.graph.input if i.name not in wanted or i.name in declared]
        del optimized.graph.input[:]
        optimized.graph.input.extend(kept)
        used = {i for node in optimized.graph.node for i in node.input} | \
            {o.name for o in optimized.graph.output}
        optimized.graph.initializer.extend(originals[n] for n in self.names if n in used)
        return optimized


def _shield_shared_weights(model: onnx.ModelProto) -> _Shielded:
    consumers: dict[str, int] = {}
    for node in model.graph.node:
        for name in set(node.input):
            consumers[name] = consumers.get(name, 0) + 1
    names = [t.name for t in model.graph.initializer
             if consumers.get(t.name, 0) > 1 and _nbytes(t) >= SHIELD_BYTES]
    if not names:
        return _Shielded(model, [])
    shielded = onnx.ModelProto()
    shielded.CopyFrom(model)
    wanted = set(names)
    kept = [t for t in shielded.graph.initializer if t.name not in wanted]
    inits = {t.name: t for t in shielded.graph.initializer if t.name in wanted}
    del shielded.graph.initializer[:]
    shielded.graph.initializer.extend(kept)
    declared = {i.name for i in shielded.graph.input}
    shielded.graph.input.extend(
        helper.make_tensor_value_info(n, inits[n].data_type, list(inits[n].dims))
        for n in names if n not in declared)
    return _Shielded(shielded, names)


def _nbytes(tensor: onnx.TensorProto) -> int:
    """The tensor's size in bytes (0 for a type numpy has no size for)."""
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return 0
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize
