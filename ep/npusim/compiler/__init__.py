"""The NPU compiler: one partition (a fused node's ONNX subgraph) in, one Program out.

:func:`compile_partition` runs five stages, one module each:

1. import (:mod:`.ir`): the subgraph with every shape static (dim overrides + ONNX shape
   inference; a symbolic dimension left is an error naming the tensor);
2. rewrites (:mod:`.rewrite`): constant folding, QDQ -> QLinear, BatchNormalization into Conv,
   MatMul + Add -> Gemm, activation fusion, then epilogue fusion (:mod:`.epilogue`);
3. lowering (:mod:`.lower`): one kernel launch per remaining node, views aliased to their input;
4. tiling (:mod:`.tiling`) and memory plan (:mod:`.memplan`): core split, SRAM tiles and core
   masks per launch; arena offsets by liveness with reuse, weights placed once per content;
5. emission (:mod:`.emit`): KERNEL commands with data and anti-dependencies.

The result is a :class:`CompiledPartition`: the :class:`~firmware_model.program.Program` the
firmware loads, and a :class:`CompileReport` of every decision and figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from firmware_model.commands import pack
from firmware_model.program import KernelLaunch, Program, Region, TensorDesc
from npu_sim.config import DeviceConfig

from ...framework.provider import FusedNode
from .emit import emit, launch_dependencies
from .ir import SubGraph
from .lower import Launch, Lowered, lower
from .memplan import ArenaPlan, liveness, plan_arena, plan_weights
from .rewrite import optimize
from .tiling import PLANS, TilePlan, assign_cores

__all__ = ["CompileReport", "CompiledPartition", "compile_partition", "compile_subgraph"]


@dataclass
class CompileReport:
    """What the compiler decided and measured for one partition."""

    name: str
    rewrites: dict[str, int]
    launches: list[dict[str, Any]]
    arena: ArenaPlan
    weights_bytes: int
    distinct_weights: int
    views_aliased: int
    anti_dependencies: int
    commands: int
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Flat figures (for logs, benchmarks and tests)."""
        return {
            "name": self.name, "launches": len(self.launches), "commands": self.commands,
            "arena_bytes": self.arena.peak, "arena_lower_bound": self.arena.lower_bound,
            "arena_no_reuse": self.arena.no_reuse, "arena_ratio": self.arena.ratio,
            "weights_bytes": self.weights_bytes, "views_aliased": self.views_aliased,
            "anti_dependencies": self.anti_dependencies, **self.rewrites,
            "compile_seconds": sum(self.seconds.values()),
        }


@dataclass
class CompiledPartition:
    """A compiled partition: the program to load and the report of how it was made."""

    program: Program
    report: CompileReport


def compile_partition(
    fused: FusedNode,
    config: DeviceConfig,
    *,
    dim_overrides: Mapping[str, int] | None = None,
    name: str | None = None,
) -> CompiledPartition:
    """Compile ``fused`` for ``config``; raises ``ep.errors`` types for what cannot compile."""
    start = time.perf_counter()
    graph = SubGraph.from_fused(fused.body, fused.opset_imports, dim_overrides,
                                initializers=fused.all_initializers(), values=fused.values)
    seconds = {"import": time.perf_counter() - start}
    return compile_subgraph(graph, config, name=name or fused.name, seconds=seconds)


def compile_subgraph(
    graph: SubGraph,
    config: DeviceConfig,
    *,
    name: str,
    seconds: dict[str, float] | None = None,
) -> CompiledPartition:
    """Compile an imported :class:`~.ir.SubGraph` (stages 2-5 of the module docstring)."""
    seconds = dict(seconds or {})
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = now - clock
        clock = now

    rewrites = optimize(graph)
    lap("rewrite")
    lowered = lower(graph)
    lap("lower")
    planner = PLANS.planner(config)
    plans = [_plan(planner, lowered, launch) for launch in lowered.launches]
    lap("tiling")
    buffers = liveness(lowered)
    arena = plan_arena(buffers, config.hbm_alignment)
    weights = plan_weights({lowered.tensors[i].name: v for i, v in lowered.consts.items()},
                           config.hbm_alignment)
    lap("memplan")
    deps, anti = launch_dependencies(lowered, buffers, arena.offsets, config.hbm_alignment)
    masks = assign_cores(config, plans, deps)
    commands = emit(deps, masks)
    lap("emit")
    program = _program(name, config, lowered, arena, weights, commands)
    report = CompileReport(
        name=name,
        rewrites=rewrites,
        launches=[{"op": launch.op, "node": launch.node, "core_mask": mask, **plan.as_dict()}
                  for launch, plan, mask in zip(lowered.launches, plans, masks, strict=True)],
        arena=arena,
        weights_bytes=weights.total_bytes,
        distinct_weights=weights.distinct,
        views_aliased=lowered.views,
        anti_dependencies=anti,
        commands=len(commands),
        seconds=seconds,
    )
    return CompiledPartition(program, report)


def _plan(planner: Callable[..., TilePlan], lowered: Lowered, launch: Launch) -> TilePlan:
    """``launch``'s tile plan from ``planner`` (:meth:`.tiling.PlanCache.planner`): launches
    of the same op, types and attributes share one, since pricing reads nothing else."""
    tensors = lowered.tensors
    ins = [(tensors[t].dtype, tensors[t].shape) if t >= 0 else None for t in launch.inputs]
    outs = [(tensors[t].dtype, tensors[t].shape) for t in launch.outputs]
    return planner(launch.op, ins, outs, launch.attrs)


def _program(name, config, lowered, arena, weights, commands) -> Program:
    descs = []
    blobs = {}
    for i, t in enumerate(lowered.tensors):
        if t.is_const:
            descs.append(TensorDesc(t.name, t.shape, t.dtype, Region.WEIGHTS,
                                    weights.offsets[t.name]))
            blobs[i] = weights.blobs[t.name]
        else:
            descs.append(TensorDesc(t.name, t.shape, t.dtype, Region.ARENA,
                                    arena.offsets[t.buffer]))
    launches = tuple(KernelLaunch(launch.op, launch.inputs, launch.outputs, launch.attrs,
                                  launch.node) for launch in lowered.launches)
    return Program(
        name=name,
        tensors=tuple(descs),
        launches=launches,
        commands=pack(commands),
        inputs=tuple(lowered.inputs),
        outputs=tuple(lowered.outputs),
        weights=blobs,
        arena_bytes=arena.peak,
        hardware_architecture=config.name,
    )
