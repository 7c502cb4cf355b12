"""Writing EPContext models: the framework's half of EPContext generation.

After the providers compiled their partitions (and made their EPContext nodes, see
:mod:`ep.framework.epcontext`), :class:`ContextWriter` collects those nodes, builds the model
from the partition plan (:func:`build_context_model`: each compiled partition replaced by its
EPContext node, every other node kept) and writes it atomically, initializers embedded or in one
external file (:func:`save_model`). A failed generation leaves no file behind: the writer
removes the model it wrote and the context binaries the providers made for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import EPFail, Fail, InvalidArgument
from ..errors import NotImplemented as OrtNotImplemented
from .epcontext import (
    MS_DOMAIN,
    context_model_name,
    context_output_path,
    is_ep_context_node,
    is_folder_path,
    parse_ep_context_node,
)
from .files import atomic_write, remove_stale_temporaries
from .graph import GraphView, node_reads
from .options import (
    EP_CONTEXT_EMBED_MODE,
    EP_CONTEXT_EXTERNAL_INITIALIZERS,
    EP_CONTEXT_FILE_PATH,
    EP_CONTEXT_NODE_NAME_PREFIX,
    SHARE_EP_CONTEXTS,
)
from .partitioner import PartitionPlan, shared_constant
from .provider import ExecutionProvider, FusedNode


def build_context_model(
    source: onnx.ModelProto, view: GraphView, plan: PartitionPlan,
    ep_nodes: Mapping[str, onnx.NodeProto],
) -> onnx.ModelProto:
    """The EPContext model: ``source`` with each partition named in ``ep_nodes`` replaced by
    its EPContext node and every other node kept. Graph inputs and outputs keep their names
    and order; initializers the kept nodes use come along (data loaded, never pointing at the
    source's external file); opsets are the source's plus ``com.microsoft``."""
    nodes: list[onnx.NodeProto] = []
    for part in plan.partitions:
        ctx = ep_nodes.get(part.name)
        if ctx is not None:
            nodes.append(ctx)
        else:
            nodes.extend(view.nodes[i] for i in part.nodes)
    used = {name for node in nodes for name in node_reads(node)}
    initializers = [view.initializers[n] for n in view.initializers if n in used]
    initializers += [view.overridable[n] for n in view.overridable if n in used]
    # A small Constant node's output crosses no partition boundary (the partitioner copies it
    # into each fused subgraph that reads it); when its Constant node went into an EPContext
    # node, the kept nodes that read it get it as an initializer.
    made = {o for node in nodes for o in node.output}
    initializers += [numpy_helper.from_array(view.constant(n), n) for n in sorted(used - made)
                     if shared_constant(view, n)]
    inputs = [i for i in source.graph.input
              if i.name not in view.initializers or i.name in used]
    io = {i.name for i in source.graph.input} | {o.name for o in source.graph.output}
    produced = [o for node in nodes for o in node.output if o and o not in io]
    # Types as onnxruntime's graph holds them: no dim by a name ONNX's inference made up.
    value_info = [view.as_onnxruntime_holds(vi) for vi in map(view.value_info, produced)
                  if vi is not None]
    outputs = [view.as_onnxruntime_holds(vi) for vi in source.graph.output]
    graph = helper.make_graph(nodes, source.graph.name, inputs, outputs,
                              initializer=[_inline(t) for t in initializers],
                              value_info=value_info, doc_string=source.graph.doc_string)
    opsets = [o for o in source.opset_import if o.domain != MS_DOMAIN]
    opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=source.ir_version,
                              producer_name="npu-sim", doc_string=source.doc_string)
    for prop in source.metadata_props:
        model.metadata_props.add().CopyFrom(prop)
    return model


def _inline(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of ``tensor`` holding its data inline (raw bytes), never an external reference."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise EPFail(f"initializer {tensor.name!r} still refers to external data; the source "
                     "model's external data must be loaded before generating")
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    return out


InitializerLocator = Callable[[str, np.ndarray, Any], Any]
"""``ModelCompiler``'s ``get_initializer_location_func``: called with each initializer's name,
value and current external-data info (None); returns None to keep it in the model, or an
object with ``filepath``, ``file_offset`` and ``byte_size`` (onnxruntime's
``OrtExternalInitializerInfo``) saying where the function wrote its bytes."""


def locate_initializers(model: onnx.ModelProto, locate: InitializerLocator) -> None:
    """Point every initializer ``locate`` places outside the model at its file, in place."""
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        value = numpy_helper.to_array(tensor)
        try:
            info = locate(tensor.name, value, None)
        except Exception as exc:
            raise Fail(f"get_initializer_location_func failed for initializer "
                       f"{tensor.name!r}: {type(exc).__name__}: {exc}") from None
        if info is None:
            continue
        where = getattr(info, "filepath", None)
        offset, size = getattr(info, "file_offset", None), getattr(info, "byte_size", None)
        if not isinstance(where, str) or not where or "\0" in where or \
                not isinstance(offset, int) or offset < 0 or size != value.nbytes:
            raise InvalidArgument(
                f"get_initializer_location_func returned filepath={where!r}, file_offset="
                f"{offset!r}, byte_size={size!r} for initializer {tensor.name!r}; expected a "
                f"non-empty path, an offset >= 0 and byte_size={value.nbytes}")
        name, dtype, shape = tensor.name, tensor.data_type, list(tensor.dims)
        tensor.Clear()
        tensor.name, tensor.data_type = name, dtype
        tensor.dims.extend(shape)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, text in (("location", where), ("offset", str(offset)), ("length", str(size))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, text


def external_file_name(config: Mapping[str, str]) -> str | None:
    """``ep.context_model_external_initializers_file_name``, validated (a relative path that
    stays beside the model), or None when unset."""
    name = config.get(EP_CONTEXT_EXTERNAL_INITIALIZERS, "")
    if not name:
        return None
    if os.path.isabs(name) or ".." in Path(name).parts or is_folder_path(name):
        raise InvalidArgument(f"{EP_CONTEXT_EXTERNAL_INITIALIZERS}={name!r} is invalid; expected "
                              "a file name relative to the EPContext model's folder")
    return name


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str], *,
               external_file: str | None = None, size_threshold: int = 0) -> None:
    """Write ``model`` to ``path`` atomically; with ``external_file``, every initializer of at
    least ``size_threshold`` bytes goes to that file (relative to ``path``'s folder), written
    atomically too. If anything fails, neither file is left behind."""
    target = Path(path)
    if external_file is None:
        atomic_write(target, [model.SerializeToString()])
        return
    ext_path = target.parent / external_file
    existed = ext_path.exists()
    model, blob = externalize(model, external_file, size_threshold)
    atomic_write(ext_path, [blob])
    try:
        atomic_write(target, [model.SerializeToString()])
    except BaseException:
        if not existed:
            with contextlib.suppress(FileNotFoundError):
                ext_path.unlink()
        raise


def externalize(model: onnx.ModelProto, location: str,
                size_threshold: int) -> tuple[onnx.ModelProto, bytes]:
    """A copy of ``model`` whose initializers of ``size_threshold`` bytes or more refer to
    ``location``, and the bytes of that file (each tensor 64-byte aligned)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    blob = bytearray()
    for tensor in out.graph.initializer:
        if tensor.data_type == onnx.TensorProto.STRING:
            continue  # string tensors cannot live in external data
        raw = tensor.raw_data if tensor.HasField("raw_data") else \
            numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
        if len(raw) < size_threshold:
            continue
        offset = (len(blob) + 63) // 64 * 64
        blob.extend(bytes(offset - len(blob)))
        blob.extend(raw)
        dims = list(tensor.dims)
        name, dtype = tensor.name, tensor.data_type
        tensor.Clear()
        tensor.name, tensor.data_type = name, dtype
        tensor.dims.extend(dims)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    return out, bytes(blob)


class ContextWriter:
    """The framework's half of EPContext generation, for one session or compile.

    Built before partitioning (so path errors come first, as in ONNX Runtime), it hands the
    providers a config whose ``ep.context_file_path`` is the resolved output path, prefixes the
    fused node names with ``ep.context_node_name_prefix``, collects the providers' EPContext
    nodes after compiling and writes the model. If writing fails, context binaries the providers
    created for it are removed, so a failed generation leaves no file behind.
    """

    def __init__(self, config: Mapping[str, str], model_path: str | None, *,
                 output_path: str | os.PathLike[str] | None = None,
                 external_file: str | None = None,
                 size_threshold: int = 0, binary_folder: Path | None = None,
                 locate: InitializerLocator | None = None) -> None:
        self.sharing = config.get(SHARE_EP_CONTEXTS, "0") == "1"
        self.config = dict(config)
        self.locate = locate
        self.binary_anchor: Path | None = None
        """Where providers put their binaries when the model itself is not written to a file
        (``ModelCompiler.compile_to_bytes``): a ``_ctx.onnx`` path whose folder and name they
        use; None means beside :attr:`output_path`."""
        self.output_path = context_output_path(config, model_path) if output_path is None \
            else Path(output_path)
        self.external_file = external_file if external_file is not None \
            else external_file_name(config)
        self.size_threshold = size_threshold
        # Node and graph names must be unique across a sharing group's models, as ONNX
        # Runtime's EPs make them: without a prefix, the model's name is the prefix.
        self.prefix = config.get(EP_CONTEXT_NODE_NAME_PREFIX, "") or (
            f"{context_model_name(self.output_path)}_" if self.sharing else "")
        folder = self.output_path.parent
        if not folder.is_dir():
            raise InvalidArgument(f"cannot write the EPContext model {str(self.output_path)!r}: "
                                  f"folder {str(folder)!r} does not exist")
        self.binary_folder = binary_folder or folder
        for place in {folder, self.binary_folder}:
            remove_stale_temporaries(place)  # what a writer killed mid-generation left
        self._existing = set(os.listdir(self.binary_folder))
        self._existing_outputs = {p for p in self._outputs() if p.exists()}

    def provider_config(self) -> dict[str, str]:
        """The session config the providers see: output path resolved, embed mode explicit."""
        config = dict(self.config)
        config[EP_CONTEXT_FILE_PATH] = str(self.binary_anchor or self.output_path)
        config.setdefault(EP_CONTEXT_EMBED_MODE, "0")
        return config

    def check_providers(self, providers: Sequence[ExecutionProvider]) -> None:
        """With ``ep.share_ep_contexts=1``, every provider that compiles must implement it
        (``shares_ep_contexts``); otherwise ``NotImplemented`` before anything is compiled."""
        if not self.sharing:
            return
        lacking = [p.type for p in providers
                   if p.type != "CPUExecutionProvider" and not p.shares_ep_contexts]
        if lacking:
            raise OrtNotImplemented(
                f"{SHARE_EP_CONTEXTS}=1 is not supported by {lacking}: they would write their "
                "own EPContext binary per session instead of one for the session group. Set "
                f"{SHARE_EP_CONTEXTS}=0 (or leave it unset), or use providers that support it.")

    def name_fused(self, fused: Sequence[FusedNode]) -> None:
        """Apply ``ep.context_node_name_prefix`` to fused node (and subgraph) names."""
        for node in fused:
            node.name = f"{self.prefix}{node.name}"
            node.graph.name = node.name

    def collect(self, plan: PartitionPlan,
                providers: Sequence[ExecutionProvider]) -> dict[str, onnx.NodeProto]:
        """Partition name -> the EPContext node its provider made for it."""
        by_fused = {f"{self.prefix}{p.name}": p for p in plan.partitions}
        ep_nodes: dict[str, onnx.NodeProto] = {}
        for provider in providers:
            nodes = provider.get_ep_context_nodes()
            own = [n for n, p in by_fused.items() if p.provider == provider.type]
            for node in nodes:
                part = by_fused.get(node.name)
                if not is_ep_context_node(node) or part is None \
                        or part.provider != provider.type:
                    raise EPFail(
                        f"{provider.type}.get_ep_context_nodes returned {node.op_type} node "
                        f"{node.name!r}; expected com.microsoft EPContext nodes named after its "
                        f"fused nodes {own}")
                if list(node.input) != part.inputs or list(node.output) != part.outputs:
                    raise EPFail(
                        f"EPContext node {node.name!r} has inputs {list(node.input)} and outputs "
                        f"{list(node.output)}; its fused node has {part.inputs} and {part.outputs}")
                ep_nodes[part.name] = node
            missing = [p.name for p in plan.by_provider(provider.type) if p.name not in ep_nodes]
            if nodes and missing:
                raise EPFail(f"{provider.type} returned no EPContext node for partitions "
                             f"{missing}")
        return ep_nodes

    def build(self, source: onnx.ModelProto, view: GraphView, plan: PartitionPlan,
              providers: Sequence[ExecutionProvider]) -> tuple[onnx.ModelProto, int]:
        """The EPContext model and how many EPContext nodes it has."""
        ep_nodes = self.collect(plan, providers)
        return build_context_model(source, view, plan, ep_nodes), len(ep_nodes)

    def write(self, source: onnx.ModelProto, view: GraphView, plan: PartitionPlan,
              providers: Sequence[ExecutionProvider], *, always: bool = False,
              require_nodes: bool = False) -> bool:
        """Write the EPContext model; nothing (and no error) when no provider made EPContext
        nodes unless ``always``; ``Fail`` then if ``require_nodes`` (ModelCompiler's
        ``ERROR_IF_NO_NODES_COMPILED``). Returns whether a file was written."""
        written = False
        try:
            model, count = self.build(source, view, plan, providers)
            if count == 0 and require_nodes:
                raise Fail("Unable to compile any nodes. Check that the session EPs support "
                           "compilation and can execute at least one subgraph in the model.")
            if count or always:
                if self.locate is not None:
                    locate_initializers(model, self.locate)
                save_model(model, self.output_path, external_file=self.external_file,
                           size_threshold=self.size_threshold)
                written = True
            for provider in providers:
                provider.end_ep_context_generation(committed=True)
            return written
        except BaseException:
            if written:
                self._remove_written()
            self.cleanup(providers)
            raise

    def _outputs(self) -> list[Path]:
        paths = [self.output_path]
        if self.external_file is not None:
            paths.append(self.output_path.parent / self.external_file)
        return paths

    def _remove_written(self) -> None:
        """Remove the model (and external initializers file) this writer created."""
        for path in self._outputs():
            if path not in self._existing_outputs:
                with contextlib.suppress(OSError):
                    path.unlink()

    def cleanup(self, providers: Sequence[ExecutionProvider]) -> None:
        """After a failure: tell the providers (``end_ep_context_generation(False)``) and
        delete the context binaries their EPContext nodes reference that did not exist before
        this generation began."""
        for provider in providers:
            with contextlib.suppress(Exception):
                provider.end_ep_context_generation(committed=False)
            with contextlib.suppress(Exception):
                for node in provider.get_ep_context_nodes():
                    self._remove_new(node)

    def _remove_new(self, node: onnx.NodeProto) -> None:
        if not is_ep_context_node(node):
            return
        info = parse_ep_context_node(node)
        if info.embed_mode != 0 or not info.ep_cache_context:
            return
        rel = Path(info.ep_cache_context.decode("utf-8", errors="replace"))
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            return
        if rel.parts[0] not in self._existing:
            with contextlib.suppress(OSError):
                (self.binary_folder / rel).unlink()
