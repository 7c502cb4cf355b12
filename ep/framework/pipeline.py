"""The construction pipeline shared by ``InferenceSession`` and ``ModelCompiler``.

Both do the same ten steps, in ONNX Runtime's order; only what they keep differs (a session
keeps the compiled partitions to run, a compiler keeps the written EPContext model):

1. load the model (path or bytes, external data; large weights' bytes stay out of the parsed
   protobuf, :mod:`.wire`) and check its tensors, keeping the weights' values;
2. set up EPContext generation (:class:`~.context_writer.ContextWriter`), so path errors come
   before any work;
3. build the providers from the registry and bind each to the session's config;
4. fix symbolic dimensions (session overrides plus providers' own);
5. apply onnxruntime's basic graph optimizations (:mod:`.optimizer`);
6. index the graph (:class:`~.graph.GraphView`);
7. partition (:func:`~.partitioner.partition`);
8. check what the plan may not contain (EPContext nodes no provider takes; with
   ``session.disable_model_compile=1``, anything that needs compiling);
9. compile every partition on its provider;
10. write the EPContext model, or on any failure remove what generation wrote.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..errors import (
    EPFail,
    Fail,
    InvalidArgument,
    InvalidProtobuf,
    ModelRequiresCompilation,
    NoSuchFile,
)
from ..errors import NotImplemented as OrtNotImplemented
from . import external_data
from .context_data import ContextDataFunctions
from .context_writer import ContextWriter
from .epcontext import is_ep_context_node, parse_ep_context_node
from .graph import GraphView
from .initializers import apply as apply_initializers
from .optimizer import optimize
from .options import DISABLE_MODEL_COMPILE, EXTERNAL_INITIALIZERS_FOLDER, config_flag
from .partitioner import CPU, PartitionPlan, partition
from .provider import CompiledNode, ExecutionProvider, provider_call
from .registry import build_providers
from .shapes import WEIGHT_BYTES
from .tensors import check_model_tensors, restore_raw_data, viewable
from .wire import split_weights

Wrap = Callable[[CompiledNode, str, str], CompiledNode]
"""Wraps each compiled node (the session's profiler times partitions this way)."""


@dataclass
class Built:
    """What construction produced."""

    source: onnx.ModelProto
    """The model as loaded."""
    model_path: str | None
    providers: list[ExecutionProvider]
    graph: GraphView
    """The graph as partitioned: optimized, dimensions fixed, indexed."""
    plan: PartitionPlan
    compiled: dict[str, CompiledNode]
    """Partition name -> what runs it."""
    weights: dict[str, np.ndarray]
    """The weights read at load, by initializer name; ``source`` may lack their ``raw_data``
    (:func:`~.tensors.restore_raw_data` puts it back)."""


def construct(
    path_or_bytes: str | os.PathLike[str] | bytes,
    config: Mapping[str, str],
    provider_specs: Sequence,
    *,
    optimization_level: int,
    free_dims: Mapping[str, int] | None = None,
    free_denotations: Mapping[str, int] | None = None,
    make_writer: Callable[[str | None], ContextWriter | None] = lambda path: None,
    require_compiled: bool = True,
    write: Callable[[ContextWriter, onnx.ModelProto, GraphView, PartitionPlan,
                     list[ExecutionProvider]], object] | None = None,
    wrap: Wrap | None = None,
    already_compiled: Exception | None = None,
    initializers: Mapping[str, Any] | None = None,
    external_initializers: Mapping[str, Any] | None = None,
    context_data: ContextDataFunctions | None = None,
) -> Built:
    """Run the pipeline of the module docstring. ``make_writer(model_path)`` returns the
    EPContext writer (None: no generation); ``write`` writes with it (default
    ``writer.write``); ``require_compiled=False`` skips the ``disable_model_compile`` check
    (``ModelCompiler`` compiles by definition). A model that already has EPContext nodes is
    loaded without generating (ONNX Runtime's sessions skip generation for it), or, given
    ``already_compiled``, that error is raised. ``initializers`` and
    ``external_initializers``: the ``OrtValue``s of ``SessionOptions.add_initializer`` and
    ``add_external_initializers`` (:mod:`.initializers`); ``context_data``: the functions
    providers write and read context binaries through (:mod:`.context_data`)."""
    source, model_path, raw = _load(path_or_bytes, config, split=True,
                                    supplied=initializers,
                                    supplied_external=external_initializers)
    weights = check_model_tensors(source, raw)
    writer = make_writer(model_path)
    provider_config = writer.provider_config() if writer is not None else dict(config)
    providers = build_providers(provider_specs, provider_config, model_path, context_data)
    named = by_denotation(source, free_denotations or {}, free_dims or {})
    dims = merged_free_dims(named, providers)
    if writer is not None:
        writer.check_providers(providers)
    # The model was parsed here: the optimizer edits it in place and the view takes it as it
    # is, so its weights are never copied (the session's ``model`` is the graph it ran).
    graph = GraphView.from_model(optimize(source, optimization_level, dims, in_place=True),
                                 dim_overrides=dims, owned=True, weights=weights)
    if writer is not None and any(is_ep_context_node(n) for n in graph.nodes):
        if already_compiled is not None:
            raise already_compiled
        writer = None
    plan = partition(graph, providers)
    check_ep_context_taken(graph, plan, providers)
    if require_compiled:
        check_compile_allowed(graph, plan, config)
    try:
        compiled = compile_plan(plan, providers, writer, wrap)
        if writer is not None:
            restore_raw_data(graph.model.graph.initializer, weights)
            (write or _write)(writer, graph.model, graph, plan, providers)
    except BaseException:
        if writer is not None:
            writer.cleanup(providers)
        raise
    return Built(source, model_path, providers, graph, plan, compiled, weights)


def _write(writer: ContextWriter, model: onnx.ModelProto, graph: GraphView, plan: PartitionPlan,
           providers: list[ExecutionProvider]) -> None:
    writer.write(model, graph, plan, providers)


def by_denotation(model: onnx.ModelProto, denotations: Mapping[str, int],
                  names: Mapping[str, int]) -> dict[str, int]:
    """The name overrides ``names`` plus every free input dimension whose denotation
    ``denotations`` fixes: a named one by its name; an unnamed one is given the name
    ``denotation:<input>:<axis>`` in ``model`` (which the fixed value then replaces). A
    dimension fixed to two values is onnxruntime's ``InvalidArgument``."""
    dims = dict(names)
    if not denotations:
        return dims
    for value_info in model.graph.input:
        if not value_info.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value_info.type.tensor_type.shape.dim):
            value = denotations.get(dim.denotation)
            if value is None or dim.HasField("dim_value"):
                continue
            if not dim.dim_param:
                dim.dim_param = f"denotation:{value_info.name}:{axis}"
            if dims.setdefault(dim.dim_param, value) != value:
                raise InvalidArgument("Conflicting free dimension overrides.")
    return dims


def merged_free_dims(session: Mapping[str, int],
                     providers: Sequence[ExecutionProvider]) -> dict[str, int]:
    """The session's free-dimension overrides plus those providers' options fix; a dimension
    fixed to two different values is ``InvalidArgument``."""
    dims = dict(session)
    for provider in providers:
        for name, value in provider.free_dimension_overrides().items():
            if dims.setdefault(name, value) != value:
                raise InvalidArgument(f"symbolic dimension {name!r} is fixed to {dims[name]} and, "
                                      f"by {provider.type}'s options, to {value}; give one value")
    return dims


def check_ep_context_taken(graph: GraphView, plan: PartitionPlan,
                           providers: Sequence[ExecutionProvider]) -> None:
    """An EPContext node left to the CPU provider has no implementation: ORT's error."""
    available = ", ".join(p.type for p in providers)
    for part in plan.by_provider(CPU):
        for i in part.nodes:
            node = graph.nodes[i]
            if is_ep_context_node(node):
                source = parse_ep_context_node(node).source or "<no source>"
                raise OrtNotImplemented(
                    f"Could not find an implementation for EPContext(1) node with name "
                    f"'{node.name}'. EPContext node generated by '{source}' is not "
                    "compatible with any execution provider added to the session. "
                    f"Available session execution providers: [{available}]."
                )


def check_compile_allowed(graph: GraphView, plan: PartitionPlan,
                          config: Mapping[str, str]) -> None:
    """With ``session.disable_model_compile=1`` only precompiled (EPContext) partitions may go
    to an EP: anything it would compile now is ``ModelRequiresCompilation``."""
    if not config_flag(config, DISABLE_MODEL_COMPILE):
        return
    for part in plan.partitions:
        if part.provider == CPU:
            continue
        fresh = [graph.names[i] for i in part.nodes if not is_ep_context_node(graph.nodes[i])]
        if fresh:
            raise ModelRequiresCompilation(
                f"User disabled EP compilation but EP '{part.provider}' needs to compile one or "
                f"more nodes. ({DISABLE_MODEL_COMPILE}=1; nodes {fresh}: load the EPContext "
                "model made by ModelCompiler instead.)"
            )


def compile_plan(plan: PartitionPlan, providers: Sequence[ExecutionProvider],
                 writer: ContextWriter | None, wrap: Wrap | None = None,
                 ) -> dict[str, CompiledNode]:
    """Compile every partition on its provider; partition name -> compiled node."""
    compiled: dict[str, CompiledNode] = {}
    for provider in providers:
        parts = plan.by_provider(provider.type)
        if not parts:
            continue
        fused = [plan.fused_node(p) for p in parts]
        if writer is not None:
            writer.name_fused(fused)
        with provider_call(provider, "compile"):
            nodes = list(provider.compile(fused))
        if len(nodes) != len(fused):
            raise EPFail(f"{provider.type}.compile returned {len(nodes)} compiled nodes for "
                         f"{len(fused)} fused nodes")
        for part, node in zip(parts, nodes, strict=True):
            compiled[part.name] = wrap(node, part.name, provider.type) if wrap else node
    return compiled


def load_model(path_or_bytes: str | os.PathLike[str] | bytes,
               config: Mapping[str, str]) -> tuple[onnx.ModelProto, str | None]:
    """Parse the model and load its external data; returns it and its path (None for bytes).

    External data comes from the model's folder, or, for bytes, from
    ``session.model_external_initializers_file_folder_path``. Errors are onnxruntime's:
    ``NoSuchFile``, ``InvalidProtobuf``, ``Fail``.
    """
    model, model_path, _ = _load(path_or_bytes, config, split=False)
    return model, model_path


def _load(path_or_bytes: str | os.PathLike[str] | bytes, config: Mapping[str, str], *,
          split: bool, supplied: Mapping[str, Any] | None = None,
          supplied_external: Mapping[str, Any] | None = None,
          ) -> tuple[onnx.ModelProto, str | None, dict[str, memoryview]]:
    """:func:`load_model`; with ``split`` the large initializers' ``raw_data`` stays out of the
    parsed model (:mod:`.wire`) and comes back by name, views of the bytes read. ``supplied``
    and ``supplied_external``: the caller's initializers (:mod:`.initializers`)."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data, model_path = bytes(path_or_bytes), None
        folder = config.get(EXTERNAL_INITIALIZERS_FOLDER, "") or None
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        model_path = os.fspath(path_or_bytes)
        if os.path.isdir(model_path):  # opened, then not a model: onnxruntime's words
            raise InvalidProtobuf(f"Load model from {model_path} failed:Protobuf parsing "
                                  "failed.")
        if not os.path.isfile(model_path):
            raise NoSuchFile(f"Load model from {model_path} failed:Load model {model_path} "
                             "failed. File doesn't exist")
        with open(model_path, "rb") as file:
            data = file.read()
        folder = None  # the model's folder, resolved below only if external data needs it
    else:
        raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
    scanned = split_weights(data, WEIGHT_BYTES, viewable) if split else None
    model = _parse(scanned[0] if scanned else data, model_path)
    raw: dict[str, memoryview] = {}
    if scanned:
        whole = memoryview(data)
        tensors = model.graph.initializer
        raw = {tensors[s.index].name: whole[s.offset:s.offset + s.length] for s in scanned[1]}
        if len(raw) != len(scanned[1]):  # initializers sharing a name: protobuf's way
            model, raw = _parse(data, model_path), {}
    apply_initializers(model, raw, values=supplied or {}, external=supplied_external or {})
    external = [t for t in external_data.tensors(model) if external_data.uses_external_data(t)]
    if external:
        if model_path is not None:
            folder = os.path.dirname(model_path)
        elif folder is None:
            raise Fail(f"the model has external initializers {[t.name for t in external[:3]]} "
                       f"but was loaded from bytes; set {EXTERNAL_INITIALIZERS_FOLDER} to the "
                       "folder of its data file")
        external_data.load(external, folder, model_path)
    return model, model_path, raw


def _parse(data: bytes, model_path: str | None) -> onnx.ModelProto:
    """The model of ``data``, read from ``model_path`` (None: given as bytes); what is not one
    is onnxruntime's error in its words: bytes protobuf cannot parse, or a model (empty bytes
    are one) with no graph."""
    where = "" if model_path is None else f"Load model from {model_path} failed:"
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception:  # protobuf raises DecodeError and friends
        raise InvalidProtobuf(f"{where}Protobuf parsing failed." if where else
                              "Failed to load model because protobuf parsing failed.") from None
    if not model.HasField("graph"):
        raise InvalidArgument(f"{where}No graph was found in the protobuf.")
    return model
