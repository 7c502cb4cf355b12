"""EPContext models: ONNX models whose compiled partitions are ``EPContext`` nodes.

An EPContext model (``shared/reference/ort-ep-context-design.md``) is the source model with each
partition an EP compiled replaced by one node ``com.microsoft::EPContext`` carrying what the EP
needs to run it without compiling again: the context payload itself (``embed_mode=1``) or the
path of a context binary relative to the model (``embed_mode=0``). Nodes left to the CPU provider
stay as they are. The split of work follows ONNX Runtime:

* the **EP** makes its EPContext nodes (and writes its context binary) when it compiles; this
  module gives it :func:`make_ep_context_node`, :func:`generation_settings` (the resolved output
  path, embed mode, name prefix) and :func:`~ep.framework.files.atomic_write`;
* the **framework** builds the model from the partition plan and those nodes
  (:func:`build_context_model`) and writes it atomically, initializers embedded or in one external
  file (:func:`save_model`);
* when loading, the EP reads its nodes back with :func:`parse_ep_context_node` and resolves
  context file paths with :func:`resolve_context_file`, which rejects every unsafe or broken path
  as ``InvalidGraph`` with ONNX Runtime's ``Failed to load from EpContext model.`` prefix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from ..errors import EPFail, Fail, InvalidArgument, InvalidGraph
from ..errors import NotImplemented as OrtNotImplemented
from .files import atomic_write
from .graph import GraphView
from .options import (
    EP_CONTEXT_EMBED_MODE,
    EP_CONTEXT_EXTERNAL_INITIALIZERS,
    EP_CONTEXT_FILE_PATH,
    EP_CONTEXT_NODE_NAME_PREFIX,
    SHARE_EP_CONTEXTS,
    STOP_SHARE_EP_CONTEXTS,
)
from .partitioner import PartitionPlan
from .provider import ExecutionProvider, FusedNode, ProviderContext

EP_CONTEXT_OP = "EPContext"
MS_DOMAIN = "com.microsoft"
LOAD_ERROR = "Failed to load from EpContext model."


def is_ep_context_node(node: onnx.NodeProto) -> bool:
    """True for a ``com.microsoft::EPContext`` node."""
    return node.op_type == EP_CONTEXT_OP and node.domain == MS_DOMAIN


def load_error(what: str) -> InvalidGraph:
    """The ``InvalidGraph`` every EPContext loading failure raises, saying what was wrong."""
    return InvalidGraph(f"{LOAD_ERROR} {what}")


@dataclass(frozen=True)
class EpContextNode:
    """The attributes of one EPContext node, with the schema's defaults filled in."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    main_context: int = 1
    embed_mode: int = 1
    ep_cache_context: bytes = b""
    ep_sdk_version: str | None = None
    onnx_model_filename: str | None = None
    hardware_architecture: str | None = None
    partition_name: str | None = None
    source: str | None = None
    notes: str | None = None
    max_size: int = 0

    @property
    def graph_name(self) -> str:
        """The graph this node runs: ``partition_name`` if set, else the node name."""
        return self.partition_name or self.name


_INT_ATTRS = ("main_context", "embed_mode", "max_size")
_STR_ATTRS = ("ep_sdk_version", "onnx_model_filename", "hardware_architecture",
              "partition_name", "source", "notes")


def parse_ep_context_node(node: onnx.NodeProto) -> EpContextNode:
    """Read an EPContext node's attributes; a wrongly typed or out-of-range one is
    ``InvalidGraph`` (``Failed to load from EpContext model. ...``)."""
    values: dict[str, object] = {}
    for attr in node.attribute:
        if attr.name in _INT_ATTRS:
            if attr.type != onnx.AttributeProto.INT:
                raise load_error(f"EPContext node {node.name!r}: attribute {attr.name} must be "
                                 f"an int, got {_attr_type(attr)}")
            values[attr.name] = int(attr.i)
        elif attr.name in _STR_ATTRS or attr.name == "ep_cache_context":
            if attr.type != onnx.AttributeProto.STRING:
                raise load_error(f"EPContext node {node.name!r}: attribute {attr.name} must be "
                                 f"a string, got {_attr_type(attr)}")
            if attr.name == "ep_cache_context":
                values[attr.name] = bytes(attr.s)
            else:
                values[attr.name] = attr.s.decode("utf-8", errors="replace")
    for key in ("main_context", "embed_mode"):
        if key in values and values[key] not in (0, 1):
            raise load_error(f"EPContext node {node.name!r}: {key}={values[key]} is invalid; "
                             "expected 0 or 1")
    return EpContextNode(name=node.name, inputs=tuple(node.input), outputs=tuple(node.output),
                         **values)  # type: ignore[arg-type]


def _attr_type(attr: onnx.AttributeProto) -> str:
    return onnx.AttributeProto.AttributeType.Name(attr.type)


def make_ep_context_node(
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    source: str,
    main_context: bool,
    embed_mode: int,
    ep_cache_context: bytes | str,
    ep_sdk_version: str,
    hardware_architecture: str,
    onnx_model_filename: str,
    max_size: int = 0,
    notes: str | None = None,
) -> onnx.NodeProto:
    """An EPContext node named ``name`` (which is also its ``partition_name``).

    ``ep_cache_context`` is the payload (bytes) when ``embed_mode`` is 1, or the context
    binary's path relative to the model (str) when it is 0; it is stored in the string
    attribute either way.
    """
    if embed_mode not in (0, 1):
        raise InvalidArgument(f"embed_mode={embed_mode!r} is invalid; expected 0 or 1")
    cache = ep_cache_context.encode("utf-8") if isinstance(ep_cache_context, str) \
        else bytes(ep_cache_context)
    attrs: dict[str, object] = {
        "main_context": int(bool(main_context)),
        "ep_cache_context": cache,
        "embed_mode": embed_mode,
        "ep_sdk_version": ep_sdk_version,
        "hardware_architecture": hardware_architecture,
        "partition_name": name,
        "source": source,
        "onnx_model_filename": onnx_model_filename,
        "max_size": int(max_size),
    }
    if notes is not None:
        attrs["notes"] = notes
    return helper.make_node(EP_CONTEXT_OP, list(inputs), list(outputs), name=name,
                            domain=MS_DOMAIN, **attrs)


@dataclass(frozen=True)
class GenerationSettings:
    """What an EP needs to make its EPContext nodes, resolved from the session config."""

    output_path: Path
    embed_mode: int
    node_name_prefix: str
    model_name: str

    def binary_path(self, ep_short_name: str) -> Path:
        """``[model_name]_[ep].bin`` beside the output model."""
        return self.output_path.parent / f"{self.model_name}_{ep_short_name.lower()}.bin"


def is_folder_path(path: str) -> bool:
    """True if ``path`` names a folder (ends with a separator, has no suffix, or is one)."""
    return path.endswith(("/", os.sep)) or not Path(path).suffix or Path(path).is_dir()


def planned_output_path(config: Mapping[str, str], model_path: str | None) -> Path:
    """``ep.context_file_path``, or the model path with ``.onnx`` replaced by ``_ctx.onnx``;
    ``InvalidArgument`` (ONNX Runtime's) when there is neither (a model from bytes)."""
    given = config.get(EP_CONTEXT_FILE_PATH, "")
    if given:
        return Path(given)
    if model_path:
        source = Path(model_path)
        stem = source.name[:-5] if source.name.endswith(".onnx") else source.name
        return source.with_name(f"{stem}_ctx.onnx")
    raise InvalidArgument("Both ep_context_path and model_path are empty.")


def output_exists_error(path: str | os.PathLike[str]) -> Fail:
    """ONNX Runtime's error for an EPContext model that would overwrite ``path``."""
    return Fail(f"Failed to generate EP context model since the file '\"{os.fspath(path)}\"' "
                "exists already. Please remove the EP context model if you want to re-generate "
                "it.")


def context_output_path(config: Mapping[str, str], model_path: str | None) -> Path:
    """Where a session's EPContext model goes (:func:`planned_output_path`). Errors are ONNX
    Runtime's: a folder is ``InvalidArgument``, no path at all (model from bytes) is
    ``InvalidArgument``, an existing file is ``Fail``."""
    given = config.get(EP_CONTEXT_FILE_PATH, "")
    if given and is_folder_path(given):
        raise InvalidArgument("context_file_path should not point to a folder.")
    path = planned_output_path(config, model_path)
    if path.exists():
        raise output_exists_error(path)
    return path


def generation_settings(context: ProviderContext) -> GenerationSettings:
    """The generation settings for an EP, from its :class:`ProviderContext` (the framework puts
    the resolved output path in ``ep.context_file_path`` before compiling)."""
    config = context.session_config
    output = config.get(EP_CONTEXT_FILE_PATH, "")
    if not output:
        raise EPFail("EPContext generation is on but the framework gave no output path")
    embed = config.get(EP_CONTEXT_EMBED_MODE, "0")
    if embed not in ("0", "1"):
        raise InvalidArgument(f"{EP_CONTEXT_EMBED_MODE}={embed!r} is invalid; expected 0 or 1")
    path = Path(output)
    name = path.name[:-9] if path.name.endswith("_ctx.onnx") else path.stem
    return GenerationSettings(output_path=path, embed_mode=int(embed),
                              node_name_prefix=config.get(EP_CONTEXT_NODE_NAME_PREFIX, ""),
                              model_name=name)


def context_folder(context: ProviderContext) -> Path:
    """The folder ``embed_mode=0`` paths are relative to: the model's, or, for a model loaded
    from bytes, the folder of ``ep.context_file_path``."""
    if context.model_path:
        return Path(context.model_path).resolve().parent
    given = context.session_config.get(EP_CONTEXT_FILE_PATH, "")
    if given:
        return Path(given).resolve().parent
    raise load_error("The model was loaded from bytes and its EPContext nodes reference a "
                     f"context binary file; set the session option {EP_CONTEXT_FILE_PATH} to the "
                     "model's path so the binary can be found.")


def resolve_context_file(relative: bytes | str, folder: Path, *, node: str) -> Path:
    """The context binary ``relative`` (an ``ep_cache_context`` path) inside ``folder``.

    Rejected as ``InvalidGraph``: empty, absolute, escaping ``folder`` (also via a symlink),
    missing, a folder, or an empty file.
    """
    text = relative.decode("utf-8", errors="replace") if isinstance(relative, bytes) else relative
    where = f"EPContext node {node!r}: ep_cache_context"
    if not text:
        raise load_error(f"{where} is empty; expected the context binary's path relative to the "
                         "model")
    if os.path.isabs(text) or Path(text).drive:
        raise load_error(f"{where} {text!r} is an absolute path; it must be relative to the "
                         f"model folder {str(folder)!r}")
    root = folder.resolve()
    target = (root / text).resolve()
    if target != root and root not in target.parents:
        raise load_error(f"{where} {text!r} resolves to {str(target)!r}, outside the model "
                         f"folder {str(root)!r}")
    if not target.exists():
        raise load_error(f"{where}: context binary {str(target)!r} does not exist")
    if not target.is_file():
        raise load_error(f"{where}: {str(target)!r} is not a file")
    if target.stat().st_size == 0:
        raise load_error(f"{where}: context binary {str(target)!r} is empty")
    return target


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
    used = {name for node in nodes for name in _reads(node)}
    initializers = [view.initializers[n] for n in view.initializers if n in used]
    inputs = [i for i in source.graph.input
              if i.name not in view.initializers or i.name in used]
    io = {i.name for i in source.graph.input} | {o.name for o in source.graph.output}
    produced = [o for node in nodes for o in node.output if o and o not in io]
    value_info = [vi for vi in (view.value_info(n) for n in produced) if vi is not None]
    graph = helper.make_graph(nodes, source.graph.name, inputs, list(source.graph.output),
                              initializer=[_inline(t) for t in initializers],
                              value_info=value_info, doc_string=source.graph.doc_string)
    opsets = [o for o in source.opset_import if o.domain != MS_DOMAIN]
    opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=source.ir_version,
                              producer_name="npu-sim", doc_string=source.doc_string)
    for prop in source.metadata_props:
        model.metadata_props.add().CopyFrom(prop)
    return model


def _reads(node: onnx.NodeProto) -> Iterable[str]:
    yield from (i for i in node.input if i)
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            for inner in sub.node:
                yield from _reads(inner)


def _inline(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of ``tensor`` holding its data inline (raw bytes), never an external reference."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise EPFail(f"initializer {tensor.name!r} still refers to external data; the source "
                     "model's external data must be loaded before generating")
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    return out


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
                 size_threshold: int = 0, binary_folder: Path | None = None) -> None:
        self.sharing = config.get(SHARE_EP_CONTEXTS, "0") == "1"
        if output_path is not None:  # ModelCompiler: one model per compile, as in ORT
            for key in (SHARE_EP_CONTEXTS, STOP_SHARE_EP_CONTEXTS):
                if config.get(key, "0") == "1":
                    raise OrtNotImplemented(
                        f"{key}=1 is not supported by ModelCompiler; create one InferenceSession "
                        "per model with ep.context_enable=1 and ep.share_ep_contexts=1 (the last "
                        "one with ep.stop_share_ep_contexts=1) to share weights.")
        self.config = dict(config)
        self.output_path = context_output_path(config, model_path) if output_path is None \
            else Path(output_path)
        self.external_file = external_file if external_file is not None \
            else external_file_name(config)
        self.size_threshold = size_threshold
        self.prefix = config.get(EP_CONTEXT_NODE_NAME_PREFIX, "")
        folder = self.output_path.parent
        if not folder.is_dir():
            raise InvalidArgument(f"cannot write the EPContext model {str(self.output_path)!r}: "
                                  f"folder {str(folder)!r} does not exist")
        self.binary_folder = binary_folder or folder
        self._existing = set(os.listdir(self.binary_folder))
        self._existing_outputs = {p for p in self._outputs() if p.exists()}

    def provider_config(self) -> dict[str, str]:
        """The session config the providers see: output path resolved, embed mode explicit."""
        config = dict(self.config)
        config[EP_CONTEXT_FILE_PATH] = str(self.output_path)
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

    def check_source(self, graph: GraphView) -> None:
        """Generating from a model that already has EPContext nodes is ``InvalidGraph``."""
        found = [graph.names[i] for i, n in enumerate(graph.nodes) if is_ep_context_node(n)]
        if found:
            raise InvalidGraph(f"the model already contains EPContext nodes {found[:5]}; it is "
                               "compiled already. Generate from the source model instead.")

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
