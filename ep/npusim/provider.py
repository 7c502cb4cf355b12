"""``NpuSimExecutionProvider``: the NPU execution provider, in ONNX Runtime's shape.

Created with a :class:`~ep.framework.provider.ProviderContext` whose provider options are
strings, as ONNX Runtime passes them:

=============  ==========================================================================
``device``     a preset name (``npu-s``, ``npu-m``, ``npu-l``, ``os32``) or the path of a
               ``.json`` / ``.toml`` device config; default ``npu-m``
``functional`` ``"1"`` (default): compute values; ``"0"``: timing only, outputs are zeros
``allocator``  the device's HBM allocation strategy (``best_fit`` default, ``first_fit``,
               ``mru``)
any other key  whose value is an integer: the value of the symbolic dimension of that name
               (``{"batch": "1"}``)
=============  ==========================================================================

:meth:`get_capability` / :meth:`decline_reasons` come from :mod:`ep.npusim.capability`;
:meth:`compile` compiles each fused node (:func:`ep.npusim.compiler.compile_partition`) and
loads its program on the provider's one device (:mod:`ep.npusim.runtime`). The programs are kept
in :attr:`programs` by fused-node name and the compile reports in :attr:`reports`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from firmware_model import Program
from npu_sim.config import PRESETS, DeviceConfig
from npu_sim.errors import ConfigError
from npu_sim.hbm import ALLOCATORS

from .. import errors
from ..framework.graph import GraphView
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
from .runtime import NpuRuntime, NpuSimCompiledNode

OPTION_KEYS = ("device", "functional", "allocator")


class NpuSimExecutionProvider(ExecutionProvider):
    """The simulated NPU as an execution provider (see the module docstring for options)."""

    type = "NpuSimExecutionProvider"

    def __init__(self, context: ProviderContext | None = None) -> None:
        super().__init__(context)
        options = dict(self.context.provider_options)
        self.config = _device_config(options.get("device", "npu-m"))
        self.functional = _flag("functional", options.get("functional", "1"))
        self.allocator = options.get("allocator", "best_fit")
        if self.allocator not in ALLOCATORS:
            valid = ", ".join(sorted(ALLOCATORS))
            raise errors.InvalidArgument(f"NpuSimExecutionProvider option allocator="
                                         f"{self.allocator!r}; valid: {valid}")
        self.dim_overrides = _dim_overrides(options)
        self.runtime = NpuRuntime(self.config, allocator=self.allocator,
                                  functional=self.functional)
        self.programs: dict[str, Program] = {}
        self.reports: dict[str, CompileReport] = {}
        self.nodes: dict[str, NpuSimCompiledNode] = {}
        # EPContext (ep/npusim/epcontext.py): nodes made at compile, binaries kept open.
        self._ep_context_nodes: list[onnx.NodeProto] = []
        self._context_binaries: list[Any] = []

    # -- the EP interface ---------------------------------------------------------------------

    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        """EPContext nodes made by this EP (one group each), then connected groups of nodes
        the NPU supports (see :mod:`ep.npusim.capability`)."""
        contexts = npu_epcontext.context_capability(graph)
        if contexts:
            taken = {i for cap in contexts for i in cap.nodes}
            graph = graph.with_assigned(graph.assigned | taken)
        capabilities, _ = get_npu_capability(graph)
        return contexts + capabilities

    def decline_reasons(self, graph: GraphView) -> dict[int, str]:
        """Why each unassigned node the NPU does not take was declined."""
        _, reasons = get_npu_capability(graph)
        return reasons

    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        """Compile and load every fused node; one compiled node each, in order."""
        contexts = [f for f in fused_nodes if npu_epcontext.is_context_fused(f)]
        loaded: dict[str, Program] = {}
        if contexts:
            programs, binaries = npu_epcontext.load_programs(contexts, self.context, self.config)
            self._context_binaries.extend(binaries)
            loaded = {f.name: p for f, p in zip(contexts, programs, strict=True)}
        fresh: list[tuple[FusedNode, Program]] = []
        compiled: list[CompiledNode] = []
        for fused in fused_nodes:
            if fused.name in loaded:
                compiled.append(self.add_program(fused.name, loaded[fused.name], fused.inputs))
                continue
            result = compile_partition(fused, self.config, dim_overrides=self.dim_overrides)
            self.reports[fused.name] = result.report
            fresh.append((fused, result.program))
            compiled.append(self.add_program(fused.name, result.program, fused.inputs))
        if fresh and self.context.session_config.get("ep.context_enable") == "1":
            self._ep_context_nodes.extend(
                npu_epcontext.make_context_nodes(fresh, self.context, self.config))
        return compiled

    def get_ep_context_nodes(self) -> list[onnx.NodeProto]:
        """The EPContext nodes of the partitions compiled with ``ep.context_enable=1``."""
        return list(self._ep_context_nodes)

    def add_program(self, name: str, program: Program,
                    input_names: Sequence[str] | None = None) -> NpuSimCompiledNode:
        """Load ``program`` (freshly compiled or read from a context binary) as node ``name``."""
        node = NpuSimCompiledNode(name, program, self.runtime, input_names)
        self.programs[name] = program
        self.nodes[name] = node
        return node

    def run_stats(self) -> dict[str, Any]:
        """Simulated latency of the last run (cycles, microseconds), per-engine utilization
        (busy cycles / span for each core and DMA channel) and the device's counter deltas."""
        return self.runtime.last_run_stats()


def _device_config(value: str) -> DeviceConfig:
    try:
        if value in PRESETS:
            return DeviceConfig.preset(value)
        if Path(value).suffix.lower() in (".json", ".toml"):
            return DeviceConfig.from_file(value)
    except ConfigError as exc:
        raise errors.InvalidArgument(f"NpuSimExecutionProvider option device={value!r}: "
                                     f"{exc}") from None
    raise errors.InvalidArgument(
        f"NpuSimExecutionProvider option device={value!r}; expected a preset "
        f"({', '.join(sorted(PRESETS))}) or the path of a .json or .toml device config")


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
