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
are produced outside it, graph inputs included; initializers are not inputs, they go into the
fused subgraph of every partition that uses them. Its ``outputs`` are the tensors it produces
that another partition reads or that are graph outputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper

from ..errors import EPFail, InvalidArgument
from .cpu import CPUExecutionProvider
from .graph import GraphView
from .provider import ExecutionProvider, FusedNode

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
        capabilities = provider.get_capability(view)
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
    """The graph of clusters (partitions and unassigned single nodes) with union-find."""

    def __init__(self, graph: GraphView) -> None:
        n = len(graph.nodes)
        self.parent = list(range(n))
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}
        self.provider: dict[int, str | None] = {i: None for i in range(n)}
        self.succ: dict[int, set[int]] = {i: set() for i in range(n)}
        self.pred: dict[int, set[int]] = {i: set() for i in range(n)}
        self.lo = list(range(n))  # smallest topological index in the cluster
        self.hi = list(range(n))  # largest
        for i in range(n):
            for name in graph.node_inputs(i):
                p = graph.producer(name)
                if p is not None and p != i:
                    self.succ[p].add(i)
                    self.pred[i].add(p)

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def _reaches_via_other(self, a: int, b: int) -> bool:
        """True if a path a -> X -> ... -> b exists with X not in {a, b}."""
        targets = self.pred[b] - {a}
        if not targets:
            return False
        limit = self.hi[b]
        stack = [c for c in self.succ[a] if c != b and self.lo[c] < limit]
        seen = set(stack)
        while stack:
            c = stack.pop()
            if c in targets:
                return True
            for d in self.succ[c]:
                if d not in seen and d != b and self.lo[d] < limit:
                    seen.add(d)
                    stack.append(d)
        return False

    def can_merge(self, a: int, b: int) -> bool:
        return not (self._reaches_via_other(a, b) or self._reaches_via_other(b, a))

    def merge(self, a: int, b: int) -> int:
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        self.parent[b] = a
        self.members[a].extend(self.members.pop(b))
        self.lo[a], self.hi[a] = min(self.lo[a], self.lo[b]), max(self.hi[a], self.hi[b])
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
        return a

    def place(self, group: list[int], provider: str) -> None:
        """Turn ``group`` (unassigned nodes, topological order) into as few acyclic clusters
        as greedy merging finds, then merge those clusters pairwise while that stays acyclic."""
        pieces: list[int] = []
        for i in group:
            self.provider[i] = provider
            for k, piece in enumerate(pieces):
                if self.can_merge(piece, i):
                    pieces[k] = self.merge(piece, i)
                    break
            else:
                pieces.append(i)
        merged = True
        while merged and len(pieces) > 1:
            merged = False
            for x in range(len(pieces)):
                for y in range(x + 1, len(pieces)):
                    if self.can_merge(pieces[x], pieces[y]):
                        pieces[x] = self.merge(pieces[x], pieces[y])
                        del pieces[y]
                        merged = True
                        break
                if merged:
                    break

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


def _boundary(graph: GraphView, nodes: tuple[int, ...]) -> tuple[list[str], list[str]]:
    inside = set(nodes)
    inputs: dict[str, None] = {}
    outputs: dict[str, None] = {}
    graph_outputs = set(graph.outputs)
    for i in nodes:
        for name in graph.node_inputs(i):
            if name in graph.initializers or graph.producer(name) in inside:
                continue
            inputs.setdefault(name)
        for name in graph.nodes[i].output:
            if not name:
                continue
            if name in graph_outputs or any(c not in inside for c in graph.consumers(name)):
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
    internal: dict[str, None] = {}
    for i in part.nodes:
        for name in graph.node_inputs(i):
            if name in graph.initializers:
                used.setdefault(name)
        for name in graph.nodes[i].output:
            if name and name not in part.outputs:
                internal.setdefault(name)
    value_info = [
        _typed(graph, n) for n in internal if graph.value_info(n) is not None
    ]
    sub = helper.make_graph(
        nodes,
        part.name,
        [_typed(graph, n) for n in part.inputs],
        [_typed(graph, n) for n in part.outputs],
        initializer=[graph.initializers[n] for n in used],
        value_info=value_info,
    )
    return FusedNode(
        name=part.name,
        graph=sub,
        inputs=list(part.inputs),
        outputs=list(part.outputs),
        opset_imports=list(graph.model.opset_import),
        source_nodes=part.nodes,
    )
