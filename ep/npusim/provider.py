"""``NpuSimExecutionProvider``: the NPU execution provider, in ONNX Runtime's shape.

Created with a :class:`~ep.framework.provider.ProviderContext` whose provider options are
strings, as ONNX Runtime passes them (:data:`OPTION_KEYS`; docs/epcontext.md has the full table):

===========================  ============================================================
``device``                   a preset name (``npu-s``, ``npu-m``, ``npu-l``, ``os32``) or the
                             path of a ``.json`` / ``.toml`` device config; default ``npu-m``
``functional``               ``"1"`` (default): compute values; ``"0"``: timing only
``allocator``                HBM allocation strategy (``best_fit`` default, ``first_fit``,
                             ``mru``)
``cpu_nodes``                comma-separated node names and op types the NPU declines, so
                             they run on the CPU provider (a node that fails to compile or
                             fit); one that matches nothing is ``InvalidArgument``
``external_weights``         a generated context's weights: ``"0"`` (default) in the binary,
                             ``"1"`` a file per weight, ``"2"`` one combined file
``external_weights_folder``  their folder, relative to the ``_ctx.onnx``'s (default ``weight``)
``weight_streaming``         ``"1"`` (default): a kernel starts once its own weights arrived;
                             ``"0"``: creation waits for every upload
``weight_checks``            loading a context binary file: ``"changed"`` (default) checks
                             its weights' CRC-32s unless the file was checked whole before and
                             is unchanged since (:mod:`ep.npusim.verified_files`);
                             ``"always"`` checks them on every load
any other key                an integer: the value of the symbolic dimension of that name
                             (``{"batch": "1"}``); anything else is ``InvalidArgument``
===========================  ============================================================

Passed as an instance, ``NpuSimExecutionProvider(device=..., weight_memory=...)`` runs on a
:class:`~npu_sim.device.Device` the caller made and places external weights in buffers the
caller allocated (:meth:`set_external_weight_address`).

:meth:`get_capability` / :meth:`decline_reasons` come from :mod:`ep.npusim.capability`;
:meth:`compile` compiles each fused node (:func:`ep.npusim.compiler.compile_partition`) and
loads its program on the provider's one device (:mod:`ep.npusim.runtime`). The programs are kept
in :attr:`programs` by fused-node name and the compile reports in :attr:`reports`.

With the session option ``ep.share_ep_contexts=1`` the provider works through the process-wide
workspace of :mod:`ep.npusim.shared`: generating, its graphs go into the session group's one
context binary (written by the session with ``ep.stop_share_ep_contexts=1``); loading, it shares
opened context binaries and one simulated device (:attr:`runtime`) with the other sessions that
set the option and use the same device settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from firmware_model import Program
from npu_sim.config import DeviceConfig
from npu_sim.device import Device
from npu_sim.errors import ConfigError, NpuSimError
from npu_sim.hbm import ALLOCATORS, DeviceBuffer
from npu_sim.trace import Recording, Trace

from .. import errors
from ..framework import epcontext as E
from ..framework.graph import GraphView
from ..framework.options import (
    EP_CONTEXT_ENABLE,
    SHARE_EP_CONTEXTS,
    STOP_SHARE_EP_CONTEXTS,
    config_flag,
)
from ..framework.provider import (
    CompiledNode,
    ComputeCapability,
    ExecutionProvider,
    FusedNode,
    ProviderContext,
)
from . import epcontext as npu_epcontext
from .capability import get_npu_capability
from .compiler import CompileReport, compile_partition
from .external_weights import DEFAULT_FOLDER, ExternalWeightFile, external_spec
from .runtime import NpuRuntime, NpuSimCompiledNode, combine_stats
from .shared import Staged, workspace
from .version import SDK_VERSION

OPTION_KEYS = ("device", "functional", "allocator", "external_weights",
               "external_weights_folder", "weight_streaming", "weight_checks", "cpu_nodes")
WEIGHT_CHECKS = ("changed", "always")
MOVED_TO_CPU = "moved to the CPU by the provider option cpu_nodes"


class NpuSimExecutionProvider(ExecutionProvider):
    """The simulated NPU as an execution provider (see the module docstring for options)."""

    type = "NpuSimExecutionProvider"
    shares_ep_contexts = True

    def __init__(self, context: ProviderContext | None = None, *, device: Device | None = None,
                 weight_memory: Mapping[str, DeviceBuffer] | None = None) -> None:
        """``device``: run on this device instead of creating one (its config is the
        provider's); ``weight_memory``: external weight file name -> a buffer the caller
        allocated on ``device`` for it (see :meth:`set_external_weight_address`)."""
        self._user_device = device
        self._weight_memory: dict[str, DeviceBuffer] = {}
        for name, buffer in (weight_memory or {}).items():
            self.set_external_weight_address(name, buffer)
        super().__init__(context)

    def set_external_weight_address(self, file_name: str, buffer: DeviceBuffer) -> None:
        """Use ``buffer`` (allocated by the caller with ``device.malloc`` on the provider's
        device, at least the file's size) for the weights of external weight file
        ``file_name`` (``weight_<sha256>`` or ``<model>_weight_combined``), like
        ``aclmdlSetExternalWeightAddress``: each weight goes to the buffer at its offset in the
        file, and the buffer is never allocated or freed by the session. Call it before the
        session loads the EPContext model; a buffer smaller than the file is
        ``InvalidArgument`` naming both sizes."""
        if not isinstance(buffer, DeviceBuffer) or buffer.freed:
            raise errors.InvalidArgument(f"external weight memory for {file_name!r}: expected a "
                                         f"live DeviceBuffer from Device.malloc, got {buffer!r}")
        self._weight_memory[str(file_name)] = buffer

    def _bind(self, context: ProviderContext) -> None:
        """Options and session settings; the device (or the sharing group's) is created here."""
        options = dict(context.provider_options)
        given = self._user_device
        self.config = _device_config(options.get("device", "npu-m")) if given is None \
            else given.config
        if given is not None and options.get("device", given.config.name) != given.config.name:
            raise errors.InvalidArgument(
                f"NpuSimExecutionProvider option device={options['device']!r}, but the device "
                f"given to the provider is {given.config.name!r}; give one or make them agree")
        self.functional = _flag("functional", options.get("functional", "1"))
        self.allocator = options.get("allocator", "best_fit")
        if self.allocator not in ALLOCATORS:
            valid = ", ".join(sorted(ALLOCATORS))
            raise errors.InvalidArgument(f"NpuSimExecutionProvider option allocator="
                                         f"{self.allocator!r}; valid: {valid}")
        self.dim_overrides = _dim_overrides(options)
        self.external_mode = options.get("external_weights", "0")
        self.external_folder = options.get("external_weights_folder", DEFAULT_FOLDER)
        self.streaming = _flag("weight_streaming", options.get("weight_streaming", "1"))
        self.weight_checks = options.get("weight_checks", "changed")
        if self.weight_checks not in WEIGHT_CHECKS:
            raise errors.InvalidArgument(f"NpuSimExecutionProvider option weight_checks="
                                         f"{self.weight_checks!r}; valid: "
                                         f"{', '.join(WEIGHT_CHECKS)}")
        self.cpu_nodes = frozenset(filter(None, (n.strip() for n in
                                                 options.get("cpu_nodes", "").split(","))))
        session = context.session_config
        self.generating = config_flag(session, EP_CONTEXT_ENABLE)
        self.share = config_flag(session, SHARE_EP_CONTEXTS)
        self.stop_share = config_flag(session, STOP_SHARE_EP_CONTEXTS)
        if self.stop_share and not self.share:
            raise errors.InvalidArgument(
                f"{STOP_SHARE_EP_CONTEXTS}=1 marks the last session of a group sharing EP "
                f"contexts and needs {SHARE_EP_CONTEXTS}=1 too; got {SHARE_EP_CONTEXTS}="
                f"{session.get(SHARE_EP_CONTEXTS, '0')!r}")
        self.external = None
        if self.generating:
            settings = E.generation_settings(context)
            self.external = external_spec(self.external_mode, self.external_folder,
                                          settings.output_path, settings.model_name)
        elif self.external_mode not in ("0", "1", "2"):
            external_spec(self.external_mode, self.external_folder, Path("."), "")
        if self.share and self.generating:
            self._check_shared_generation()
        if given is not None:
            self.runtime = NpuRuntime(self.config, functional=self.functional, device=given)
        elif self.share and not self.generating:
            key = (self.config.digest, self.allocator, self.functional)
            self.runtime = workspace().runtime(key, self._new_runtime)
        else:
            self.runtime = self._new_runtime()
        self._private = given is None and not (self.share and not self.generating)
        """Whether the runtime is this session's alone: only then may an EPContext load place
        weights before their checksums are known (a failed load's allocations and queued uploads
        go with the session)."""
        self._declined: tuple[GraphView, dict[int, str]] | None = None
        self._staged: Staged | None = None
        self.programs: dict[str, Program] = {}
        self.reports: dict[str, CompileReport] = {}
        self.nodes: dict[str, NpuSimCompiledNode] = {}
        self._ran: list[str] = []  # partitions of the current (or last) session run
        self._recording: Recording | None = None
        # EPContext (ep/npusim/epcontext.py): nodes made at compile, binaries kept open.
        self._ep_context_nodes: list[onnx.NodeProto] = []
        self._context_binaries: list[Any] = []
        self._external_written: list[ExternalWeightFile] = []

    def free_dimension_overrides(self) -> dict[str, int]:
        """Symbolic dimensions fixed by provider options (``{"batch": "1"}``)."""
        return dict(self.dim_overrides)

    def _new_runtime(self) -> NpuRuntime:
        return NpuRuntime(self.config, allocator=self.allocator, functional=self.functional)

    def _check_shared_generation(self) -> None:
        settings = E.generation_settings(self.context)
        if settings.embed_mode != 0:
            raise errors.InvalidArgument(
                f"{SHARE_EP_CONTEXTS}=1 writes one context binary file for the session group; "
                "it needs ep.context_embed_mode=0, got 1")
        workspace().check_joinable(settings.output_path, self.config.name, self.config.digest)

    # -- the EP interface ---------------------------------------------------------------------

    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        """EPContext nodes made by this EP (one group each), then connected groups of nodes
        the NPU supports (see :mod:`ep.npusim.capability`)."""
        contexts = npu_epcontext.context_capability(graph)
        view = graph
        if contexts:
            taken = {i for cap in contexts for i in cap.nodes}
            view = graph.with_assigned(graph.assigned | taken)
        capabilities, reasons = self._npu_capability(view)
        self._declined = (graph, reasons)
        return contexts + capabilities

    def _npu_capability(self, view: GraphView) -> tuple[list[ComputeCapability], dict[int, str]]:
        """:func:`get_npu_capability` without the nodes the ``cpu_nodes`` option names."""
        if not self.cpu_nodes:
            return get_npu_capability(view)
        unknown = self.cpu_nodes - set(view.names) - {n.op_type for n in view.nodes}
        if unknown:
            raise errors.InvalidArgument(
                f"NpuSimExecutionProvider option cpu_nodes: {', '.join(sorted(unknown))} names "
                "no node and no op type of the model")
        moved = {i: MOVED_TO_CPU for i, (node, name) in enumerate(zip(view.nodes, view.names,
                                                                     strict=True))
                 if i not in view.assigned and (name in self.cpu_nodes
                                                or node.op_type in self.cpu_nodes)}
        capabilities, reasons = get_npu_capability(view, set(moved))
        return capabilities, {**reasons, **moved}

    def decline_reasons(self, graph: GraphView) -> dict[int, str]:
        """Why each unassigned node the NPU does not take was declined (for the view
        :meth:`get_capability` was just asked about, the reasons it found then)."""
        if self._declined is not None and self._declined[0] is graph:
            return dict(self._declined[1])
        _, reasons = self._npu_capability(graph)
        return reasons

    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        """Compile and load every fused node; one compiled node each, in order."""
        contexts = [f for f in fused_nodes if npu_epcontext.is_context_fused(f)]
        # On a private runtime a binary's weights are checksummed on a thread while the
        # programs are placed; the load succeeds, or fails for anything else, only once they
        # are verified. On a shared runtime or the caller's device (or memory) they already are.
        checks = npu_epcontext.WeightChecks(recheck=self.weight_checks == "always")
        before = set(self.nodes)
        try:
            loaded: dict[str, Program] = {}
            if contexts:
                acquire = workspace().acquire_binary if self.share else None
                programs, binaries = npu_epcontext.load_programs(
                    contexts, self.context, self.config, checks, acquire,
                    defer_weights=self._private and not self._weight_memory)
                self._context_binaries.extend(binaries)
                loaded = {f.name: p for f, p in zip(contexts, programs, strict=True)}
            compiled = self._compile(fused_nodes, loaded)
            checks.wait()
        except BaseException:
            checks.wait()  # a bad weight block is the error reported, whatever else failed
            self._discard(set(self.nodes) - before)
            raise
        return compiled

    def _discard(self, names: set[str]) -> None:
        """Unload the nodes a failed :meth:`compile` loaded: on a shared or the caller's device
        its allocations and queued uploads must not outlive it (they land, then are freed)."""
        for name in names:
            self.nodes.pop(name).release()
            self.programs.pop(name, None)

    def _compile(self, fused_nodes: Sequence[FusedNode],
                 loaded: dict[str, Program]) -> list[CompiledNode]:
        fresh: list[tuple[FusedNode, Program]] = []
        compiled: list[CompiledNode] = []
        for fused in fused_nodes:
            if fused.name in loaded:
                compiled.append(self._add_context_program(fused, loaded[fused.name]))
                continue
            try:
                result = compile_partition(fused, self.config, dim_overrides=self.dim_overrides)
            except NpuSimError as exc:  # a bad attribute or shape found while compiling
                raise errors.InvalidGraph(f"NpuSim: cannot compile partition {fused.name!r}: "
                                          f"{exc}") from None
            self.reports[fused.name] = result.report
            fresh.append((fused, result.program))
            compiled.append(self.add_program(fused.name, result.program, fused.inputs))
        if fresh and self.generating and self.share:
            nodes, self._staged = npu_epcontext.make_shared_context_nodes(
                fresh, self.context, self.config, workspace(), stop=self.stop_share,
                external=self.external)
            self._ep_context_nodes.extend(nodes)
            self._external_written.extend(self._staged.external_weights)
        elif fresh and self.generating:
            nodes, written = npu_epcontext.make_context_nodes(fresh, self.context, self.config,
                                                              self.external)
            self._ep_context_nodes.extend(nodes)
            self._external_written.extend(written)
        if self.share and self.stop_share and not self.generating:
            workspace().release_loaded()
        unused = sorted(set(self._weight_memory) - {Path(w.path).name
                                                    for w in self.external_weight_files()})
        if unused:
            known = sorted({Path(w.path).name for w in self.external_weight_files()})
            raise errors.InvalidArgument(f"external weight memory was given for {unused}, which "
                                         f"no EPContext node of this model uses; its external "
                                         f"weight files: {known}")
        return compiled

    def get_ep_context_nodes(self) -> list[onnx.NodeProto]:
        """The EPContext nodes of the partitions compiled with ``ep.context_enable=1``."""
        return list(self._ep_context_nodes)

    def end_ep_context_generation(self, committed: bool) -> None:
        """With ``ep.share_ep_contexts=1``: the session's graphs join the group once its
        EPContext model is written (``committed``), or are dropped if it failed; a last session
        that compiled nothing for the NPU still writes the group's binary."""
        staged, self._staged = self._staged, None
        if staged is not None:
            if committed:
                workspace().commit(staged)
            else:
                workspace().abort(staged)
        elif committed and self.share and self.stop_share and self.generating:
            settings = E.generation_settings(self.context)
            self._external_written.extend(workspace().finish_without_graphs(
                settings.output_path, hardware_architecture=self.config.name,
                config_digest=self.config.digest, external=self.external))

    def external_weight_files(self) -> list[ExternalWeightFile]:
        """The external weights of this provider's programs, like GE's compile summary
        (``GetExternalWeightPaths``): one entry per distinct weight with its file's ``path``,
        its ``size`` in bytes, its ``offset`` in the file and its ``id`` (SHA-256). After
        generating with ``external_weights`` 1 or 2, the weights written (or found in the
        folder) for the session's binary; after loading an EPContext model, those its binaries
        refer to. Paths are absolute."""
        seen: dict[tuple[str, int], ExternalWeightFile] = {}
        for item in self._external_written:
            seen.setdefault((item.id, item.offset), item)
        for binary in self._context_binaries:
            for item in binary.external_weights:
                seen.setdefault((item.id, item.offset), item)
        return list(seen.values())

    def _add_context_program(self, fused: FusedNode, program: Program) -> NpuSimCompiledNode:
        """Load a program read from a context binary for its EPContext node: I/O bound by
        position (:func:`~ep.npusim.epcontext.check_binding`), and a program the firmware's
        loader refuses is the binary's fault, so ``InvalidGraph`` with the loader's reason."""
        npu_epcontext.check_binding(fused, program)
        pinned = self._pinned(program)
        try:
            return self.add_program(fused.name, program, [d.name for d in program.input_descs()],
                                    pinned=pinned)
        except (errors.EPFail, errors.InvalidArgument) as exc:
            raise E.load_error(f"EPContext node {fused.name!r}: the device cannot load its "
                               f"graph {program.name!r}: {exc.message}") from None

    def _pinned(self, program: Program) -> dict[int, tuple[DeviceBuffer, int]]:
        """Weight tensors of a program read from a context binary that go to caller-provided
        memory: tensor -> (buffer, offset of the weight in its file)."""
        if not self._weight_memory:
            return {}
        sources = next((b.external_weights_of(name) for b in self._context_binaries
                        for name in b.graph_names() if b.program(name) is program), {})
        pinned: dict[int, tuple[DeviceBuffer, int]] = {}
        for tensor, weight in sources.items():
            path = Path(weight.path)
            buffer = self._weight_memory.get(path.name)
            if buffer is None:
                continue
            if buffer.device_id != self.runtime.device.id:
                raise errors.InvalidArgument(f"external weight memory for {path.name!r} was "
                                             "allocated on another device than the session's")
            size = path.stat().st_size
            if buffer.nbytes < size:
                raise errors.InvalidArgument(
                    f"external weight memory for {path.name!r} is {buffer.nbytes} bytes; the "
                    f"file is {size} bytes: allocate at least {size}")
            pinned[tensor] = (buffer, weight.offset)
        return pinned

    def add_program(self, name: str, program: Program,
                    input_names: Sequence[str] | None = None, *,
                    pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None,
                    ) -> NpuSimCompiledNode:
        """Load ``program`` (freshly compiled or read from a context binary) as node ``name``;
        ``pinned`` weight tensors go to caller-provided memory."""
        node = NpuSimCompiledNode(name, program, self.runtime, input_names,
                                  on_run=self._ran.append, stream=self.streaming, pinned=pinned)
        node.recording = self._recording
        self.programs[name] = program
        self.nodes[name] = node
        return node

    def run_stats(self) -> dict[str, Any]:
        """The last run of the whole model on the NPU: simulated cycles and microseconds summed
        over every NPU partition the run executed (a partial run executes only what its outputs
        need), per-engine utilization over that span, ``energy`` (total, dynamic and static
        picojoules, per engine and component, average power, TOPS/W:
        :func:`~ep.npusim.runtime.run_energy`), the device's counter deltas, and
        ``partitions`` with each partition's own figures."""
        runs = {name: self.nodes[name].last_stats for name in dict.fromkeys(self._ran)
                if name in self.nodes and self.nodes[name].last_stats}
        return combine_stats(runs, self.config)

    def on_run_start(self) -> None:
        """A session run begins: its stats are those of the partitions it runs."""
        self._ran.clear()

    def start_profiling(self, model: str) -> None:
        """Record every run of every partition into one trace (:mod:`npu_sim.trace`), also
        partitions compiled later."""
        self._recording = Recording(self.config, model, SDK_VERSION,
                                    {"provider": self.type, "functional": self.functional})
        for node in self.nodes.values():
            node.recording = self._recording

    def end_profiling(self) -> Trace | None:
        """The trace recorded since :meth:`start_profiling`; recording stops."""
        recording, self._recording = self._recording, None
        for node in self.nodes.values():
            node.recording = None
        return recording.trace() if recording is not None else None


def _device_config(value: str) -> DeviceConfig:
    try:
        return DeviceConfig.named(value)
    except ConfigError as exc:
        raise errors.InvalidArgument(f"NpuSimExecutionProvider option device={value!r}: "
                                     f"{exc}") from None


def _flag(key: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise errors.InvalidArgument(f"NpuSimExecutionProvider option {key}={value!r}; "
                                     f"expected '0' or '1'")
    return value == "1"


def _dim_overrides(options: Mapping[str, str]) -> dict[str, int]:
    overrides: dict[str, int] = {}
    for key, value in options.items():
        if key in OPTION_KEYS:
            continue
        try:
            number = int(str(value).strip())
        except ValueError:
            raise errors.InvalidArgument(
                f"NpuSimExecutionProvider: unknown option {key!r}={value!r}; valid keys: "
                f"{', '.join(OPTION_KEYS)}, or a symbolic dimension name with an integer "
                f"value") from None
        if number < 1:
            raise errors.InvalidArgument(f"NpuSimExecutionProvider: dimension {key!r}={value!r}"
                                         f"; expected an integer >= 1")
        overrides[key] = number
    return overrides
