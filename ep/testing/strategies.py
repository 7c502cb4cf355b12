"""Hypothesis strategies for execution-provider tests: models, their inputs, device configs.

:func:`models` draws valid ONNX models (they pass ``onnx.checker`` with strict shape inference and
run on onnxruntime's CPU provider): random DAGs whose nodes read earlier tensors chosen at random,
so fan-in and fan-out are random. Three kinds of shapes:

- ``"arbitrary"``: 1-3 inputs of rank 1-4; elementwise ops (with broadcasting initializers),
  transposes, reshapes, concat/split, reductions, softmax, matmul;
- in every kind, float32 models may quantize and dequantize a tensor (QuantizeLinear to int8 or
  uint8, DequantizeLinear back); the quantized tensor may be a graph output;
- ``"cnn"``: an ``(N, C, H, W)`` image through Conv, BatchNormalization, pools, residual adds and
  channel concats, optionally ending in GlobalAveragePool, Flatten and Gemm;
- ``"transformer"``: a ``(B, S, D)`` sequence through MatMul + bias projections, attention-like
  ``x @ x^T`` products, Softmax, LayerNormalization and elementwise ops.

By default the ops are those the NPU supports (``ep.npusim.capability.SUPPORT_TABLE``) plus
CPU-only ops (ones the NPU declines, e.g. ``Softplus``) that force partition boundaries; pass
``ops=`` / ``cpu_ops=`` to target another EP. Every choice is a hypothesis draw and the node count
shrinks towards one, so a failing model shrinks to a minimal one.

A model the installed onnxruntime crashes on is never drawn (:mod:`.reference_crashes`: 1.32.0
segfaults creating a session for some float16 Transpose-to-MatMul graphs; each such model is
tried in a child process), so a property test fails an example instead of dying.

:func:`feeds` draws inputs for any model (from its declared input types and static shapes), with
edge values (zeros, all negative, large magnitudes) and, on request, NaN and infinities.
:func:`device_configs` draws valid :class:`npu_sim.DeviceConfig` variants around a preset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import reject
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from npu_sim.config import DATAFLOWS, DeviceConfig, KiB, MiB

from . import reference_crashes

OPSET = 17
KINDS = ("arbitrary", "cnn", "transformer")
DTYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}
UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "LeakyRelu", "HardSigmoid", "Clip")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")
CPU_CANDIDATES = ("Softplus", "Softsign", "Elu", "Selu", "Floor", "Ceil", "Sign", "Round",
                  "ThresholdedRelu", "Atan", "Sinh", "Asinh")
"""Unary ops ONNX and onnxruntime's CPU provider run on float16/float32: CPU-only candidates."""
MAX_ELEMENTS = 512


def npu_ops() -> frozenset[str]:
    """The op types the NPU supports (its support table)."""
    from ep.npusim.capability import SUPPORT_TABLE

    return frozenset(SUPPORT_TABLE)


def cpu_only_ops(supported: frozenset[str] | None = None) -> tuple[str, ...]:
    """Unary candidates ``supported`` (default: the NPU's ops) does not contain."""
    supported = npu_ops() if supported is None else supported
    return tuple(op for op in CPU_CANDIDATES if op not in supported)


# -- the graph under construction ----------------------------------------------------------


@dataclass
class _Builder:
    """Tensors (name -> shape) in creation order, nodes and initializers of one model."""

    draw: st.DrawFn
    dtype: str
    unnamed_nodes: bool
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)
    other_types: dict[str, int] = field(default_factory=dict)
    """Tensors not of the model's dtype (quantized ones): never picked as operands."""

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def pick(self, accept: Callable[[tuple[int, ...]], bool] = lambda s: True) -> str | None:
        names = [n for n, s in self.shapes.items() if accept(s) and n not in self.other_types]
        if not names:
            return None
        return names[self.draw(st.integers(0, len(names) - 1))]

    def const(self, array: np.ndarray, stem: str = "w") -> str:
        name = f"{stem}{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape: Sequence[int], scale: float = 0.5) -> str:
        seed = self.draw(st.integers(0, 2**16))
        rng = np.random.default_rng(seed)
        return self.const((rng.standard_normal(shape) * scale).astype(self.np_dtype))

    def node(self, op: str, inputs: Sequence[str], shapes: Sequence[tuple[int, ...]],
             **attrs: object) -> list[str]:
        k = len(self.nodes)
        outs = [f"t{k}_{j}" if len(shapes) > 1 else f"t{k}" for j in range(len(shapes))]
        unnamed = self.unnamed_nodes and self.draw(st.booleans()) and self.draw(st.booleans())
        self.nodes.append(helper.make_node(op, list(inputs), outs,
                                           name="" if unnamed else f"n{k}", **attrs))
        self.consumed.update(i for i in inputs if i in self.shapes)
        self.shapes.update(zip(outs, (tuple(s) for s in shapes), strict=True))
        return outs


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


# -- one generator per op family: each adds nodes or returns False when it does not fit -------


def _unary(b: _Builder, op: str) -> bool:
    x = b.pick()
    attrs: dict[str, object] = {}
    inputs = [x]
    if op == "LeakyRelu":
        attrs["alpha"] = b.draw(st.sampled_from([0.01, 0.1, 0.5]))
    elif op == "HardSigmoid":
        attrs["alpha"] = b.draw(st.sampled_from([0.2, 0.5]))
    elif op == "Clip":
        lo = b.draw(st.sampled_from([-1.0, -0.5, 0.0]))
        inputs += [b.const(np.array(lo, b.np_dtype)), b.const(np.array(lo + 1.5, b.np_dtype))]
    elif op in ("Elu", "Selu", "ThresholdedRelu"):
        attrs["alpha"] = 1.0
    b.node(op, inputs, [b.shapes[x]], **attrs)
    return True


def _binary(b: _Builder, op: str) -> bool:
    x = b.pick()
    shape = b.shapes[x]
    source = b.draw(st.sampled_from(["tensor", "const", "broadcast"]))
    if source == "tensor":
        y = b.pick(lambda s: s == shape)
    elif source == "const":
        y = b.weight(shape)
    else:
        y = b.weight(shape[b.draw(st.integers(0, len(shape))):])
    b.node(op, [x, y] if b.draw(st.booleans()) else [y, x], [shape])
    return True


def _transpose(b: _Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return False
    shape = b.shapes[x]
    perm = b.draw(st.permutations(range(len(shape))))
    b.node("Transpose", [x], [tuple(shape[p] for p in perm)], perm=list(perm))
    return True


def _reshape(b: _Builder) -> bool:
    x = b.pick()
    shape = b.shapes[x]
    n = _size(shape)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    first = b.draw(st.sampled_from(divisors))
    target = [first, n // first] if b.draw(st.booleans()) else [n]
    written = list(target)
    if len(written) == 2 and b.draw(st.booleans()):
        written[1] = -1
    b.node("Reshape", [x, b.const(np.array(written, np.int64), "shape")], [tuple(target)])
    return True


def _concat_split(b: _Builder) -> bool:
    """Concat of two same-shape tensors along an axis, then Split back into halves."""
    x = b.pick()
    shape = b.shapes[x]
    if 2 * _size(shape) > MAX_ELEMENTS:
        return False
    y = b.pick(lambda s: s == shape)
    axis = b.draw(st.integers(0, len(shape) - 1))
    doubled = tuple(d * 2 if k == axis else d for k, d in enumerate(shape))
    (cat,) = b.node("Concat", [x, y], [doubled], axis=axis)
    b.node("Split", [cat], [shape, shape], axis=axis)
    return True


def _concat(b: _Builder) -> bool:
    x = b.pick()
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    same = [n for n, s in b.shapes.items() if len(s) == len(shape) and n not in b.other_types
            and all(a == c for k, (a, c) in enumerate(zip(s, shape, strict=True)) if k != axis)]
    y = same[b.draw(st.integers(0, len(same) - 1))]
    out = tuple(d + b.shapes[y][axis] if k == axis else d for k, d in enumerate(shape))
    if _size(out) > MAX_ELEMENTS:
        return False
    b.node("Concat", [x, y], [out], axis=axis)
    return True


def _split(b: _Builder) -> bool:
    x = b.pick(lambda s: any(d % 2 == 0 for d in s))
    if x is None:
        return False
    shape = b.shapes[x]
    axis = b.draw(st.sampled_from([k for k, d in enumerate(shape) if d % 2 == 0]))
    half = tuple(d // 2 if k == axis else d for k, d in enumerate(shape))
    b.node("Split", [x], [half, half], axis=axis)
    return True


def _reduce(b: _Builder, op: str) -> bool:
    x = b.pick()
    shape = b.shapes[x]
    axes = sorted(b.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    keep = b.draw(st.booleans()) or len(axes) == len(shape)  # no rank-0 tensors
    out = tuple(1 if k in axes else d for k, d in enumerate(shape) if keep or k not in axes)
    if op == "ReduceSum":  # axes is an input from opset 13
        b.node(op, [x, b.const(np.array(axes, np.int64), "axes")], [out], keepdims=int(keep))
    else:
        b.node(op, [x], [out], axes=axes, keepdims=int(keep))
    return True


def _softmax(b: _Builder) -> bool:
    x = b.pick()
    rank = len(b.shapes[x])
    b.node("Softmax", [x], [b.shapes[x]], axis=b.draw(st.integers(-rank, rank - 1)))
    return True


def _matmul(b: _Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return False
    shape = b.shapes[x]
    n = b.draw(st.integers(1, 8))
    w = b.weight((shape[-1], n), scale=1 / np.sqrt(shape[-1]))
    b.node("MatMul", [x, w], [shape[:-1] + (n,)])
    return True


def _attention(b: _Builder) -> bool:
    """``x @ transpose(y)`` of two activations: (.., S, D) x (.., D, S) -> (.., S, S)."""
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return False
    shape = b.shapes[x]
    y = b.pick(lambda s: s == shape)
    perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
    (yt,) = b.node("Transpose", [y], [tuple(shape[p] for p in perm)], perm=perm)
    b.node("MatMul", [x, yt], [shape[:-1] + (shape[-2],)])
    return True


def _layernorm(b: _Builder) -> bool:
    x = b.pick()
    d = b.shapes[x][-1]
    scale = b.const((1 + 0.1 * np.arange(d)).astype(b.np_dtype))
    bias = b.const((0.05 * np.arange(d)).astype(b.np_dtype))
    b.node("LayerNormalization", [x, scale, bias], [b.shapes[x]], axis=-1, epsilon=1e-5)
    return True


def _qdq(b: _Builder) -> bool:
    """QuantizeLinear to (u)int8 then DequantizeLinear back: a quantized tensor in between,
    which may become a graph output (compared within one quantization step)."""
    if b.dtype != "float32":  # opset 17 quantizes float32 only
        return False
    x = b.pick()
    signed = b.draw(st.booleans())
    scale = b.const(np.array(b.draw(st.sampled_from([0.01, 0.05, 0.2])), np.float32), "scale")
    zero = b.draw(st.sampled_from([0, 3]) if signed else st.sampled_from([0, 128]))
    zp = b.const(np.array(zero, np.int8 if signed else np.uint8), "zp")
    (q,) = b.node("QuantizeLinear", [x, scale, zp], [b.shapes[x]])
    b.other_types[q] = onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8
    b.node("DequantizeLinear", [q, scale, zp], [b.shapes[x]])
    return True


def _image(b: _Builder) -> str | None:
    return b.pick(lambda s: len(s) == 4)


def _conv(b: _Builder) -> bool:
    x = _image(b)
    if x is None:
        return False
    n, c, h, w = b.shapes[x]
    k = b.draw(st.sampled_from([1, 3]))
    pad = b.draw(st.sampled_from([0, k // 2]))
    stride = b.draw(st.sampled_from([1, 2]))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if oh < 1 or ow < 1:
        return False
    m = b.draw(st.integers(1, 6))
    inputs = [x, b.weight((m, c, k, k), scale=1 / np.sqrt(c * k * k))]
    if b.draw(st.booleans()):
        inputs.append(b.weight((m,), scale=0.1))
    b.node("Conv", inputs, [(n, m, oh, ow)], kernel_shape=[k, k], pads=[pad] * 4,
           strides=[stride] * 2)
    return True


def _batchnorm(b: _Builder) -> bool:
    x = _image(b)
    if x is None:
        return False
    c = b.shapes[x][1]
    ramp = np.linspace(0.5, 1.5, c).astype(b.np_dtype)
    params = [b.const(ramp), b.const(ramp - 1), b.const(ramp * 0.1), b.const(ramp)]
    b.node("BatchNormalization", [x, *params], [b.shapes[x]], epsilon=1e-5)
    return True


def _pool(b: _Builder, op: str) -> bool:
    x = _image(b)
    if x is None:
        return False
    n, c, h, w = b.shapes[x]
    if op == "GlobalAveragePool":
        b.node(op, [x], [(n, c, 1, 1)])
        return True
    k = b.draw(st.integers(1, min(3, h, w)))
    stride = b.draw(st.sampled_from([1, 2]))
    b.node(op, [x], [(n, c, (h - k) // stride + 1, (w - k) // stride + 1)],
           kernel_shape=[k, k], strides=[stride] * 2)
    return True


def _head(b: _Builder) -> bool:
    """Flatten then Gemm with a weight: a classifier head."""
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return False
    shape = b.shapes[x]
    flat = _size(shape[1:])
    (f,) = b.node("Flatten", [x], [(shape[0], flat)], axis=1)
    m = b.draw(st.integers(1, 8))
    trans = b.draw(st.booleans())
    w = b.weight((m, flat) if trans else (flat, m), scale=1 / np.sqrt(flat))
    b.node("Gemm", [f, w, b.weight((m,), 0.1)], [(shape[0], m)], transB=int(trans))
    return True


@dataclass(frozen=True)
class _Family:
    ops: tuple[str, ...]
    kinds: tuple[str, ...]
    make: Callable[[_Builder, str], bool]


_ALL_KINDS = KINDS
_FAMILIES: dict[str, _Family] = {
    **{op: _Family((op,), _ALL_KINDS, _unary) for op in UNARY},
    **{op: _Family((op,), _ALL_KINDS, _binary) for op in BINARY},
    "Transpose": _Family(("Transpose",), ("arbitrary", "transformer"), lambda b, _: _transpose(b)),
    "Reshape": _Family(("Reshape",), ("arbitrary",), lambda b, _: _reshape(b)),
    "ConcatSplit": _Family(("Concat", "Split"), _ALL_KINDS, lambda b, _: _concat_split(b)),
    "Concat": _Family(("Concat",), ("arbitrary", "cnn"), lambda b, _: _concat(b)),
    "Split": _Family(("Split",), ("arbitrary",), lambda b, _: _split(b)),
    **{op: _Family((op,), ("arbitrary",), _reduce)
       for op in ("ReduceMean", "ReduceMax", "ReduceSum")},
    "Softmax": _Family(("Softmax",), ("arbitrary", "transformer"), lambda b, _: _softmax(b)),
    "MatMul": _Family(("MatMul",), ("arbitrary", "transformer"), lambda b, _: _matmul(b)),
    "Attention": _Family(("Transpose", "MatMul"), ("transformer",),
                         lambda b, _: _attention(b)),
    "LayerNormalization": _Family(("LayerNormalization",), ("transformer",),
                                  lambda b, _: _layernorm(b)),
    "Conv": _Family(("Conv",), ("cnn",), lambda b, _: _conv(b)),
    "BatchNormalization": _Family(("BatchNormalization",), ("cnn",),
                                  lambda b, _: _batchnorm(b)),
    **{op: _Family((op,), ("cnn",), _pool)
       for op in ("MaxPool", "AveragePool", "GlobalAveragePool")},
    "Head": _Family(("Flatten", "Gemm"), ("cnn",), lambda b, _: _head(b)),
    "QDQ": _Family(("QuantizeLinear", "DequantizeLinear"), _ALL_KINDS, lambda b, _: _qdq(b)),
}


def _input_shapes(kind: str) -> st.SearchStrategy[tuple[int, ...]]:
    if kind == "cnn":
        return st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(3, 8),
                         st.integers(3, 8))
    if kind == "transformer":
        return st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(2, 8))
    return st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@st.composite
def models(
    draw: st.DrawFn,
    kind: str | None = None,
    *,
    ops: Sequence[str] | None = None,
    cpu_ops: Sequence[str] | None = None,
    dtypes: Sequence[str] = ("float32",),
    min_nodes: int = 1,
    max_nodes: int = 8,
    max_inputs: int = 3,
    input_shape: Sequence[int] | None = None,
    shuffle_nodes: bool = False,
    unnamed_nodes: bool = False,
) -> onnx.ModelProto:
    """A valid ONNX model (opset 17, IR 8) drawn as a random DAG (see the module doc).

    ``kind``: ``"arbitrary"``, ``"cnn"``, ``"transformer"`` or None (drawn). ``ops``: op types
    the graph may use besides ``cpu_ops`` (default: the NPU's supported ops); ``cpu_ops``: ops
    added to force partition boundaries (default: the candidates not in ``ops``; ``()`` for
    none).
    ``dtypes``: element types to draw from (``float32``, ``float16``). ``input_shape``: one
    fixed shape for every input instead of drawn ones. ``shuffle_nodes`` stores the nodes in a
    drawn order (still a DAG, no longer sorted); ``unnamed_nodes`` leaves some names empty.
    Graph outputs are every tensor nothing reads plus a drawn subset of the others.
    """
    kind = kind or draw(st.sampled_from(KINDS))
    if kind not in KINDS:
        raise ValueError(f"models(kind={kind!r}): expected one of {KINDS}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"models(dtypes={tuple(dtypes)!r}): expected a non-empty subset of "
                         f"{tuple(DTYPES)}")
    allowed = set(npu_ops() if ops is None else ops)
    extra = cpu_only_ops(frozenset(allowed)) if cpu_ops is None else tuple(cpu_ops)
    fitting = [(name, f) for name, f in _FAMILIES.items()
               if kind in f.kinds and set(f.ops) <= allowed]
    groups = {  # drawn in this order of weight; shrinking goes towards plain unary ops
        "unary": [(n, f) for n, f in fitting if n in UNARY],
        "binary": [(n, f) for n, f in fitting if n in BINARY],
        "structure": [(n, f) for n, f in fitting if n not in UNARY + BINARY],
        "cpu": [(op, _Family((op,), _ALL_KINDS, _unary)) for op in extra],
    }
    weighted = [g for g in ("unary", "binary", "structure", "structure", "structure", "cpu")
                if groups[g]]
    if not weighted:
        raise ValueError(f"models(kind={kind!r}, ops={sorted(allowed)}, cpu_ops={extra}): no "
                         f"op family fits; families: {sorted(_FAMILIES)}")
    dtype = draw(st.sampled_from(list(dtypes)))
    b = _Builder(draw, dtype, unnamed_nodes)
    n_inputs = draw(st.integers(1, max_inputs))
    shape_strategy = st.just(tuple(input_shape)) if input_shape else _input_shapes(kind)
    first = draw(shape_strategy)
    for k in range(n_inputs):
        same = k == 0 or input_shape or draw(st.booleans())
        b.shapes[f"x{k}"] = first if same else draw(shape_strategy)
    inputs = dict(b.shapes)
    steps = draw(st.integers(min_nodes, max_nodes))
    for _ in range(8 * steps):
        if len(b.nodes) >= steps:
            break
        group = groups[draw(st.sampled_from(weighted))]
        name, family = group[draw(st.integers(0, len(group) - 1))]
        family.make(b, name)
    if not b.nodes:
        reject()  # no drawn family fits these inputs (e.g. only Transpose, rank-1 inputs)
    produced = [t for t in b.shapes if t not in inputs]
    sinks = [t for t in produced if t not in b.consumed]
    others = [t for t in produced if t in b.consumed]
    extra_outputs = draw(st.lists(st.sampled_from(others), unique=True, max_size=2)) \
        if others else []
    elem = DTYPES[dtype]
    graph = helper.make_graph(
        b.nodes, f"{kind}_model",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(t, b.other_types.get(t, elem), b.shapes[t])
         for t in sinks + extra_outputs],
        initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=8, producer_name="ep.testing.strategies")
    onnx.checker.check_model(model, full_check=True)  # types and shapes agree, strictly
    if reference_crashes.suspect(model) and reference_crashes.crashes(model):
        reject()  # onnxruntime would crash creating the reference session
    if shuffle_nodes:  # a valid graph stored out of order (the checker wants sorted nodes)
        shuffled = draw(st.permutations(b.nodes))
        del model.graph.node[:]
        model.graph.node.extend(shuffled)
    return model


# -- inputs ---------------------------------------------------------------------------------

FEED_STYLES = ("normal", "zeros", "negative", "large", "mixed")
"""How :func:`feeds` fills an input; ``nonfinite`` adds ``"special"`` (NaN, +-Inf mixed in)."""


def _static_shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        raise ValueError(f"input {value.name!r} has a symbolic or unknown dimension; feeds() "
                         "needs static shapes (fix them in the model first)")
    return tuple(d.dim_value for d in dims)


def fill(style: str, shape: Sequence[int], dtype: np.dtype, seed: int,
         large: float = 1e3) -> np.ndarray:
    """An array in ``style`` (one of :data:`FEED_STYLES` or ``"special"``), reproducible."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    base = rng.standard_normal(shape)
    if style == "zeros":
        base = np.zeros(shape)
    elif style == "negative":
        base = -np.abs(base) - 0.01
    elif style == "large":
        base = base * large
    elif style == "mixed":
        pick = rng.integers(0, 4, size=shape)
        base = np.choose(pick, [base, np.zeros(shape), -np.abs(base), base * large])
    elif style == "special":
        pick = rng.integers(0, 6, size=shape)
        base = np.choose(pick, [base, base, np.full(shape, np.nan), np.full(shape, np.inf),
                                np.full(shape, -np.inf), np.zeros(shape)])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.nan_to_num(np.round(base * 4)), info.min, info.max).astype(dtype)
    if dtype == np.bool_:
        return base > 0
    return base.astype(dtype)


def random_inputs(model: onnx.ModelProto, seed: int = 0, style: str = "normal") -> dict[
        str, np.ndarray]:
    """Deterministic inputs for ``model`` (not a strategy): every input filled in ``style``."""
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for k, value in enumerate(i for i in model.graph.input if i.name not in inits):
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        out[value.name] = fill(style, _static_shape(value), dtype, seed + k)
    return out


@st.composite
def feeds(draw: st.DrawFn, model: onnx.ModelProto, *, edge_values: bool = True,
          nonfinite: bool = False, large: float = 1e3) -> dict[str, np.ndarray]:
    """Inputs for ``model``: per input a drawn style and seed (shrinking to standard normal).

    ``edge_values`` adds the styles zeros, all negative, large (``large`` times a normal
    sample) and a mix of them; ``nonfinite`` adds NaN, +Inf and -Inf values.
    """
    styles = list(FEED_STYLES if edge_values else ("normal",))
    if nonfinite:
        styles.append("special")
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        style = draw(st.sampled_from(styles), label=f"{value.name} style")
        seed = draw(st.integers(0, 2**32 - 1), label=f"{value.name} seed")
        out[value.name] = fill(style, _static_shape(value), dtype, seed, large)
    return out


# -- device configs -------------------------------------------------------------------------


@st.composite
def device_configs(draw: st.DrawFn, preset: str = "npu-m", *,
                   fields: Sequence[str] | None = None) -> DeviceConfig:
    """A valid :class:`DeviceConfig`: ``preset`` with some base parameters replaced.

    ``fields`` limits which parameters vary (default: all of :data:`CONFIG_VARIATIONS`). Values
    stay within a factor of a few of the preset's and within the config's validation ranges.
    """
    base = DeviceConfig.preset(preset)
    names = list(CONFIG_VARIATIONS if fields is None else fields)
    unknown = [n for n in names if n not in CONFIG_VARIATIONS]
    if unknown:
        raise ValueError(f"device_configs(fields={unknown}): expected some of "
                         f"{sorted(CONFIG_VARIATIONS)}")
    changes = {}
    for name in draw(st.lists(st.sampled_from(names), unique=True)):
        changes[name] = draw(CONFIG_VARIATIONS[name](getattr(base, name)))
    return base.replace(**changes)


def _scaled_int(lo: int, hi: int) -> Callable[[int], st.SearchStrategy[int]]:
    return lambda v: st.integers(max(lo, v // 4), min(hi, v * 4))


def _pow2(lo: int, hi: int) -> Callable[[int], st.SearchStrategy[int]]:
    def make(v: int) -> st.SearchStrategy[int]:
        exps = [e for e in range(31) if lo <= 2**e <= hi and v // 8 <= 2**e <= v * 8]
        return st.sampled_from([2**e for e in exps])
    return make


def _scaled_float(v: float) -> st.SearchStrategy[float]:
    return st.sampled_from([v / 4, v / 2, v, v * 2, v * 4])


CONFIG_VARIATIONS: dict[str, Callable[[object], st.SearchStrategy[object]]] = {
    "clock_ghz": lambda v: st.sampled_from([v / 2, v, min(10.0, v * 2)]),
    "cores": _scaled_int(1, 64),
    "array_rows": _pow2(1, 1024),
    "array_cols": _pow2(1, 1024),
    "dataflow": lambda v: st.sampled_from(DATAFLOWS),
    "vector_lanes": _pow2(1, 65536),
    "sram_bytes_per_core": lambda v: st.sampled_from(
        [s for s in (256 * KiB, 1 * MiB, 4 * MiB, 24 * MiB) if v // 16 <= s <= v * 16]),
    "hbm_gbps": _scaled_float,
    "hbm_latency_ns": _scaled_float,
    "host_link_gbps": _scaled_float,
    "dma_channels": _scaled_int(1, 64),
    "dma_chunk_bytes": lambda v: st.sampled_from([64 * KiB, 1 * MiB, 10 * MiB]),
    "hbm_alignment": lambda v: st.sampled_from([64, 256, 512, 4096]),
}
"""Base parameters :func:`device_configs` varies, each with the values it draws around ``v``."""
