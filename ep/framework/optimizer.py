"""ONNX Runtime's basic graph optimizations, applied before partitioning.

ONNX Runtime runs its level-1 ("basic") graph transformers on the whole graph before it asks
any execution provider for capabilities: constant folding (``Shape -> Gather -> Concat`` chains
of static shapes become constants), redundant-node elimination (``Identity``, ``Dropout`` in
inference, no-op ``Cast``/``Slice``/``Expand``), ``Unsqueeze`` of constants, free-dimension
overrides. Every provider, the NPU included, therefore partitions the simplified graph. Rather
than re-implement those rewrites, :func:`optimize` asks onnxruntime itself: a CPU session at
``ORT_ENABLE_BASIC`` with ``optimized_model_filepath`` writes the graph it would partition.

What onnxruntime is shown is the model without its weights. Every initializer of
:data:`WEIGHT_BYTES` or more becomes a typed graph input of the copy it optimizes, and goes back
as the same initializer afterwards. So:

* **no weight is ever stored twice.** Folding a path from a weight makes a new initializer
  beside the old one whenever the weight has another consumer (a tied embedding read by
  ``Gather`` and, transposed, by the output projection): a 475 MiB GPT-2 then needs 618 MiB.
  Weights are not folded here; each provider folds what it runs (the NPU compiler folds
  constant transposes, batch norms and dequantization into the weights it stores, onnxruntime's
  CPU sessions optimize their partitions);
* shape arithmetic, scalars and small constants fold exactly as in ONNX Runtime;
* the cost is onnxruntime's on a graph of kilobytes, not a copy and a re-parse of gigabytes.

The optimization is best effort: a model onnxruntime's CPU provider cannot load (an operator it
lacks, an ``EPContext`` node, a custom domain) is partitioned as it is, and the session's own
checks then report what is really wrong.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph as OrtInvalidGraph

from npu_sim.errors import KernelError
from npu_sim.kernels import limits

from ..errors import Fail, InvalidGraph
from . import optimized_graphs
from .lru import MISSING
from .optimized_graphs import GRAPHS
from .shapes import WEIGHT_BYTES, without_weights

_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def optimize(model: onnx.ModelProto, level: int,
             free_dims: Mapping[str, int] | None = None, *,
             in_place: bool = False) -> onnx.ModelProto:
    """The graph onnxruntime would partition at optimization ``level`` (below basic: ``model``).

    With ``in_place`` the result is ``model`` itself, edited: its weights stay where they are
    (a session's freshly loaded model; nothing of gigabytes is copied). Otherwise ``model`` is
    left alone and the result is a new model.

    Levels above basic apply only the basic transformers here: the extended and layout ones
    rewrite into contrib operators for onnxruntime's own kernels, which ONNX Runtime applies
    after partitioning, to the nodes its CPU provider was assigned.
    """
    if int(level) < int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC) or not _optimizable(model):
        return model
    light, weights = without_weights(model, WEIGHT_BYTES)
    generators = _hide_generated_weights(light)
    shown = light.SerializeToString()
    dims = dict(free_dims or {})
    k = optimized_graphs.key(shown, dims)
    written = GRAPHS.lookup(k)
    if written is MISSING:
        written = _optimized_by_onnxruntime(shown, dims)
        GRAPHS.put(k, written)
    if isinstance(written, (InvalidGraph, Fail)):  # raised anew: no traceback in the cache
        raise type(written)(written.message)
    if written is None:  # onnxruntime cannot load it: partition the model as given
        return model
    try:  # a new graph each time (_restore edits it); every initializer is inline
        optimized = onnx.ModelProto.FromString(written)
    except DecodeError:  # not a model: partition the model as given
        return model
    return _restore(optimized, model, weights, generators, in_place)


_IR_TOO_NEW = "Unsupported model IR version"
"""How onnxruntime's ``Fail`` begins for a model of an IR version newer than it reads."""


def _optimized_by_onnxruntime(shown: bytes, free_dims: Mapping[str, int]
                              ) -> bytes | InvalidGraph | Fail | None:
    """The serialized graph onnxruntime's basic optimization makes of the serialized model
    ``shown``, with ``free_dims`` overridden; None when it cannot load it (a kernel its CPU
    provider lacks: another provider may take the node). A model it refuses before any
    provider sees it, a graph it finds invalid (an operator or a type no schema has) or an IR
    version newer than it reads, is its error (``InvalidGraph``, ``Fail``), returned to be
    raised."""
    # A file, not a folder, and in memory where the system has a tmpfs: making and removing a
    # temporary folder on this machine's ext4 (mounted with discard) costs ~4 ms, a quarter of
    # a small model's session creation; a file there ~1.5 ms, in /dev/shm ~0.2 ms.
    folder = _scratch_folder(len(shown))
    try:
        with tempfile.NamedTemporaryFile(prefix="npusim-opt-", suffix=".onnx", dir=folder,
                                         delete=False) as scratch:
            target = Path(scratch.name)
    except OSError as exc:
        raise Fail(f"cannot create a scratch file for onnxruntime's graph optimization in "
                   f"{folder or tempfile.gettempdir()}: {exc}") from None
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(target)
        options.log_severity_level = 4
        options.intra_op_num_threads = 1
        for dim, value in free_dims.items():
            options.add_free_dimension_override_by_name(dim, int(value))
        try:
            ort.InferenceSession(shown, options, providers=["CPUExecutionProvider"])
            return target.read_bytes()
        except OrtInvalidGraph as exc:  # its graph checks (types, shapes) come before any EP
            return InvalidGraph(str(exc).partition("INVALID_GRAPH : ")[2] or str(exc))
        except OrtFail as exc:
            if _IR_TOO_NEW not in str(exc):  # a CPU kernel's refusal: another EP may take it
                return None
            return Fail(str(exc).partition("FAIL : ")[2] or str(exc))
        except Exception:  # onnxruntime cannot load it (a kernel its CPU provider lacks...)
            return None
    finally:
        target.unlink(missing_ok=True)


def _scratch_folder(size: int) -> str | None:
    """``/dev/shm`` if this system has it writable with room for a file of ``size`` bytes
    several times over, else None (the default temporary folder, which ``TMPDIR`` sets)."""
    shm = "/dev/shm"
    try:
        stat = os.statvfs(shm)
    except OSError:
        return None
    room = stat.f_bavail * stat.f_frsize
    return shm if os.access(shm, os.W_OK | os.X_OK) and room > 4 * size + (1 << 20) else None


def _hide_generated_weights(light: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Take out of ``light`` the nodes that generate a weight from a constant shape
    (``ConstantOfShape`` of at least :data:`WEIGHT_BYTES`, as some exporters write weights), so
    that onnxruntime does not materialize them; their outputs become typed graph inputs. Returns
    the nodes taken out."""
    shapes = {t.name: t for t in light.graph.initializer
              if t.data_type == onnx.TensorProto.INT64 and len(t.dims) == 1}
    generators, kept = [], []
    for node in light.graph.node:
        shape = shapes.get(node.input[0]) if node.op_type == "ConstantOfShape" and \
            node.domain in ("", "ai.onnx") and node.input else None
        if shape is None:  # not a generator: its attributes are not read (protobuf is slow)
            kept.append(node)
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        elem = value.data_type if value is not None else onnx.TensorProto.FLOAT
        if elem == onnx.TensorProto.STRING:
            kept.append(node)
            continue
        dims = numpy_helper.to_array(shape).tolist()
        itemsize = helper.tensor_dtype_to_np_dtype(elem).itemsize
        count = 1
        for d in dims:
            count *= max(int(d), 0)
        if count * itemsize < WEIGHT_BYTES:
            kept.append(node)
            continue
        generators.append(node)
        light.graph.input.append(helper.make_tensor_value_info(node.output[0], elem, dims))
    if generators:
        del light.graph.node[:]
        light.graph.node.extend(kept)
    return generators


def _optimizable(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime's CPU provider could load the whole model: standard domains only
    (no EPContext nodes, no custom operators) and no subgraph attributes, whose outer-scope
    weights would be hidden from it."""
    if not model.graph.node:
        return False
    sizes = {t.name: t for t in model.graph.initializer
             if t.data_type == onnx.TensorProto.INT64 and len(t.dims) == 1}
    for node in model.graph.node:
        if node.domain not in _STANDARD_DOMAINS:
            return False
        if node.op_type in SIZED_BY_VALUE and _too_large(node, sizes):
            return False
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            return False
    return True


SIZED_BY_VALUE = {"ConstantOfShape": 0, "Expand": 1}
"""Ops whose output shape is an input's value: folding a huge one would allocate it."""


def _too_large(node: onnx.NodeProto, shapes: Mapping[str, onnx.TensorProto]) -> bool:
    """Whether folding ``node`` would make a tensor over the kernels' size limit; such a model
    is left to the providers, whose kernels refuse it with a typed error."""
    index = SIZED_BY_VALUE[node.op_type]
    tensor = shapes.get(node.input[index]) if len(node.input) > index else None
    if tensor is None:
        return False
    try:
        limits.check_elements(node.op_type, "output", numpy_helper.to_array(tensor).tolist())
    except (KernelError, ValueError, TypeError):
        return True
    return False


def _restore(optimized: onnx.ModelProto, source: onnx.ModelProto,
             weights: Mapping[str, int], generators: list[onnx.NodeProto],
             in_place: bool) -> onnx.ModelProto:
    """``optimized`` with the source's weights back as initializers and its weight generators
    as nodes, graph inputs as the source declares them (less initializers folding removed), and
    the source's opset imports; ``in_place``: that graph transplanted into ``source``."""
    graph = optimized.graph
    used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    wanted = [n for n in generators if n.output[0] in used]
    if wanted:
        nodes = [*wanted, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
        shape_inputs = {n.input[0] for n in wanted}
        missing = shape_inputs - {t.name for t in graph.initializer}
        graph.initializer.extend(t for t in source.graph.initializer if t.name in missing)
        used |= shape_inputs
    kept = {name for name in weights if name in used}
    initialized = {t.name: t for t in graph.initializer}
    initialized.update((name, source.graph.initializer[weights[name]]) for name in kept)
    required = {i.name for i in source.graph.input} - {t.name for t in source.graph.initializer}
    declared = {i.name for i in source.graph.input}
    inputs = []
    for entry in graph.input:
        if entry.name in required:
            inputs.append(entry)
        elif entry.name in initialized and entry.name in declared and source.ir_version >= 4:
            # An overridable initializer: typed by its initializer, since onnxruntime writes
            # the input without a shape. IR 3 lists every initializer as an input, and
            # onnxruntime lets a run feed none of them: they stay initializers only.
            tensor = initialized[entry.name]
            inputs.append(helper.make_tensor_value_info(entry.name, tensor.data_type,
                                                        list(tensor.dims)))
    del graph.input[:]
    graph.input.extend(inputs)
    # IR 3 requires every initializer to be a graph input; onnxruntime's output does not list
    # them, which IR 4 (initializers need not be inputs) describes exactly.
    optimized.ir_version = max(optimized.ir_version, 4)
    # onnxruntime imports every domain it knows; keep the source's, and any a rewrite used.
    used_domains = {n.domain for n in graph.node}
    known = {o.domain for o in source.opset_import}
    opsets = [o for o in optimized.opset_import if o.domain in known or o.domain in used_domains]
    del optimized.opset_import[:]
    optimized.opset_import.extend(opsets)
    if not in_place:
        graph.initializer.extend(source.graph.initializer[weights[n]] for n in weights
                                 if n in kept)
        return optimized
    target = source.graph
    for k in reversed(range(len(target.initializer))):  # keep the used weights where they are
        if target.initializer[k].name not in kept:
            del target.initializer[k]
    target.initializer.extend(graph.initializer)
    for field in ("node", "input", "output", "value_info"):
        del getattr(target, field)[:]
        getattr(target, field).extend(getattr(graph, field))
    source.ir_version = optimized.ir_version
    del source.opset_import[:]
    source.opset_import.extend(optimized.opset_import)
    return source
