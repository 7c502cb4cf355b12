"""``get_provider_graph_assignment_info``: which subgraphs each provider took, as onnxruntime
reports them when ``session.record_ep_graph_assignment_info`` is ``"1"``.

onnxruntime lists a compiling provider's subgraph with all its nodes, and the CPU provider's
nodes one subgraph each (it runs them as kernels, node by node). Nodes are named as in the
model (an unnamed node's name is empty), in the order the session runs them. What ep shows is
the graph it partitioned, after onnxruntime's basic optimizations; the CPU provider's
partitions are then optimized further by onnxruntime, whose own list would show those
higher-level fusions (``docs/conformance.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import Fail
from .graph import GraphView
from .partitioner import CPU, PartitionPlan

RECORD = "session.record_ep_graph_assignment_info"


@dataclass(frozen=True)
class EpAssignedNode:
    """onnxruntime's ``OrtEpAssignedNode``."""

    name: str
    domain: str
    op_type: str


@dataclass(frozen=True)
class EpAssignedSubgraph:
    """onnxruntime's ``OrtEpAssignedSubgraph``: the provider and the nodes it took."""

    ep_name: str
    nodes: tuple[EpAssignedNode, ...]

    def get_nodes(self) -> list[EpAssignedNode]:
        return list(self.nodes)


def assignment_info(config: Mapping[str, str], graph: GraphView,
                    plan: PartitionPlan) -> list[EpAssignedSubgraph]:
    """The session's subgraphs per provider; ``Fail`` (onnxruntime's words) unless recording
    was asked for."""
    if config.get(RECORD) != "1":
        raise Fail(f"1Session configuration entry '{RECORD}' must be set to \"1\" to retrieve "
                   "EP graph assignment information.")
    subgraphs: list[EpAssignedSubgraph] = []
    for part in plan.partitions:
        nodes = [_node(graph, i) for i in part.nodes]
        groups: Sequence[list[EpAssignedNode]] = \
            [[n] for n in nodes] if part.provider == CPU else [nodes]
        subgraphs += [EpAssignedSubgraph(part.provider, tuple(g)) for g in groups if g]
    return subgraphs


def _node(graph: GraphView, index: int) -> EpAssignedNode:
    node = graph.nodes[index]
    return EpAssignedNode(node.name, node.domain, node.op_type)
