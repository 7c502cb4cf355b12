"""What the NPU can run: an explicit support table, checked node by node.

Each supported op has one :class:`OpSupport` row in :data:`SUPPORT_TABLE`: the opset range of
the model it accepts, the dtypes of its data tensors, the inputs that must be constant (the
compiler plans memory and tiles ahead of time, so shapes and axes cannot arrive at run time) and
an optional ``check`` for attribute constraints (``Resize`` only does nearest and linear). Every
input and output must have a static shape once dim overrides are applied, except *dead* trailing
outputs: optional outputs nobody reads (no consumer, not a graph output), like the mask of an
inference Dropout, which ONNX shape inference leaves untyped for Dropout-7. The compiler drops
them from the launch; a dead output followed by a used one still gets a tensor, so it needs a
static shape like any other.

:func:`check_node` answers "can the NPU run node i?" with ``None`` or a reason a user can act on
(``"Resize: mode=cubic not supported; supported: nearest, linear"``). :func:`get_npu_capability`
applies it to every unassigned node and groups the supported ones into connected groups; the
partitioner splits a group further if keeping it whole would create a cycle between partitions.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ep.framework.graph import GraphView
from ep.framework.provider import ComputeCapability

MAX_OPSET = 23
"""Newest default-domain opset the NPU's op implementations are validated against."""

FLOATS = ("float32", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
NUMERIC = FLOATS + INTS
BOOL = ("bool",)
ALL = NUMERIC + BOOL
"""Every dtype: what data movement (Reshape, Gather, Concat...) and Where/Cast accept."""
_INFERRED = "unk__"  # prefix of the dim_params ONNX shape inference invents for unknown dims

Check = Callable[[GraphView, int], "str | None"]


@dataclass(frozen=True)
class OpSupport:
    """One op the NPU runs.

    ``since_opset``..``until_opset`` bound the model's opset for ``domain``; ``dtypes`` are
    allowed for the inputs listed in ``typed_inputs`` and for output 0; ``const_inputs``
    (index, name) must be initializers or ``Constant`` outputs when present; ``check`` returns
    a reason for any further constraint it rejects.
    """

    since_opset: int
    until_opset: int = MAX_OPSET
    dtypes: tuple[str, ...] = FLOATS
    output_dtypes: tuple[str, ...] | None = None
    """Allowed dtypes of output 0 when they differ from the inputs' (a comparison's bool)."""
    check: Check | None = None
    typed_inputs: tuple[int, ...] = (0,)
    const_inputs: tuple[tuple[int, str], ...] = ()
    domain: str = ""


def _spatial(graph: GraphView, i: int) -> str | None:
    """Convolutions and pools: 1 to 3 spatial dimensions (input rank 3..5)."""
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if shape is not None and not 3 <= len(shape) <= 5:
        return f"input rank {len(shape)} not supported; expected 3 to 5 (N, C, 1-3 spatial dims)"
    return None


def _resize(graph: GraphView, i: int) -> str | None:
    mode = graph.attrs(i).get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"mode={mode} not supported; supported: nearest, linear"
    inputs = graph.nodes[i].input
    named = [(1, "scales")] if graph.opset() < 11 else [(2, "scales"), (3, "sizes")]
    return _require_constant(graph, inputs, named)


def _batchnorm(graph: GraphView, i: int) -> str | None:
    attrs = graph.attrs(i)
    if attrs.get("training_mode", 0):
        return "training_mode=1 not supported; only inference"
    if attrs.get("spatial", 1) != 1:
        return "spatial=0 not supported"
    # Before opset 14 the extra outputs select training mode (Y from batch statistics), so
    # they are declined even when nothing reads them.
    if len([o for o in graph.nodes[i].output if o]) > 1:
        return "running mean/var outputs not supported; only inference"
    return None


def is_dead(graph: GraphView, tensor: str) -> bool:
    """Whether nothing reads ``tensor``: omitted, or no consumer and not a graph output."""
    return not tensor or (not graph.consumers(tensor) and tensor not in graph.outputs)


def _live_outputs(graph: GraphView, i: int) -> list[str]:
    """Node ``i``'s outputs up to its last one something reads (the dead tail dropped)."""
    outputs = list(graph.nodes[i].output)
    while outputs and is_dead(graph, outputs[-1]):
        outputs.pop()
    return outputs


def _pool(graph: GraphView, i: int) -> str | None:
    """MaxPool / AveragePool: ceil_mode windows that would start in the end padding."""
    if why := _spatial(graph, i):
        return why
    attrs = graph.attrs(i)
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if why := _negative_same_pad(attrs, shape):
        return why
    if not attrs.get("ceil_mode", 0) or shape is None or attrs.get("auto_pad", "NOTSET") not in (
            "NOTSET", "VALID"):
        return None
    spatial = list(shape[2:])
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(spatial)))
    dilations = list(attrs.get("dilations", [1] * len(spatial)))
    pads = list(attrs.get("pads", [0] * 2 * len(spatial)))
    for k, size in enumerate(spatial):
        if not isinstance(size, int) or k >= len(kernel):
            continue
        extent = (kernel[k] - 1) * dilations[k] + 1
        span = size + pads[k] + pads[k + len(spatial)] - extent
        out = -(-span // strides[k]) + 1
        if span >= 0 and (out - 1) * strides[k] >= size + pads[k]:
            return f"ceil_mode=1 with a last window starting in the end padding: {_CEIL_DISAGREES}"
    return None


_CEIL_DISAGREES = "shape inference and onnxruntime disagree on the output shape"


_MISSHAPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _misshapen_pools(graph: GraphView) -> dict[int, str]:
    """Node -> the pool upstream of it (itself included) whose inferred output shape
    onnxruntime does not produce, named; computed once per graph."""
    if graph in _MISSHAPEN:
        return _MISSHAPEN[graph]
    found: dict[int, str] = {}
    for i in range(len(graph.nodes)):  # a GraphView's nodes are in topological order
        node = graph.nodes[i]
        if node.op_type in ("MaxPool", "AveragePool") and (why := _pool(graph, i)) and (
                _CEIL_DISAGREES in why):
            found[i] = f"{node.op_type} {graph.names[i]!r}, for which {why}"
            continue
        for tensor in node.input:
            p = graph.producer(tensor) if tensor else None
            if p is not None and p in found:
                found[i] = found[p]
                break
    _MISSHAPEN[graph] = found
    return found


def _unreliable_input(graph: GraphView, i: int) -> str | None:
    """An input downstream of a pool whose inferred shape onnxruntime does not produce: the
    node would be compiled for a shape it never receives."""
    misshapen = _misshapen_pools(graph)
    for tensor in graph.nodes[i].input:
        p = graph.producer(tensor) if tensor else None
        if p is not None and p in misshapen:
            return f"the shape of input '{tensor}' depends on {misshapen[p]}"
    return None


def _negative_same_pad(attrs: dict, shape) -> str | None:
    """auto_pad SAME_* with a stride wider than the window can leave nothing to pad: the
    padding onnxruntime computes is negative and it refuses the node."""
    if attrs.get("auto_pad", "NOTSET") not in ("SAME_UPPER", "SAME_LOWER") or shape is None:
        return None
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(kernel)))
    for k, size in enumerate(shape[2:]):
        if isinstance(size, int) and k < len(kernel):
            needed = (-(-size // strides[k]) - 1) * strides[k] + kernel[k] - size
            if needed < 0:
                return (f"auto_pad={attrs['auto_pad']} with kernel {kernel[k]}, stride "
                        f"{strides[k]} on size {size} needs padding {needed}: onnxruntime "
                        "refuses negative padding")
    return None


_EMPTY_OK = frozenset({"Shape", "Constant", "ConstantOfShape"})
"""Ops the NPU runs on empty tensors; others leave them to the CPU, whose handling (an empty
result, or a refusal: ArgMax over nothing, LayerNormalization of nothing, Reshape inferring -1
from no elements) is onnxruntime's own."""


def _empty_tensor(graph: GraphView, i: int) -> str | None:
    roles = [("input", t) for t in graph.nodes[i].input] + [
        ("output", t) for t in _live_outputs(graph, i)]
    for role, tensor in roles:
        _, shape = graph.tensor_type(tensor) if tensor else (None, None)
        if shape is not None and 0 in shape:
            return f"empty {role} '{tensor}' (shape {tuple(shape)}) not supported"
    return None


def _maxpool(graph: GraphView, i: int) -> str | None:
    if len(_live_outputs(graph, i)) > 1:
        return "the Indices output is not supported (only when nothing reads it)"
    return _pool(graph, i)


def _nonempty(graph: GraphView, i: int) -> str | None:
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if shape is not None and 0 in shape:
        return f"empty input (shape {tuple(shape)}) not supported"
    return None


def _resize_checked(graph: GraphView, i: int) -> str | None:
    return _nonempty(graph, i) or _resize(graph, i)


def _clip(graph: GraphView, i: int) -> str | None:
    for tensor in graph.nodes[i].input[1:3]:
        bound = graph.constant(tensor) if tensor else None
        if bound is not None and np.isnan(bound.astype(np.float64)).any():
            return "a NaN min/max bound is not supported (onnxruntime's result is kept)"
    return None


def _lrn(graph: GraphView, i: int) -> str | None:
    size = graph.attrs(i).get("size")
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if not isinstance(size, int) or size < 1 or size % 2 == 0:
        return f"size={size} not supported; size must be a positive odd integer"
    if shape is not None and len(shape) != 4:
        return f"input rank {len(shape)} not supported; LRN takes (N, C, H, W)"
    channels = shape[1] if shape is not None else None
    if isinstance(channels, int) and size > 2 * channels + 1:
        return (f"size={size} wider than the {channels} channels (at most "
                f"{2 * channels + 1} is meaningful)")
    return None


def _reshape(graph: GraphView, i: int) -> str | None:
    node = graph.nodes[i]
    if not graph.attrs(i).get("allowzero", 0) or len(node.input) < 2:
        return None
    target = graph.constant(node.input[1])
    _, shape = graph.tensor_type(node.input[0])
    if target is not None and 0 in target.tolist() and shape is not None and 0 not in shape:
        return ("allowzero=1 with a 0 in shape for a non-empty input: no element count "
                "matches")
    return None


def _dropout(graph: GraphView, i: int) -> str | None:
    inputs = graph.nodes[i].input
    if len(inputs) > 2 and inputs[2]:
        mode = graph.constant(inputs[2])
        if mode is None or bool(mode):
            return "training_mode must be a constant false"
    return None


def _layernorm(graph: GraphView, i: int) -> str | None:
    if len(_live_outputs(graph, i)) > 1:
        return "Mean/InvStdDev outputs not supported (only when nothing reads them)"
    return None


def _same(op_types: Iterable[str], support: OpSupport) -> dict[str, OpSupport]:
    return {op: support for op in op_types}


def _const(*names: str, start: int = 1) -> tuple[tuple[int, str], ...]:
    return tuple((start + k, name) for k, name in enumerate(names))


_COMPARISONS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual")


_UNARY_FLOAT = ("Sigmoid", "HardSigmoid", "Tanh", "Sqrt", "Exp", "Log", "Reciprocal", "LeakyRelu")
_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2")
_SHAPE_OPS = ("Flatten", "Transpose", "Concat", "Identity")

SUPPORT_TABLE: dict[str, OpSupport] = {
    "Conv": OpSupport(1, check=_spatial),
    "ConvTranspose": OpSupport(1, check=_spatial),
    "MatMul": OpSupport(1),
    "Gemm": OpSupport(7),
    "BatchNormalization": OpSupport(7, check=_batchnorm),
    "Relu": OpSupport(6, dtypes=FLOATS + ("int8", "int32", "int64")),
    **_same(_UNARY_FLOAT, OpSupport(6)),
    "PRelu": OpSupport(7),
    "Clip": OpSupport(6, const_inputs=_const("min", "max"), check=_clip),
    "HardSwish": OpSupport(14),
    "Erf": OpSupport(9),
    "Gelu": OpSupport(20),
    "Softmax": OpSupport(1),
    "LogSoftmax": OpSupport(1),
    "LayerNormalization": OpSupport(17, check=_layernorm),
    **_same(("Add", "Sub", "Mul", "Div"), OpSupport(7, dtypes=FLOATS + ("int32", "int64"))),
    "Pow": OpSupport(7),
    **_same(("Neg", "Abs"), OpSupport(6, dtypes=FLOATS + ("int8", "int32", "int64"))),
    **_same(("Min", "Max"), OpSupport(8, dtypes=FLOATS + ("int32", "int64"))),
    **_same(("Sum", "Mean"), OpSupport(8)),
    "MaxPool": OpSupport(1, dtypes=FLOATS + ("int8", "uint8"), check=_maxpool),
    "AveragePool": OpSupport(1, check=_pool),
    "GlobalAveragePool": OpSupport(1, check=_spatial),
    "GlobalMaxPool": OpSupport(1, check=_spatial),
    "LRN": OpSupport(1, check=_lrn),
    **_same(_REDUCE, OpSupport(1, const_inputs=_const("axes"))),
    "Reshape": OpSupport(5, dtypes=ALL, const_inputs=_const("shape"), check=_reshape),
    **_same(_SHAPE_OPS, OpSupport(1, dtypes=ALL)),
    "Split": OpSupport(2, dtypes=ALL, const_inputs=_const("split")),
    "Slice": OpSupport(10, dtypes=ALL, const_inputs=_const("starts", "ends", "axes", "steps")),
    **_same(("Squeeze", "Unsqueeze"), OpSupport(1, dtypes=ALL, const_inputs=_const("axes"))),
    "Gather": OpSupport(1, dtypes=ALL),
    "Expand": OpSupport(8, dtypes=ALL, const_inputs=_const("shape")),
    "Where": OpSupport(9, dtypes=ALL, typed_inputs=(1, 2)),
    "Cast": OpSupport(6, dtypes=ALL),
    "Dropout": OpSupport(7, check=_dropout),
    "Resize": OpSupport(10, check=_resize_checked),
    "Pad": OpSupport(11, dtypes=ALL, const_inputs=((1, "pads"), (3, "axes"))),
    "QuantizeLinear": OpSupport(10, dtypes=FLOATS + ("int8", "uint8")),
    "DequantizeLinear": OpSupport(10, dtypes=FLOATS + ("int8", "uint8", "int32")),
    "QLinearConv": OpSupport(10, dtypes=("int8", "uint8"), typed_inputs=(0, 3), check=_spatial),
    "QLinearMatMul": OpSupport(10, dtypes=("int8", "uint8"), typed_inputs=(0, 3)),
    "MatMulInteger": OpSupport(10, dtypes=("int8", "uint8", "int32"), typed_inputs=(0, 1)),
    "ConvInteger": OpSupport(
        10, dtypes=("int8", "uint8", "int32"), typed_inputs=(0, 1), check=_spatial
    ),
    **_same(_COMPARISONS, OpSupport(7, dtypes=NUMERIC, output_dtypes=BOOL,
                                    typed_inputs=(0, 1))),
    "Equal": OpSupport(11, dtypes=ALL, output_dtypes=BOOL, typed_inputs=(0, 1)),
    **_same(("And", "Or", "Xor"), OpSupport(7, dtypes=BOOL, typed_inputs=(0, 1))),
    "Not": OpSupport(1, dtypes=BOOL),
    **_same(("IsNaN", "IsInf"), OpSupport(10, output_dtypes=BOOL)),
    **_same(("Sin", "Cos"), OpSupport(7)),
    **_same(("Floor", "Ceil"), OpSupport(6)),
    "Round": OpSupport(11),
    **_same(("ArgMax", "ArgMin"), OpSupport(1, dtypes=NUMERIC, output_dtypes=("int64",))),
    "Shape": OpSupport(1, dtypes=ALL, output_dtypes=("int64",)),
    "Constant": OpSupport(1, dtypes=ALL, typed_inputs=()),
    "ConstantOfShape": OpSupport(
        9, dtypes=ALL, typed_inputs=(), const_inputs=_const("input", start=0)
    ),
}
"""op_type -> what the NPU supports of it (ops of the default ONNX domain)."""


def _require_constant(
    graph: GraphView, inputs: Iterable[str], named: Iterable[tuple[int, str]]
) -> str | None:
    inputs = list(inputs)
    for index, name in named:
        if index < len(inputs) and inputs[index] and graph.constant(inputs[index]) is None:
            return f"input '{name}' must be constant (an initializer or Constant output)"
    return None


def _static(graph: GraphView, tensor: str, role: str) -> str | None:
    _, shape = graph.tensor_type(tensor)
    if shape is None:
        return (f"unknown shape of {role} '{tensor}': ONNX shape inference could not determine "
                f"it; the NPU needs static shapes")
    for k, dim in enumerate(shape):
        if isinstance(dim, str) and not dim.startswith(_INFERRED):
            return f"dynamic dimension '{dim}' on {role} '{tensor}'; set a dim override"
        if not isinstance(dim, int):
            return f"unknown dimension {k} on {role} '{tensor}'"
        if dim < 0:  # ONNX shape inference of a window wider than its padded input
            return f"negative dimension {k} ({dim}) inferred for {role} '{tensor}'"
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
    typed = [(node.input[k], "input", support.dtypes) for k in support.typed_inputs
             if k < len(node.input)]
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
    if why := _require_constant(graph, node.input, support.const_inputs):
        return why
    for tensor in node.input:
        if tensor and (why := _static(graph, tensor, "input")):
            return why
    if why := _unreliable_input(graph, i):
        return why
    for tensor in _live_outputs(graph, i):  # a dead tail is not materialized: any shape will do
        role = "unused output (a later output is used)" if is_dead(graph, tensor) else "output"
        if tensor and (why := _static(graph, tensor, role)):
            return why
    if support.check and (why := support.check(graph, i)):
        return why
    return None if node.op_type in _EMPTY_OK else _empty_tensor(graph, i)


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
