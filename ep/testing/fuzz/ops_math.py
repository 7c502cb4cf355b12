"""The fuzzer's elementwise, reduction and normalization operators.

Each entry of :data:`OPS` proposes one node (sometimes with helper nodes before it) on a
:class:`~ep.testing.fuzz.build.Builder`: it picks inputs from the pool and draws plausible
attributes; ONNX shape inference then accepts or rejects the proposal. Ops with a restricted
domain (``Log``, ``Sqrt``...) read ``|x| + 0.5`` so the models stay finite on finite inputs;
integer division and modulo divide by constants that are never zero.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .build import FLOAT, NUMERIC, SIGNED, Builder, Invalid, Tensor

Op = Callable[[Builder], None]
OPS: dict[str, tuple[int, Op]] = {}
"""op type -> (first opset, proposer)."""


def op(name: str, since: int = 13) -> Callable[[Op], Op]:
    def register(fn: Op) -> Op:
        OPS[name] = (since, fn)
        return fn
    return register


def positive(b: Builder, t: Tensor) -> str:
    """``|t| + 0.5``: an input for ops defined on positive numbers."""
    (a,) = b.add("Abs", [t.name], pool=False)
    half = b.const(np.array(0.5, dtype=t.dtype))
    return b.add("Add", [a.name, half], pool=False)[0].name


def broadcast_partner(b: Builder, t: Tensor, dtypes=None, values=None) -> str:
    """A second operand broadcasting against ``t``: a pool tensor of the same shape and dtype,
    or a constant of a trailing sub-shape (dims may be 1), or a scalar; a constant made by
    ``values(shape)`` when given."""
    rng = b.rng
    same = [u for u in b.pool if u.shape == t.shape and u.dtype == t.dtype and u is not t]
    if same and values is None and rng.random() < 0.5:
        return same[int(rng.integers(len(same)))].name
    k = int(rng.integers(0, t.rank + 1))
    shape = [d if rng.random() < 0.7 else 1 for d in t.shape[t.rank - k:]]
    if values is not None:
        return b.const(values(shape), t.dtype)
    return b.const(random_values(rng, shape, t.dtype), t.dtype)


def random_values(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Constant data: normal floats, small integers, random booleans."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    low = 0 if kind == "u" else -5
    return rng.integers(low, 6, shape).astype(dtype)


def _unary(name: str, dtypes=FLOAT, since: int = 13, domain: bool = False, **attrs) -> None:
    def propose(b: Builder) -> None:
        t = b.pick(dtypes)
        drawn = {k: (v(b.rng) if callable(v) else v) for k, v in attrs.items()}
        b.add(name, [positive(b, t) if domain else t.name], **drawn)
    op(name, since)(propose)


for _name in ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Floor", "Ceil", "Round", "Sin", "Cos",
              "Erf", "Softplus", "Softsign", "Sign", "Atan", "HardSwish", "Exp", "IsNaN",
              "Identity", "Asinh", "Sinh"):
    _unary(_name, dtypes=("float32",) if _name in ("Asinh", "Sinh") else FLOAT)
for _name in ("Log", "Sqrt", "Reciprocal"):
    _unary(_name, domain=True)
op("Relu.int", 14)(lambda b: b.add("Relu", [b.pick(("int8", "int32")).name]))
_unary("Elu", alpha=lambda r: float(r.uniform(0.1, 2)))
_unary("Selu", dtypes=("float32",))
_unary("Celu", dtypes=("float32",), alpha=lambda r: float(r.uniform(0.2, 2)))
_unary("LeakyRelu", alpha=lambda r: float(r.uniform(0.01, 0.5)))
_unary("HardSigmoid", alpha=lambda r: float(r.uniform(0.1, 0.5)),
       beta=lambda r: float(r.uniform(0.2, 0.8)))
_unary("ThresholdedRelu", dtypes=("float32",), alpha=lambda r: float(r.uniform(0, 1.5)))
_unary("Mish", dtypes=("float32",), since=18)
_unary("Gelu", since=20, approximate=lambda r: str(r.choice(["none", "tanh"])))
_unary("IsInf", dtypes=("float32",))
_unary("Not", dtypes=("bool",))


@op("Neg.int")
def _neg_int(b: Builder) -> None:
    b.add(str(b.rng.choice(["Neg", "Abs", "Sign"])), [b.pick(SIGNED).name])


def _binary(name: str, dtypes=NUMERIC) -> None:
    def propose(b: Builder) -> None:
        t = b.pick(dtypes)
        other = broadcast_partner(b, t)
        args = [t.name, other] if b.rng.random() < 0.7 else [other, t.name]
        b.add(name, args)
    op(name)(propose)


for _name in ("Add", "Sub", "Mul"):
    _binary(_name, dtypes=NUMERIC if _name != "Mul" else FLOAT + ("int32", "int64"))
for _name in ("Min", "Max"):
    _binary(_name, dtypes=FLOAT + ("int32", "int64"))
for _name in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
    _binary(_name, dtypes=("float32", "int32", "int64") if _name != "Equal"
            else ("int32", "int64", "bool"))
for _name in ("And", "Or", "Xor"):
    _binary(_name, dtypes=("bool",))


@op("Div")
def _div(b: Builder) -> None:
    t = b.pick(NUMERIC)
    if np.dtype(t.dtype).kind == "f" and b.rng.random() < 0.5:
        b.add("Div", [t.name, positive(b, b.pick((t.dtype,), where=lambda u: u.shape == t.shape))])
        return
    divisor = broadcast_partner(b, t, values=lambda s: b.rng.integers(1, 5, s)
                                * b.rng.choice([-1, 1], s))
    b.add("Div", [t.name, divisor])


@op("Mod")
def _mod(b: Builder) -> None:
    t = b.pick(("float32", "int32", "int64"))
    fmod = int(np.dtype(t.dtype).kind == "f" or b.rng.random() < 0.3)
    divisor = broadcast_partner(b, t, values=lambda s: b.rng.integers(1, 5, s)
                                * b.rng.choice([-1, 1], s))
    b.add("Mod", [t.name, divisor], fmod=fmod)


@op("Pow")
def _pow(b: Builder) -> None:
    t = b.pick(FLOAT)
    exponent = b.const(np.array(b.rng.choice([2.0, 3.0, 0.5, -1.0, 1.5]), dtype=t.dtype))
    b.add("Pow", [positive(b, t), exponent])


@op("PRelu")
def _prelu(b: Builder) -> None:
    t = b.pick(FLOAT, min_rank=1)
    slope = broadcast_partner(b, t, values=lambda s: b.rng.uniform(0, 0.5, s))
    b.add("PRelu", [t.name, slope])


for _name in ("Sum", "Mean", "Max"):
    @op(_name + "3")
    def _variadic(b: Builder, name: str = _name) -> None:
        t = b.pick(FLOAT)
        b.add(name, [t.name, broadcast_partner(b, t), broadcast_partner(b, t)])


@op("Where")
def _where(b: Builder) -> None:
    t = b.pick(("float32", "int32", "int64", "uint8"))
    conds = [u for u in b.pool if u.dtype == "bool" and u.rank <= t.rank
             and all(c in (1, d) for c, d in zip(u.shape[::-1], t.shape[::-1], strict=False))]
    cond = conds[int(b.rng.integers(len(conds)))] if conds else None
    if cond is None or b.rng.random() < 0.3:
        cond_name = b.const(b.rng.random(t.shape[t.rank - 1:]) < 0.5)
    else:
        cond_name = cond.name
    b.add("Where", [cond_name, t.name, broadcast_partner(b, t)])


@op("Clip")
def _clip(b: Builder) -> None:
    t = b.pick(FLOAT + ("int32", "int64"))
    lo, hi = sorted(b.rng.integers(-3, 4, 2).tolist())
    ins = [t.name, b.const(np.array(lo, dtype=t.dtype))] if b.rng.random() < 0.8 else [t.name, ""]
    if b.rng.random() < 0.8:
        ins.append(b.const(np.array(hi, dtype=t.dtype)))
    b.add("Clip", ins)


@op("Cast")
def _cast(b: Builder) -> None:
    t = b.pick(NUMERIC + ("bool",))
    src = t.name
    to = str(b.rng.choice(["float32", "float16", "int32", "int64", "bool", "int8", "uint8"]))
    if np.dtype(t.dtype).kind == "f" and np.dtype(to).kind in "iu":
        # float -> integer is undefined outside the target's range: clip into it first
        lo, hi = (0, 200) if to == "uint8" else (-100, 100)
        src = b.add("Clip", [src, b.const(np.array(lo, t.dtype)), b.const(np.array(hi, t.dtype))],
                    pool=False)[0].name
    if to in ("int8", "uint8") and np.dtype(t.dtype).kind in "iu":
        raise Invalid("integer narrowing wraps differently per implementation")
    b.add("Cast", [src], to=int(_tensor_type(to)))


def _tensor_type(dtype: str) -> int:
    from onnx import helper
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _axes(b: Builder, t: Tensor) -> list[int]:
    k = int(b.rng.integers(1, t.rank + 1))
    axes = sorted(b.rng.choice(t.rank, k, replace=False).tolist())
    return [a - t.rank if b.rng.random() < 0.3 else a for a in axes]


def _reduce(name: str, dtypes=FLOAT, input_since: int = 18) -> None:
    def propose(b: Builder) -> None:
        t = b.pick(dtypes, min_rank=1)
        axes = _axes(b, t)
        keep = int(b.rng.random() < 0.5)
        if b.opset >= input_since:
            b.add(name, [t.name, b.const(np.array(axes, np.int64))], keepdims=keep)
        else:
            b.add(name, [t.name], axes=axes, keepdims=keep)
    op(name)(propose)


for _name in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceL1", "ReduceProd",
              "ReduceSumSquare", "ReduceLogSumExp"):
    _reduce(_name, dtypes=("float32",) if _name in ("ReduceProd", "ReduceLogSumExp")
            else FLOAT)
_reduce("ReduceSum", dtypes=FLOAT + ("int32", "int64"), input_since=13)


for _name in ("ArgMax", "ArgMin"):
    @op(_name)
    def _arg(b: Builder, name: str = _name) -> None:
        t = b.pick(("float32", "int32", "int64"), min_rank=1)
        b.add(name, [t.name], axis=int(b.rng.integers(-t.rank, t.rank)),
              keepdims=int(b.rng.random() < 0.5), select_last_index=int(b.rng.random() < 0.3))


for _name in ("Softmax", "LogSoftmax", "Hardmax"):
    @op(_name)
    def _softmax(b: Builder, name: str = _name) -> None:
        t = b.pick(("float32",) if name == "Hardmax" else FLOAT, min_rank=1)
        b.add(name, [t.name], axis=int(b.rng.integers(-t.rank, t.rank)))


@op("CumSum")
def _cumsum(b: Builder) -> None:
    t = b.pick(("float32", "int32", "int64"), min_rank=1)
    axis = b.const(np.array(b.rng.integers(-t.rank, t.rank), np.int64))
    b.add("CumSum", [t.name, axis], exclusive=int(b.rng.random() < 0.3),
          reverse=int(b.rng.random() < 0.3))


@op("TopK")
def _topk(b: Builder) -> None:
    t = b.pick(("float32",), min_rank=1)
    axis = int(b.rng.integers(-t.rank, t.rank))
    k = b.const(np.array([b.rng.integers(1, t.shape[axis] + 1)], np.int64))
    b.add("TopK", [t.name, k], n_out=2, axis=axis, largest=int(b.rng.random() < 0.7))


@op("LayerNormalization", since=17)
def _layernorm(b: Builder) -> None:
    t = b.pick(FLOAT, min_rank=1)
    axis = int(b.rng.integers(-t.rank, t.rank))
    inner = t.shape[axis:]
    scale = b.const(b.rng.uniform(0.5, 1.5, inner).astype(t.dtype))
    ins = [t.name, scale] + ([b.const(b.rng.standard_normal(inner).astype(t.dtype))]
                             if b.rng.random() < 0.7 else [])
    b.add("LayerNormalization", ins, axis=axis, epsilon=float(b.rng.choice([1e-5, 1e-3])))


def _norm_params(b: Builder, channels: int, dtype: str, n: int) -> list[str]:
    scale = b.const(b.rng.uniform(0.5, 1.5, channels).astype(dtype))
    bias = b.const(b.rng.standard_normal(channels).astype(dtype))
    extra = [b.const(b.rng.standard_normal(channels).astype(dtype)),
             b.const(b.rng.uniform(0.5, 2, channels).astype(dtype))]
    return [scale, bias] + extra[: n - 2]


@op("BatchNormalization")
def _batchnorm(b: Builder) -> None:
    t = b.pick(FLOAT, min_rank=2)
    b.add("BatchNormalization", [t.name, *_norm_params(b, t.shape[1], t.dtype, 4)],
          epsilon=float(b.rng.choice([1e-5, 1e-3])))


@op("InstanceNormalization")
def _instancenorm(b: Builder) -> None:
    t = b.pick(("float32",), min_rank=3)
    b.add("InstanceNormalization", [t.name, *_norm_params(b, t.shape[1], t.dtype, 2)])


@op("LRN")
def _lrn(b: Builder) -> None:
    t = b.pick(("float32",), min_rank=4, max_rank=4)
    b.add("LRN", [t.name], size=int(b.rng.choice([1, 3, 5])),
          alpha=float(b.rng.uniform(1e-4, 1e-2)), beta=float(b.rng.uniform(0.5, 1)),
          bias=float(b.rng.uniform(1, 2)))


@op("QuantizeLinear")
def _quantize(b: Builder) -> None:
    t = b.pick(("float32",))
    zero_type = str(b.rng.choice(["int8", "uint8"]))
    scale = b.const(np.array(b.rng.uniform(0.01, 0.1), np.float32))
    zero = b.const(np.array(b.rng.integers(-10, 10) + (128 if zero_type == "uint8" else 0),
                            zero_type))
    (q,) = b.add("QuantizeLinear", [t.name, scale, zero], pool=False)
    b.add("DequantizeLinear", [q.name, scale, zero])
