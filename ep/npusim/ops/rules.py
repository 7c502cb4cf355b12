"""Support rules shared by several ops' checks, and the liveness of a node's outputs.

A check takes the :class:`~ep.framework.graph.GraphView` and a node index and returns ``None``
or a reason the node is declined, without the op-type prefix :func:`~ep.npusim.capability.
check_node` adds.
"""

from __future__ import annotations

from collections.abc import Iterable

from ep.framework.graph import GraphView


def const(*names: str, start: int = 1) -> tuple[tuple[int, str], ...]:
    """``const_inputs`` for consecutive inputs from ``start`` (``const("min", "max")``)."""
    return tuple((start + k, name) for k, name in enumerate(names))


def spatial(graph: GraphView, i: int) -> str | None:
    """Input rank 3 to 5: N, C and 1 to 3 spatial dimensions."""
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if shape is not None and not 3 <= len(shape) <= 5:
        return f"input rank {len(shape)} not supported; expected 3 to 5 (N, C, 1-3 spatial dims)"
    return None


def nonempty(graph: GraphView, i: int) -> str | None:
    """Input 0 has no zero dimension."""
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if shape is not None and 0 in shape:
        return f"empty input (shape {tuple(shape)}) not supported"
    return None


def require_constant(
    graph: GraphView, inputs: Iterable[str], named: Iterable[tuple[int, str]]
) -> str | None:
    """A reason if an input of ``named`` (index, name) is present but not constant."""
    inputs = list(inputs)
    for index, name in named:
        if index < len(inputs) and inputs[index] and graph.constant(inputs[index]) is None:
            return f"input '{name}' must be constant (an initializer or Constant output)"
    return None


def is_dead(graph: GraphView, tensor: str) -> bool:
    """Whether nothing reads ``tensor``: omitted, or no consumer and not a graph output."""
    return not tensor or (not graph.consumers(tensor) and tensor not in graph.outputs)


def live_outputs(graph: GraphView, i: int) -> list[str]:
    """Node ``i``'s outputs up to its last one something reads (the dead tail dropped)."""
    outputs = list(graph.nodes[i].output)
    while outputs and is_dead(graph, outputs[-1]):
        outputs.pop()
    return outputs
