"""What the NPU can run: the operator catalogue's support rules, checked node by node.

Each supported op's rules come from its entry in the operator catalogue (:mod:`ep.npusim.ops`):
:data:`SUPPORT_TABLE` is the catalogue's :class:`~ep.npusim.ops.OpSupport` per op type, with
the opset range of the model it accepts, the dtypes of its data tensors, the inputs that must be
constant (the compiler plans memory and tiles ahead of time, so shapes and axes cannot arrive at
run time) and an optional ``check`` for attribute constraints (``Resize`` only does nearest and
linear). Every input and output must have a static shape once dim overrides are applied, except
*dead* trailing outputs: optional outputs nobody reads (no consumer, not a graph output), like
the mask of an inference Dropout, which ONNX shape inference leaves untyped for Dropout-7. The
compiler drops them from the launch; a dead output followed by a used one still gets a tensor,
so it needs a static shape like any other.

:func:`check_node` answers "can the NPU run node i?" with ``None`` or a reason a user can act on
(``"Resize: mode=cubic not supported; supported: nearest, linear"``). :func:`get_npu_capability`
applies it to every unassigned node and groups the supported ones into connected groups; the
partitioner splits a group further if keeping it whole would create a cycle between partitions.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping

from ep.framework.graph import GraphView
from ep.framework.optimizer import SIZED_BY_VALUE
from ep.framework.provider import ComputeCapability
from ep.framework.shapes import INVENTED
from npu_sim.kernels import limits

from .ops import OpSupport
from .ops.catalogue import ALL, BOOL, FLOATS, INTS, MAX_OPSET, NUMERIC, SupportTable
from .ops.pool import CEIL_DISAGREES, pool_check
from .ops.rules import is_dead, live_outputs, require_constant

__all__ = ["ALL", "BOOL", "FLOATS", "INTS", "MAX_OPSET", "NUMERIC", "SUPPORT_TABLE", "OpSupport",
           "check_node", "get_npu_capability", "is_dead"]

SUPPORT_TABLE: Mapping[str, OpSupport] = SupportTable()
"""op_type -> what the NPU supports of it (ops of the default ONNX domain), read live from the
catalogue."""

_EMPTY_OK = frozenset({"Shape", "Constant", "ConstantOfShape"})
"""Ops the NPU runs on empty tensors; others leave them to the CPU, whose handling (an empty
result, or a refusal: ArgMax over nothing, LayerNormalization of nothing, Reshape inferring -1
from no elements) is onnxruntime's own."""

_MISSHAPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _misshapen_pools(graph: GraphView) -> dict[int, str]:
    """Node -> the pool upstream of it (itself included) whose inferred output shape
    onnxruntime does not produce, named; computed once per graph."""
    found = _MISSHAPEN.get(graph)
    if found is not None:
        return found
    pools = {}
    for i, node in enumerate(graph.nodes):
        if node.op_type in ("MaxPool", "AveragePool") and (why := pool_check(graph, i)) and (
                CEIL_DISAGREES in why):
            pools[i] = f"{node.op_type} {graph.names[i]!r}, for which {why}"
    found = {}
    first = min(pools, default=len(graph.nodes))  # topological order: none before reads one
    for i in range(first, len(graph.nodes)):
        if i in pools:
            found[i] = pools[i]
            continue
        for tensor in graph.nodes[i].input:
            p = graph.producer(tensor) if tensor else None
            if p is not None and p in found:
                found[i] = found[p]
                break
    _MISSHAPEN[graph] = found
    return found


def _unreliable_input(graph: GraphView, inputs: list[str]) -> str | None:
    """An input downstream of a pool whose inferred shape onnxruntime does not produce: the
    node would be compiled for a shape it never receives."""
    misshapen = _misshapen_pools(graph)
    for tensor in inputs:
        p = graph.producer(tensor) if tensor else None
        if p is not None and p in misshapen:
            return f"the shape of input '{tensor}' depends on {misshapen[p]}"
    return None


def _empty_tensor(graph: GraphView, inputs: Iterable[str], outputs: Iterable[str]) -> str | None:
    for role, tensors in (("input", inputs), ("output", outputs)):
        for tensor in tensors:
            _, shape = graph.tensor_type(tensor) if tensor else (None, None)
            if shape is not None and 0 in shape:
                return f"empty {role} '{tensor}' (shape {tuple(shape)}) not supported"
    return None


def _static(graph: GraphView, tensor: str, role: str, *, sized: bool = True) -> str | None:
    """Why ``tensor`` has no static shape the NPU can hold (None: it has one). ``sized``:
    refuse one of more elements than any tensor may hold (:mod:`npu_sim.kernels.limits`)."""
    _, shape = graph.tensor_type(tensor)
    if shape is None:
        return (f"unknown shape of {role} '{tensor}': ONNX shape inference could not determine "
                f"it; the NPU needs static shapes")
    for k, dim in enumerate(shape):
        if isinstance(dim, str) and not dim.startswith(INVENTED):
            return (f"dynamic dimension '{dim}' on {role} '{tensor}'; set a dim override "
                    f"(add_free_dimension_override_by_name, npu-sim --dim {dim}=VALUE)")
        if not isinstance(dim, int):
            return f"unknown dimension {k} on {role} '{tensor}'"
        if dim < 0:  # ONNX shape inference of a window wider than its padded input
            return f"negative dimension {k} ({dim}) inferred for {role} '{tensor}'"
    if sized and math.prod(shape) > limits.MAX_ELEMENTS:  # corrupt, hostile, or stale
        return (f"{role} '{tensor}' of shape {tuple(shape)} holds more than the "
                f"{limits.MAX_ELEMENTS:,} elements a tensor may")
    return None


def _reason(graph: GraphView, i: int) -> str | None:
    node = graph.nodes[i]
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    support = SUPPORT_TABLE.get(node.op_type)
    if support is None or support.domain != domain:
        return f"not supported by the NPU; supported: {', '.join(sorted(SUPPORT_TABLE))}"
    opset = graph.opset(domain)
    if not support.since_opset <= opset <= support.until_opset:
        return (
            f"opset {opset} not supported; supported opsets "
            f"{support.since_opset}..{support.until_opset}"
        )
    inputs = list(node.input)  # a protobuf field: read it once
    typed = [(inputs[k], "input", support.dtypes) for k in support.typed_inputs
             if k < len(inputs)]
    if node.output:
        typed.append((node.output[0], "output", support.output_dtypes or support.dtypes))
    for tensor, role, allowed in typed:
        if not tensor:
            continue
        dtype, _ = graph.tensor_type(tensor)
        if dtype not in allowed:
            shown = "unknown" if dtype is None else dtype
            return f"dtype {shown} of {role} '{tensor}' not supported; supported: " + ", ".join(
                allowed
            )
    # Constant inputs first: a runtime shape or axes input is why the output shape is unknown.
    if why := require_constant(graph, inputs, support.const_inputs):
        return why
    for tensor in inputs:
        if tensor and (why := _static(graph, tensor, "input")):
            return why
    if why := _unreliable_input(graph, inputs):
        return why
    live = live_outputs(graph, i)  # a dead tail is not materialized: any shape will do
    # An op sized by a constant's value is taken whatever it asks for: the compiler's folding
    # refuses a tensor too large to hold with a typed error before anything is allocated.
    sized = node.op_type not in SIZED_BY_VALUE
    for tensor in live:
        if not tensor:
            continue
        role = "unused output (a later output is used)" if is_dead(graph, tensor) else "output"
        if why := _static(graph, tensor, role, sized=sized):
            return why
    if support.check and (why := support.check(graph, i)):
        return why
    return None if node.op_type in _EMPTY_OK else _empty_tensor(graph, inputs, live)


def check_node(graph: GraphView, i: int) -> str | None:
    """None if the NPU can run node ``i``, else why not, prefixed with the op type."""
    why = _reason(graph, i)
    return None if why is None else f"{graph.nodes[i].op_type}: {why}"


def get_npu_capability(
    graph: GraphView, assigned: Iterable[int] = frozenset()
) -> tuple[list[ComputeCapability], dict[int, str]]:
    """Groups of supported nodes not yet assigned, and a reason for every declined node.

    Skips the nodes in ``assigned`` and in ``graph.assigned``. Supported nodes joined by edges
    (one produces a tensor the other reads; sharing only a graph input does not join) form one
    group, indices ascending, groups ordered by first node. The partitioner splits a group
    that would create a cycle between partitions.
    """
    taken = set(assigned) | set(graph.assigned)
    reasons: dict[int, str] = {}
    supported: list[int] = []
    for i in range(len(graph.nodes)):
        if i in taken:
            continue
        why = check_node(graph, i)
        if why is None:
            supported.append(i)
        else:
            reasons[i] = why
    parent = {i: i for i in supported}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in supported:
        for tensor in graph.node_inputs(i):
            p = graph.producer(tensor)
            if p is not None and p in parent:
                a, b = find(p), find(i)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in supported:
        groups.setdefault(find(i), []).append(i)
    capabilities = [ComputeCapability(tuple(g)) for _, g in sorted(groups.items())]
    return capabilities, reasons
