"""EPContext nodes of the NPU execution provider: made from compiled programs, read back.

Generation (``ep.context_enable=1``): every partition the NPU compiled becomes one EPContext node
(``source = "NpuSimExecutionProvider"``, ``partition_name`` = node name = graph name in the
binary, prefixed by ``ep.context_node_name_prefix`` since the framework names fused nodes so).
All programs go into **one** context binary (:mod:`ep.npusim.binary`):

* ``embed_mode=0`` (default): the binary is written atomically as ``<model>_npusim.bin`` beside
  the EPContext model; every node's ``ep_cache_context`` is that file name, the first node has
  ``main_context=1``, the others ``0``;
* ``embed_mode=1``: the binary's bytes are the first (main) node's ``ep_cache_context``; the
  others have ``main_context=0`` and an empty ``ep_cache_context``.

With ``ep.share_ep_contexts=1`` (:func:`make_shared_context_nodes`) the nodes reference the
session group's binary, written by the group's last session (:mod:`ep.npusim.shared`).

``max_size`` is the binary's size in bytes (0 in a sharing group); ``hardware_architecture``
the device config name, ``ep_sdk_version`` :data:`~ep.npusim.version.SDK_VERSION`; ``notes``
the config digest.

Loading: :func:`context_capability` claims the EPContext nodes whose ``source`` is the NPU's (or
absent, as TensorRT accepts old models); :func:`load_programs` opens every main node's binary
(once per file), checks SDK version, architecture and config digest, and finds each node's
program by graph name. Every failure is ``InvalidGraph`` starting with
``Failed to load from EpContext model.``. With ``defer_weights`` (the provider's runtime is its
session's alone) a binary's weights are still being checksummed on a thread when
:func:`load_programs` returns (:class:`WeightChecks`): the provider places them meanwhile and
waits before the load succeeds. On a runtime other sessions share, or a device the caller gave,
they are verified before anything is placed: a failed load places nothing there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from firmware_model import Program
from npu_sim import dtypes
from npu_sim.config import DeviceConfig
from npu_sim.errors import ConfigError

from ..errors import Fail, InvalidGraph
from ..errors import NotImplemented as OrtNotImplemented
from ..framework import epcontext as E
from ..framework.context_data import ContextDataFunctions, read_through, write_through
from ..framework.graph import GraphView
from ..framework.provider import ComputeCapability, FusedNode, ProviderContext
from .binary import ContextBinary, graph_digest, pack_context_listing, write_context_binary
from .binary_reader import remember
from .external_weights import ExternalSpec, ExternalWeightFile
from .shared import EP_SHORT_NAME, SharedWorkspace, Staged
from .version import SDK_VERSION, sdk_major

SOURCE = "NpuSimExecutionProvider"
SOURCES = (SOURCE,)


def context_capability(graph: GraphView) -> list[ComputeCapability]:
    """One capability per unassigned EPContext node this EP should load."""
    caps = []
    for i, node in enumerate(graph.nodes):
        if i in graph.assigned or not E.is_ep_context_node(node):
            continue
        source = E.parse_ep_context_node(node).source
        if source is None or source in SOURCES:
            caps.append(ComputeCapability((i,)))
    return caps


def is_context_fused(fused: FusedNode) -> bool:
    """True if ``fused`` stands for one EPContext node (a precompiled partition)."""
    return len(fused.body.node) == 1 and E.is_ep_context_node(fused.body.node[0])


def make_context_nodes(
    compiled: Sequence[tuple[FusedNode, Program]], context: ProviderContext,
    config: DeviceConfig, external: ExternalSpec | None = None,
) -> tuple[list[onnx.NodeProto], list[ExternalWeightFile]]:
    """The EPContext nodes for freshly compiled partitions (writes the binary in embed mode 0),
    and the external weights the binary refers to (``external``: written to their folder).

    Program names are the fused node names, so graphs in the binary carry the name prefix.
    """
    if not compiled:
        return [], []
    settings = E.generation_settings(context)
    programs = [program for _, program in compiled]
    names = [p.name for p in programs]
    if names != [f.name for f, _ in compiled]:
        raise InvalidGraph(f"program names {names} differ from the fused node names "
                           f"{[f.name for f, _ in compiled]}")
    if settings.embed_mode == 1:
        payload, listing = pack_context_listing(programs, hardware_architecture=config.name,
                                                config_digest=config.digest, external=external)
        size = len(payload)
        remember(data=payload)
        cache_main: bytes | str = payload
        cache_other: bytes | str = b""
    elif context.context_data.write is not None:  # the user's function stores it
        payload, listing = pack_context_listing(programs, hardware_architecture=config.name,
                                                config_digest=config.digest, external=external)
        relative = settings.binary_path(EP_SHORT_NAME).name
        write_through(context.context_data, relative, payload)
        remember(data=payload)
        size = len(payload)
        cache_main = cache_other = relative
    else:
        path = settings.binary_path(EP_SHORT_NAME)
        if path.exists():
            raise existing_binary_error(path)
        listing = write_context_binary(path, programs, hardware_architecture=config.name,
                                       config_digest=config.digest, external=external)
        remember(path)
        size = path.stat().st_size
        relative = path.name
        cache_main = cache_other = relative
    return _nodes(compiled, settings, config, cache_main, cache_other, size), listing


def existing_binary_error(path: Path) -> Fail:
    """Generating never replaces a context binary: ONNX Runtime's rule for the model file."""
    return Fail(f"Failed to generate EP context binary since the file '\"{path}\"' exists "
                "already. Please remove it if you want to re-generate it.")


def make_shared_context_nodes(
    compiled: Sequence[tuple[FusedNode, Program]], context: ProviderContext,
    config: DeviceConfig, shared: SharedWorkspace, *, stop: bool,
    external: ExternalSpec | None = None,
) -> tuple[list[onnx.NodeProto], Staged]:
    """The EPContext nodes of a session in a weight-sharing group (``ep.share_ep_contexts=1``,
    embed mode 0), and its programs staged in ``shared`` (commit or abort them once the
    EPContext model is written or has failed).

    Every node references the group's binary by its name (relative to the model; the group
    keeps all its files in one folder); the first node is ``main_context=1``. ``max_size`` is
    0: the binary is written by the last session, after the others' nodes were made.
    """
    if context.context_data.write is not None:
        raise OrtNotImplemented("ep.share_ep_contexts with an EPContext data write function: "
                                "the group's binary is written by its last session")
    settings = E.generation_settings(context)
    programs = [program for _, program in compiled]
    staged = shared.stage(settings.output_path, settings.binary_path(EP_SHORT_NAME), programs,
                          hardware_architecture=config.name, config_digest=config.digest,
                          stop=stop, external=external)
    relative = staged.binary_path.name
    return _nodes(compiled, settings, config, relative, relative, 0), staged


def _nodes(compiled: Sequence[tuple[FusedNode, Program]], settings: E.GenerationSettings,
           config: DeviceConfig, cache_main: bytes | str, cache_other: bytes | str,
           size: int) -> list[onnx.NodeProto]:
    return [
        E.make_ep_context_node(
            fused.name, fused.inputs, fused.outputs, source=SOURCE, main_context=k == 0,
            embed_mode=settings.embed_mode, ep_cache_context=cache_main if k == 0 else cache_other,
            ep_sdk_version=SDK_VERSION, hardware_architecture=config.name,
            onnx_model_filename=f"{settings.model_name}.onnx", max_size=size,
            notes=f"config_digest={config.digest};graph_digest={graph_digest(program)}",
        )
        for k, (fused, program) in enumerate(compiled)
    ]


def recorded_digest(info: E.EpContextNode) -> str | None:
    """The ``graph_digest`` an EPContext node's ``notes`` record, if any."""
    for item in (info.notes or "").split(";"):
        key, _, value = item.partition("=")
        if key.strip() == "graph_digest" and value.strip():
            return value.strip()
    return None


def _check_node(info: E.EpContextNode, config: DeviceConfig) -> None:
    if info.ep_sdk_version is not None:
        try:
            major = sdk_major(info.ep_sdk_version)
        except ValueError:
            major = -1
        if major != sdk_major(SDK_VERSION):
            raise E.load_error(f"EPContext node {info.name!r} was generated by SDK version "
                               f"{info.ep_sdk_version!r}; this SDK is {SDK_VERSION} and reads "
                               f"major version {sdk_major(SDK_VERSION)} only. Regenerate it.")
    arch = info.hardware_architecture
    if arch is not None and arch != config.name:
        raise E.load_error(f"EPContext node {info.name!r} was compiled for hardware "
                           f"architecture {arch!r}; this provider's device is {config.name!r}. "
                           "Use the matching device option or regenerate.")


class _Folder:
    """The EPContext model's folder (:func:`~ep.framework.epcontext.context_folder`), resolved
    once per load and only if a node needs it."""

    def __init__(self, context: ProviderContext) -> None:
        self._context = context
        self._path: Path | None = None

    def __call__(self) -> Path:
        if self._path is None:
            self._path = E.context_folder(self._context)
        return self._path

    def or_none(self) -> Path | None:
        """The folder, where an embedded binary's external weights are found; None when a model
        from bytes has no ``ep.context_file_path`` (the binary then says so if it has external
        weights)."""
        try:
            return self()
        except InvalidGraph:
            return None


Acquire = Callable[[Path, Iterable[str], Callable[[Path], ContextBinary]], ContextBinary]
"""How a session with ``ep.share_ep_contexts=1`` gets a binary file: through the workspace
(:meth:`~ep.npusim.shared.SharedWorkspace.acquire_binary`)."""


@dataclass
class WeightChecks:
    """The binaries of one load whose weight blocks may still be being checksummed
    (:meth:`ContextBinary.verify_weights`), each with the EPContext node that opened it;
    ``recheck``: check the weights of binary files checked whole before and unchanged since too
    (the provider option ``weight_checks=always``)."""

    opened: list[tuple[str, ContextBinary]] = field(default_factory=list)
    recheck: bool = False

    def wait(self) -> None:
        """Wait for every check; a bad block is the opening node's load error, as it would have
        been when the binary was opened."""
        opened, self.opened = self.opened, []
        first: InvalidGraph | None = None
        for node, binary in opened:  # all of them: no thread is left reading a binary
            try:
                binary.verify_weights()
            except InvalidGraph as exc:
                first = first or E.load_error(f"EPContext node {node!r}: {exc.message}")
        if first is not None:  # the block, not whatever failed while it was checked
            raise first from None


def _open(info: E.EpContextNode, folder: _Folder, config: DeviceConfig,
          opened: dict[Path, ContextBinary], wanted: set[str],
          acquire: Acquire | None, checks: WeightChecks, defer: bool,
          data: ContextDataFunctions) -> ContextBinary:
    try:
        if info.embed_mode == 0 and data.read is not None:  # by name, from the user's function
            key = _binary_key(info, folder, data)
            if key not in opened:
                opened[key] = ContextBinary.from_bytes(
                    read_through(data, os.fsdecode(info.ep_cache_context)),
                    expected_architecture=config.name,
                    expected_config_digest=config.digest, external_folder=folder.or_none(),
                    defer_weights=defer)
                checks.opened.append((info.name, opened[key]))
            return opened[key]
        if info.embed_mode == 1:
            if not info.ep_cache_context:
                raise E.load_error(f"EPContext node {info.name!r}: main_context=1 and "
                                   "embed_mode=1 but ep_cache_context holds no payload")
            binary = ContextBinary.from_bytes(info.ep_cache_context,
                                              expected_architecture=config.name,
                                              expected_config_digest=config.digest,
                                              external_folder=folder.or_none(),
                                              defer_weights=defer)
            checks.opened.append((info.name, binary))
            return binary
        path = _binary_key(info, folder, data)
        if path not in opened:
            def opener(target: Path) -> ContextBinary:
                # A binary shared through the workspace outlives this load: verified whole.
                return ContextBinary.open(target, expected_architecture=config.name,
                                          expected_config_digest=config.digest,
                                          defer_weights=defer and acquire is None,
                                          recheck=checks.recheck)
            opened[path] = opener(path) if acquire is None else acquire(path, wanted, opener)
            checks.opened.append((info.name, opened[path]))
        return opened[path]
    except InvalidGraph as exc:
        if exc.message.startswith(E.LOAD_ERROR):
            raise
        raise E.load_error(f"EPContext node {info.name!r}: {exc.message}") from None


def _binary_key(info: E.EpContextNode, folder: _Folder, data: ContextDataFunctions) -> Path:
    """What an ``embed_mode=0`` node's binary is known by: the name it gives, for the user's
    read function to read; else the file that name resolves to."""
    if data.read is not None:
        return Path(os.fsdecode(info.ep_cache_context))
    return E.resolve_context_file(info.ep_cache_context, folder(), node=info.name)


def load_programs(fused_nodes: Sequence[FusedNode], context: ProviderContext,
                  config: DeviceConfig, checks: WeightChecks, acquire: Acquire | None = None,
                  *, defer_weights: bool) -> tuple[list[Program], list[ContextBinary]]:
    """The program of each EPContext fused node (in order) and the binaries opened (keep them
    alive while the programs' weights are in use); ``checks`` gets the weight checks still
    running: the caller may place the weights meanwhile and must :meth:`~WeightChecks.wait`
    before the load succeeds, also when this raises (and before reporting any other error: a
    bad block is reported first). Only with
    ``defer_weights``: a caller placing on a runtime or device it does not own alone passes
    False, and every binary's weights are verified before this returns (a load that then fails
    would leave its allocations and queued uploads in the shared device). With ``acquire``,
    binary files are obtained through it (shared between sessions) instead of opened here, and
    verified whole.

    A node's graph is looked up in the binary its ``ep_cache_context`` names (a file), or, for
    an embedded payload, in its own main node's binary; two binaries may each hold a graph of
    the same name. A binary holding a single graph serves a node of another name (ONNX Runtime's
    QNN EP accepts that for older models). The graph's digest must be the one the node
    recorded, so a binary replaced under an older model is refused, never run."""
    infos = [E.parse_ep_context_node(f.body.node[0]) for f in fused_nodes]
    for info in infos:
        _check_node(info, config)
    return _load(infos, context, config, acquire, checks, defer_weights)


def _load(infos: list[E.EpContextNode], context: ProviderContext, config: DeviceConfig,
          acquire: Acquire | None, checks: WeightChecks, defer: bool,
          ) -> tuple[list[Program], list[ContextBinary]]:
    opened: dict[Path, ContextBinary] = {}
    folder = _Folder(context)
    binaries: list[ContextBinary] = []
    owner: dict[int, ContextBinary] = {}  # node position -> the binary its graph is in
    wanted = {info.graph_name for info in infos}
    embedded: list[ContextBinary] = []
    for k, info in enumerate(infos):
        if info.main_context:
            binary = _open(info, folder, config, opened, wanted, acquire, checks, defer,
                           context.context_data)
            if binary not in binaries:
                binaries.append(binary)
            owner[k] = binary
            if info.embed_mode == 1:
                embedded.append(binary)
    for k, info in enumerate(infos):
        if k in owner:
            continue
        if info.embed_mode == 0 and info.ep_cache_context:
            path = _binary_key(info, folder, context.context_data)
            if path in opened:
                owner[k] = opened[path]
                continue
        holders = [b for b in (embedded or binaries) if info.graph_name in b.graph_names()]
        if len(holders) > 1:
            raise E.load_error(f"EPContext node {info.name!r}: graph {info.graph_name!r} is in "
                               f"{len(holders)} context binaries of this model; give the node an "
                               "ep_cache_context naming its file")
        if holders:
            owner[k] = holders[0]
    programs = []
    for k, info in enumerate(infos):
        programs.append(_graph_of(info, owner.get(k), binaries))
    return programs, binaries


def _graph_of(info: E.EpContextNode, binary: ContextBinary | None,
              binaries: Sequence[ContextBinary]) -> Program:
    if binary is None:
        held = sorted(n for b in binaries for n in b.graph_names())
        raise E.load_error(f"EPContext node {info.name!r}: graph {info.graph_name!r} is in no "
                           f"context binary of this model (main_context nodes hold graphs {held})")
    names = binary.graph_names()
    name = info.graph_name if info.graph_name in names else names[0] if len(names) == 1 \
        else None
    if name is None:
        raise E.load_error(f"EPContext node {info.name!r}: graph {info.graph_name!r} is not in "
                           f"context binary {binary.source} (it holds graphs {names})")
    expected = recorded_digest(info)
    stored = binary.graph_digest(name)
    if expected is not None and stored != expected:
        found = "records no graph digests (format 2.0)" if stored is None else \
            f"holds graph {name!r} with digest {stored[:16]}..."
        raise E.load_error(f"EPContext node {info.name!r} was compiled to graph digest "
                           f"{expected[:16]}..., but context binary {binary.source} {found}: the "
                           "binary was replaced or belongs to another model. Regenerate the "
                           "EPContext model.")
    return binary.program(name)


def check_binding(fused: FusedNode, program: Program) -> None:
    """An EPContext node's inputs and outputs bind to its graph's by position: the counts must
    match, each element type and static shape must agree, and names may differ only by a
    rename outside the node (``onnx.compose`` prefixes), never by a permutation of the graph's
    own names, which would silently swap values. Mismatches are ``InvalidGraph``."""
    node = fused.name
    types = {vi.name: vi for vi in (*fused.body.input, *fused.body.output)}
    for role, names, descs in (("input", fused.inputs, program.input_descs()),
                               ("output", fused.outputs, program.output_descs())):
        recorded = [d.name for d in descs]
        if len(names) != len(descs):
            raise E.load_error(f"EPContext node {node!r} has {len(names)} {role}s {list(names)}; "
                               f"its compiled graph has {len(descs)}: {recorded}")
        for position, (name, desc) in enumerate(zip(names, descs, strict=True)):
            if name != desc.name and name in recorded:
                raise E.load_error(
                    f"EPContext node {node!r} {role} {position} is {name!r}, but the compiled "
                    f"graph's {role} {position} is {desc.name!r} and {name!r} is its {role} "
                    f"{recorded.index(name)}: the {role}s are permuted")
            problem = _type_mismatch(types.get(name), desc)
            if problem:
                raise E.load_error(f"EPContext node {node!r} {role} {position} {name!r} is "
                                   f"{problem[0]}; the compiled graph's {role} {position} "
                                   f"{desc.name!r} is {problem[1]}")


def _type_mismatch(vi: onnx.ValueInfoProto | None, desc) -> tuple[str, str] | None:
    if vi is None or not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    want = f"{desc.dtype}{list(desc.shape)}"
    try:
        dtype = dtypes.from_onnx(tt.elem_type) if tt.elem_type else None
    except ConfigError:
        dtype = f"elem_type {tt.elem_type}"
    if dtype is not None and dtype != desc.dtype:
        return f"{dtype}", want
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) != len(desc.shape) or any(
                d is not None and d != s for d, s in zip(dims, desc.shape, strict=True)):
            return f"{dtype or ''}{dims}", want
    return None
