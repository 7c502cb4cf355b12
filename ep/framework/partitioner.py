"""Partitioning: which provider runs which nodes, as fused, acyclic partitions.

This follows ONNX Runtime's ``GraphPartitioner``:

* Providers are asked in priority order, first come first served. Each provider's
  ``get_capability`` gets a :class:`~ep.framework.graph.GraphView` whose ``assigned`` set holds
  the nodes earlier providers took; it must not offer them, and if it does anyway they are
  dropped here (as ORT's ``PlaceNode`` ignores nodes that already have a provider).
* Every :class:`~ep.framework.provider.ComputeCapability` becomes one or more fused partitions.
  A group is split when keeping it whole would make a partition depend on itself through
  another provider's partition (A(npu) -> B(cpu) -> C(npu) with A -> C: {A, C} cannot be one
  fused node, since it would have to run both before and after B).
* ``CPUExecutionProvider`` runs whatever is left. It is always asked last, whether or not it is
  in the list (a CPU provider given in the list is used, moved to the end); its nodes are
  grouped into maximal acyclic partitions too.

The cycle check works on the *quotient graph*: every partition (and every still-unassigned
node) is one vertex, with an edge wherever a tensor flows between them. Merging two vertices
keeps it acyclic iff neither reaches the other through a third vertex. Nodes join a partition
in topological order, so a group that is already convex stays whole.

Tensors at partition boundaries: a partition's ``inputs`` are the tensors its nodes read that
are produced outside it, graph inputs included; initializers and small ``Constant`` node outputs
(:func:`shared_constant`) are not inputs, they go into the fused subgraph of every partition
that uses them. Its ``outputs`` are the tensors it produces
that another partition reads or that are graph outputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper, numpy_helper

from ..errors import EPFail, InvalidArgument
from .cpu import CPUExecutionProvider
from .graph import GraphView
from .provider import ExecutionProvider, FusedNode, provider_call

CPU = CPUExecutionProvider.type


@dataclass(frozen=True)
class Partition:
    """A set of nodes run by one provider as one fused node.

    ``nodes`` are GraphView indices in topological order; ``inputs``/``outputs`` are tensor
    names in the order of first use / production.
    """

    name: str
    provider: str
    nodes: tuple[int, ...]
    inputs: list[str]
    outputs: list[str]


@dataclass
class PartitionPlan:
    """The partitioning of a graph: partitions in a valid execution order, plus why nodes
    fell through to later providers."""

    graph: GraphView
    partitions: list[Partition]
    assignment: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, dict[str, str]] = field(default_factory=dict)

    def by_provider(self, provider: str) -> list[Partition]:
        """The partitions assigned to ``provider``, in execution order."""
        return [p for p in self.partitions if p.provider == provider]

    def fused_node(self, partition: Partition) -> FusedNode:
        """A standalone subgraph for ``partition``: its nodes, typed inputs and outputs, the
        initializers it uses and the value_info of its internal tensors."""
        return _fused_node(self.graph, partition)


def short_name(provider_type: str) -> str:
    """``"NpuSimExecutionProvider"`` -> ``"NpuSim"``: the prefix of partition names."""
    suffix = "ExecutionProvider"
    if provider_type.endswith(suffix) and len(provider_type) > len(suffix):
        return provider_type[: -len(suffix)]
    return provider_type


def partition(graph: GraphView, providers: Sequence[ExecutionProvider]) -> PartitionPlan:
    """Assign every node of ``graph`` to exactly one provider, as acyclic fused partitions.

    ``providers`` are in priority order; a ``CPUExecutionProvider`` is appended if absent and
    always asked last. Partition names are ``"{short provider name}_{k}"`` numbered per
    provider in execution order, so they are deterministic for a given model and providers.
    """
    types = [p.type for p in providers]
    duplicates = sorted({t for t in types if types.count(t) > 1})
    if duplicates:
        raise InvalidArgument(f"providers listed more than once: {duplicates}")
    cpu = [p for p in providers if p.type == CPU]
    ordered = [p for p in providers if p.type != CPU] + (cpu or [CPUExecutionProvider()])

    quotient = _Quotient(graph)
    owner: dict[int, str] = {}
    reasons: dict[str, dict[str, str]] = {}
    for provider in ordered:
        view = graph.with_assigned(owner)
        with provider_call(provider, "get_capability"):
            capabilities = list(provider.get_capability(view))
        taken: set[int] = set()
        for cap in capabilities:
            group = []
            for i in cap.nodes:
                if not isinstance(i, int) or not 0 <= i < len(graph.nodes):
                    raise EPFail(
                        f"{provider.type}.get_capability returned node index {i!r}; valid "
                        f"indices are 0..{len(graph.nodes) - 1}"
                    )
                if i not in owner and i not in taken:
                    group.append(i)
                    taken.add(i)
            for i in group:
                owner[i] = provider.type
            quotient.place(sorted(group), provider.type)
        unclaimed = [i for i in range(len(graph.nodes)) if i not in owner]
        if unclaimed:
            declined = provider.decline_reasons(view)
            for i in unclaimed:
                why = declined.get(i, f"not claimed by {provider.type}.get_capability")
                reasons.setdefault(graph.names[i], {})[provider.type] = why
    if len(owner) != len(graph.nodes):
        missing = [graph.names[i] for i in range(len(graph.nodes)) if i not in owner]
        raise EPFail(f"{CPU} did not take the remaining nodes {missing}")

    partitions = quotient.partitions(graph)
    assignment = {graph.names[i]: p.provider for p in partitions for i in p.nodes}
    return PartitionPlan(graph, partitions, assignment, reasons)


class _Quotient:
    """The graph of clusters (partitions, and unassigned nodes as singletons).

    A cluster is named by one of its nodes (its root). ``reach[c]`` is a bitset (a python
    int, bit k = node k) of the nodes in every cluster reachable from ``c`` through at least
    one edge; it makes the merge test a few bit operations. Merging updates the reach of the
    merged cluster's ancestors only, stopping where an ancestor already has it.
    """

    def __init__(self, graph: GraphView) -> None:
        n = len(graph.nodes)
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}
        self.mask: dict[int, int] = {i: 1 << i for i in range(n)}
        self.provider: dict[int, str | None] = {i: None for i in range(n)}
        self.succ: dict[int, set[int]] = {i: set() for i in range(n)}
        self.pred: dict[int, set[int]] = {i: set() for i in range(n)}
        for i in range(n):
            for name in graph.node_inputs(i):
                p = graph.producer(name)
                if p is not None and p != i:
                    self.succ[p].add(i)
                    self.pred[i].add(p)
        self.reach: dict[int, int] = {}
        for i in reversed(range(n)):  # node indices are a topological order
            bits = 0
            for s in self.succ[i]:
                bits |= self.reach[s] | self.mask[s]
            self.reach[i] = bits

    def _via_other(self, a: int, b: int) -> bool:
        """True if a path a -> X -> ... -> b exists with X not in {a, b}."""
        return any(self.reach[s] & self.mask[b] for s in self.succ[a] if s != b)

    def can_merge(self, a: int, b: int) -> bool:
        """Merging clusters ``a`` and ``b`` keeps the cluster graph acyclic."""
        return not (self._via_other(a, b) or self._via_other(b, a))

    def merge(self, a: int, b: int) -> int:
        """Merge ``b`` into ``a`` (the caller checked :meth:`can_merge`); returns the root."""
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        self.members[a].extend(self.members.pop(b))
        self.mask[a] |= self.mask.pop(b)
        self.reach[a] = (self.reach[a] | self.reach.pop(b)) & ~self.mask[a]
        for c in self.succ.pop(b):
            self.pred[c].discard(b)
            if c != a:
                self.pred[c].add(a)
                self.succ[a].add(c)
        for c in self.pred.pop(b):
            self.succ[c].discard(b)
            if c != a:
                self.succ[c].add(a)
                self.pred[a].add(c)
        self.succ[a].discard(a)
        self.pred[a].discard(a)
        del self.provider[b]
        # Every ancestor of the merged cluster now reaches all of it and all it reaches.
        need = self.mask[a] | self.reach[a]
        stack = list(self.pred[a])
        seen = set(stack)
        while stack:
            c = stack.pop()
            if self.reach[c] | need == self.reach[c]:
                continue  # so do its ancestors, which reach at least what it reaches
            self.reach[c] |= need
            for d in self.pred[c]:
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return a

    def place(self, group: list[int], provider: str) -> None:
        """Turn ``group`` (unassigned nodes, topological order) into acyclic clusters.

        Each node joins a cluster of this group that it is connected to if that stays acyclic,
        else the group's latest cluster, else starts a new one; then clusters of the group are
        merged pairwise wherever that stays acyclic, so no two of them could be one.
        """
        pieces: list[int] = []
        position: dict[int, int] = {}
        for i in group:
            self.provider[i] = provider
            candidates = [c for c in sorted(self.pred[i] | self.succ[i]) if c in position]
            if pieces and pieces[-1] not in candidates:
                candidates.append(pieces[-1])
            for c in candidates:
                if self.can_merge(c, i):
                    k = position.pop(c)
                    pieces[k] = self.merge(c, i)
                    position[pieces[k]] = k
                    break
            else:
                position[i] = len(pieces)
                pieces.append(i)
        changed = True
        while changed and len(pieces) > 1:
            changed = False
            merged: list[int] = []
            for piece in pieces:
                for k, other in enumerate(merged):
                    if self.can_merge(other, piece):
                        merged[k] = self.merge(other, piece)
                        changed = True
                        break
                else:
                    merged.append(piece)
            pieces = merged

    def partitions(self, graph: GraphView) -> list[Partition]:
        """Clusters in topological order (ties by first node), named per provider."""
        roots = sorted(self.members, key=lambda r: min(self.members[r]))
        pending = {r: len(self.pred[r]) for r in roots}
        rank = {r: k for k, r in enumerate(roots)}
        ready = [(rank[r], r) for r in roots if pending[r] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, r = heapq.heappop(ready)
            order.append(r)
            for s in self.succ[r]:
                pending[s] -= 1
                if pending[s] == 0:
                    heapq.heappush(ready, (rank[s], s))
        if len(order) != len(roots):  # the merge rule makes this unreachable; guard anyway
            raise EPFail("internal error: the partition graph has a cycle")
        counters: dict[str, int] = {}
        result = []
        for r in order:
            provider = self.provider[r]
            assert provider is not None
            k = counters.get(provider, 0)
            counters[provider] = k + 1
            nodes = tuple(sorted(self.members[r]))
            inputs, outputs = _boundary(graph, nodes)
            name = f"{short_name(provider)}_{k}"
            result.append(Partition(name, provider, nodes, inputs, outputs))
        return result


SHARED_CONSTANT_BYTES = 1 << 16
"""A ``Constant`` node's value up to this size is copied into every partition reading it."""


def shared_constant(graph: GraphView, name: str) -> bool:
    """Whether ``name`` is a small ``Constant`` node's output: like an initializer, it goes
    into the fused subgraph of every partition that reads it instead of crossing a partition
    boundary, so a consumer that needs it constant (axes, shapes) has it constant even when
    the partitioner put the ``Constant`` node in an earlier partition."""
    p = graph.producer(name)
    if p is None or graph.nodes[p].op_type != "Constant":
        return False
    value = graph.constant(name)
    return value is not None and value.nbytes <= SHARED_CONSTANT_BYTES


def _boundary(graph: GraphView, nodes: tuple[int, ...]) -> tuple[list[str], list[str]]:
    inside = set(nodes)
    inputs: dict[str, None] = {}
    outputs: dict[str, None] = {}
    graph_outputs = set(graph.outputs)
    for i in nodes:
        for name in graph.node_inputs(i):
            if name in graph.initializers or graph.producer(name) in inside or shared_constant(
                    graph, name):
                continue
            inputs.setdefault(name)
        for name in graph.nodes[i].output:
            if not name:
                continue
            if name in graph_outputs or (not shared_constant(graph, name) and any(
                    c not in inside for c in graph.consumers(name))):
                outputs.setdefault(name)
    return list(inputs), list(outputs)


def _typed(graph: GraphView, name: str) -> onnx.ValueInfoProto:
    vi = graph.value_info(name)
    if vi is not None:
        out = onnx.ValueInfoProto()
        out.CopyFrom(vi)
        return out
    return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)


def _fused_node(graph: GraphView, part: Partition) -> FusedNode:
    nodes = [graph.nodes[i] for i in part.nodes]
    used: dict[str, None] = {}
    copied: dict[str, onnx.TensorProto] = {}  # shared constants made outside the partition
    internal: dict[str, None] = {}
    inside = set(part.nodes)
    for i in part.nodes:
        for name in graph.node_inputs(i):
            if name in graph.initializers:
                used.setdefault(name)
            elif graph.producer(name) not in inside and shared_constant(graph, name):
                copied[name] = numpy_helper.from_array(graph.constant(name), name)
        for name in graph.nodes[i].output:
            if name and name not in part.outputs:
                internal.setdefault(name)
    value_info = [
        _typed(graph, n) for n in internal if graph.value_info(n) is not None
    ]
    # The session's initializers are referenced, not copied into the body: the NPU compiler
    # reads their values, and only an EP that asks for ``FusedNode.graph`` pays for a copy.
    body = helper.make_graph(
        nodes,
        part.name,
        [_typed(graph, n) for n in part.inputs],
        [_typed(graph, n) for n in part.outputs],
        initializer=list(copied.values()),
        value_info=value_info,
    )
    values = {n: v for n in used if (v := graph.weight(n)) is not None}
    return FusedNode(
        name=part.name,
        body=body,
        inputs=list(part.inputs),
        outputs=list(part.outputs),
        opset_imports=list(graph.model.opset_import),
        source_nodes=part.nodes,
        initializers={n: graph.initializers[n] for n in used},
        values=values,
    )
