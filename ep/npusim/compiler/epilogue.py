"""Epilogue fusion: the elementwise ops after an array op run inside its launch.

After :func:`~.rewrite.fuse_activations` has folded the first activation into each Conv,
ConvTranspose, Gemm or MatMul (the *host*), :func:`fuse_epilogues` keeps absorbing what reads
the host's output, while the pattern holds (format and kernel semantics:
:mod:`npu_sim.epilogue`):

- a fusable activation with constant parameters (``Relu`` after a residual ``Add``; ``Clip``
  as Relu6): step ``act``;
- a gate: the output read by exactly an activation ``g = act(t)`` (Sigmoid, HardSigmoid) and a
  ``Mul(t, g)`` (either order) that is ``g``'s only reader: SiLU and torch's hard-swish, step
  ``Gate:act``;
- ``Add`` or ``Mul`` with another tensor that broadcasts to the output's shape (a residual, a
  per-channel scale), or a two-input ``Sum`` (ResNet-50's residual in onnx's model zoo form,
  an ``Add``): a binary step; the other tensor becomes an input of the launch, after
  the host's own inputs (omitted optional ones padded with ``""``).

Every step applies only where the intermediate tensor it removes is float32, has no other
reader and is not a graph output: a tensor read elsewhere must still be written, and half
precision would round once instead of after every op. The host moves to the position of the
last node it absorbs, so an operand produced after the host is ready before it runs (the
host's own inputs were ready before its old position). Fused float32 launches compute the
same float32 operations in the same order as the ops they replace, so their values are the
unfused ones; the cost model prices the steps on the vector unit beside the array, with the
operands read once and no round trip of the intermediates (``docs/cost_model.md``).

The squeeze-excite scale ``Mul(x, s)``, where ``s`` is computed from ``x`` itself (so no
producer epilogue can take it), goes the other way: into the group-1 Conv that is the product's
only reader, as its ``input_scale`` prologue (a per-channel ``s`` of shape ``(1, C, 1, ...)``;
the kernel scales the weights). That one is not bit-exact: ``(w s) x`` and ``w (x s)`` round
differently, by a few float32 ulps per product.
"""

from __future__ import annotations

from npu_sim.epilogue import BINARY, GATES, Step, decode, encode, operands
from npu_sim.kernels.gemm import broadcasts_to

from ..ops import Fusion, ops_where
from .ir import Node, SubGraph, Uses, activation_params

HOSTS = ops_where(fusion=Fusion.HOST)
ACTIVATIONS = ops_where(fusion=Fusion.ACTIVATION)
OWN_INPUTS = {"Conv": 3, "ConvTranspose": 3, "Gemm": 3, "MatMul": 2}
"""How many inputs each host takes itself; epilogue operands follow them."""
_ONNX = ("", "ai.onnx")


def fuse_epilogues(graph: SubGraph) -> int:
    """Fold the elementwise ops after each host into its launch; returns how many it folded."""
    fused = 0
    index = Uses(graph)
    for host in list(graph.nodes):
        if host.op in OWN_INPUTS and host.op in HOSTS and host.domain in _ONNX:
            fused += _input_scale(index, host)
            while _absorb(index, host):
                fused += 1
    return fused


def _input_scale(index: Uses, host: Node) -> int:
    """Fold ``Mul(t, s)`` with a per-channel ``s`` into the group-1 Conv reading it (1 if so)."""
    graph = index.graph
    x = host.inputs[0]
    mul = index.writer.get(x)
    if (host.op != "Conv" or int(host.attrs.get("group", 1)) != 1 or "input_scale" in host.attrs
            or mul is None or mul.op != "Mul" or mul.domain not in _ONNX
            or len(mul.inputs) != 2 or index.only(x) is not host
            or graph.types[x][0] != "float32"):
        return 0
    shape = graph.types[x][1]
    for t, s in (mul.inputs, mul.inputs[::-1]):
        (t_type, t_shape), (s_type, s_shape) = graph.types[t], graph.types[s]
        if t_type == s_type == "float32" and t_shape == shape and _per_channel(s_shape, shape):
            index.drop(mul)
            index.drop(host)
            host.inputs = [t, *host.inputs[1:]]
            for name in host.inputs:
                index.read(host, name)
            host.attrs["input_scale"] = _append_operand(index, host, s)
            graph.nodes.remove(mul)
            return 1
    return 0


def _per_channel(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` is one value per channel of an (N=1, C, ...) ``target``."""
    if len(target) < 3 or target[0] != 1 or len(shape) > len(target):
        return False
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    return padded[1] == target[1] and all(d == 1 for i, d in enumerate(padded) if i != 1)


def _absorb(index: Uses, host: Node) -> bool:
    """Absorb one step into ``host``; False when nothing after it fits."""
    graph = index.graph
    out = host.outputs[0]
    if len(host.outputs) != 1 or out in index.outputs or graph.types[out][0] != "float32":
        return False
    readers = index.of(out)
    if len(readers) == 2:
        return _gate(index, host, readers)
    if len(readers) != 1 or readers[0].domain not in _ONNX or readers[0].inputs.count(out) != 1:
        return False
    node = readers[0]
    if node.op in ACTIVATIONS and node.inputs[0] == out:
        params = activation_params(graph, node)
        if params is None:
            return False
        return _fold(index, host, [node], Step(node.op, params=params))
    if (node.op in BINARY or node.op == "Sum") and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == out else node.inputs[0]
        dtype, shape = graph.types[other]
        if dtype != "float32" or not broadcasts_to(shape, graph.types[out][1]):
            return False
        op = "Add" if node.op == "Sum" else node.op  # a two-input Sum is an Add
        return _fold(index, host, [node], Step(op, operand=_append_operand(index, host, other)))
    return False


def _gate(index: Uses, host: Node, readers: list[Node]) -> bool:
    graph = index.graph
    out = host.outputs[0]
    acts = [n for n in readers if n.op in GATES and n.domain in _ONNX and n.inputs[0] == out]
    if len(acts) != 1:
        return False
    (act,) = acts
    (mul,) = [n for n in readers if n is not act]
    gate = act.outputs[0]
    if (mul.op != "Mul" or mul.domain not in _ONNX or sorted(mul.inputs) != sorted([out, gate])
            or index.only(gate) is not mul):
        return False
    params = activation_params(graph, act)
    if params is None:
        return False
    return _fold(index, host, [act, mul], Step(act.op, gate=True, params=params))


def _append_operand(index: Uses, host: Node, name: str) -> int:
    """Give ``host`` the input ``name`` after its own inputs (omitted optional ones padded
    with ``""``) and the operands its epilogue and prologue already read; returns its index."""
    own = OWN_INPUTS[host.op]
    host.inputs = [*host.inputs, *[""] * (own - len(host.inputs)), name]
    index.read(host, name)
    return own + len(operands(host.op, host.attrs))


def _fold(index: Uses, host: Node, nodes: list[Node], step: Step) -> bool:
    """Append ``step`` to ``host``'s epilogue, take over the last node's output and place."""
    graph = index.graph
    steps = [*decode(host.op, host.attrs), step]
    for key in ("epilogue", "epilogue_args", "epilogue_params"):
        host.attrs.pop(key, None)
    host.attrs.update(encode(steps))
    last = nodes[-1]
    host.outputs = [last.outputs[0]]
    index.writer[host.outputs[0]] = host
    for node in nodes:
        index.drop(node)
    graph.nodes.remove(host)
    graph.nodes[graph.nodes.index(last)] = host
    for node in nodes[:-1]:
        graph.nodes.remove(node)
    return True
