"""The fuzzer's layout, indexing, shape and network operators (convolutions, pools, GEMMs).

Same contract as :mod:`ep.testing.fuzz.ops_math`: each entry proposes a node on a builder and
ONNX shape inference accepts or rejects it. Shape-like inputs (``shape``, ``axes``, ``pads``,
``starts``...) are constants, as exporters emit them after constant folding; some are
``Constant`` nodes, which the partitioner may place in another partition than their consumer.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .build import FLOAT, NUMERIC, Builder, Invalid
from .ops_math import op, random_values

ALL = NUMERIC + ("bool",)


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@op("Reshape")
def _reshape(b: Builder) -> None:
    t = b.pick(ALL)
    dims, n = [], t.size
    while n > 1 and len(dims) < 4:
        f = [d for d in range(2, n + 1) if n % d == 0]
        d = int(b.rng.choice(f))
        dims.append(d)
        n //= d
    b.rng.shuffle(dims)
    if dims and b.rng.random() < 0.3:
        dims[int(b.rng.integers(len(dims)))] = -1
    if b.rng.random() < 0.2:
        dims.insert(int(b.rng.integers(len(dims) + 1)), 1)
    b.add("Reshape", [t.name, b.const(_i64(dims))])


@op("Transpose")
def _transpose(b: Builder) -> None:
    t = b.pick(ALL, min_rank=2)
    b.add("Transpose", [t.name], perm=b.rng.permutation(t.rank).tolist())


@op("Flatten")
def _flatten(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    b.add("Flatten", [t.name], axis=int(b.rng.integers(-t.rank, t.rank + 1)))


@op("Squeeze")
def _squeeze(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1, where=lambda u: 1 in u.shape)
    ones = [k for k, d in enumerate(t.shape) if d == 1]
    axes = sorted(b.rng.choice(ones, int(b.rng.integers(1, len(ones) + 1)), replace=False))
    b.add("Squeeze", [t.name, b.const(_i64(axes))])


@op("Unsqueeze")
def _unsqueeze(b: Builder) -> None:
    t = b.pick(ALL, max_rank=4)
    k = int(b.rng.integers(1, 3))
    axes = sorted(b.rng.choice(t.rank + k, k, replace=False).tolist())
    b.add("Unsqueeze", [t.name, b.const(_i64(axes))])


@op("Concat")
def _concat(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    axis = int(b.rng.integers(-t.rank, t.rank))
    parts = [t.name]
    for _ in range(int(b.rng.integers(1, 3))):
        shape = list(t.shape)
        shape[axis] = int(b.rng.integers(1, 4))
        same = [u for u in b.pool if u.dtype == t.dtype and u.rank == t.rank and all(
            u.shape[k] == t.shape[k] for k in range(t.rank) if k != axis % t.rank)]
        if b.rng.random() < 0.5:
            parts.append(same[int(b.rng.integers(len(same)))].name)
        else:
            parts.append(b.const(random_values(b.rng, shape, t.dtype), t.dtype))
    b.add("Concat", parts, axis=axis)


@op("Split")
def _split(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1, where=lambda u: max(u.shape) >= 2)
    axis = int(b.rng.choice([k for k, d in enumerate(t.shape) if d >= 2]))
    n = int(b.rng.integers(2, min(t.shape[axis], 3) + 1))
    cuts = sorted(b.rng.choice(np.arange(1, t.shape[axis]), n - 1, replace=False).tolist())
    sizes = np.diff([0, *cuts, t.shape[axis]]).tolist()
    b.add("Split", [t.name, b.const(_i64(sizes))], n_out=n, axis=axis)


@op("Slice")
def _slice(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    axes = sorted(b.rng.choice(t.rank, int(b.rng.integers(1, t.rank + 1)), replace=False))
    starts, ends, steps = [], [], []
    for a in axes:
        d = t.shape[a]
        lo, hi = sorted(b.rng.integers(0, d + 1, 2).tolist())
        hi = max(hi, lo + 1)
        step = int(b.rng.choice([1, 1, 2, -1]))
        if step < 0:
            lo, hi = hi - 1, lo - 1 if lo > 0 else -d - 1
        starts.append(lo if b.rng.random() < 0.7 else lo - d)
        ends.append(hi if b.rng.random() < 0.8 else (2**62 if step > 0 else -(2**62)))
        steps.append(step)
    ins = [t.name, b.const(_i64(starts)), b.const(_i64(ends)), b.const(_i64(axes))]
    if b.rng.random() < 0.7:
        ins.append(b.const(_i64(steps)))
    elif any(s != 1 for s in steps):
        raise Invalid("steps omitted but not all 1")
    b.add("Slice", ins)


@op("Gather")
def _gather(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    axis = int(b.rng.integers(-t.rank, t.rank))
    d = t.shape[axis]
    shape = [] if b.rng.random() < 0.3 else b.rng.integers(1, 4, int(b.rng.integers(1, 3)))
    b.add("Gather", [t.name, b.const(_i64(b.rng.integers(-d, d, shape)))], axis=axis)


@op("GatherElements")
def _gather_elements(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    axis = int(b.rng.integers(0, t.rank))
    d = t.shape[axis]
    b.add("GatherElements", [t.name, b.const(_i64(b.rng.integers(-d, d, t.shape)))], axis=axis)


@op("Expand")
def _expand(b: Builder) -> None:
    t = b.pick(ALL, max_rank=4)
    shape = [int(b.rng.integers(1, 4)) if d == 1 else d for d in t.shape]
    shape = [int(b.rng.integers(1, 3)) for _ in range(int(b.rng.integers(0, 2)))] + shape
    b.add("Expand", [t.name, b.const(_i64(shape))])


@op("Tile")
def _tile(b: Builder) -> None:
    t = b.pick(ALL, min_rank=1)
    b.add("Tile", [t.name, b.const(_i64(b.rng.integers(1, 3, t.rank)))])


@op("Pad")
def _pad(b: Builder) -> None:
    t = b.pick(NUMERIC, min_rank=1)
    mode = str(b.rng.choice(["constant", "constant", "reflect", "edge"]))
    limit = [d - 1 if mode == "reflect" else 2 for d in t.shape] * 2
    pads = [int(b.rng.integers(0, m + 1)) for m in limit]
    ins = [t.name, b.const(_i64(pads))]
    if mode == "constant" and b.rng.random() < 0.5:
        ins.append(b.const(np.array(b.rng.integers(-2, 3), t.dtype)))
    b.add("Pad", ins, mode=mode)


@op("Shape", since=15)
def _shape(b: Builder) -> None:
    t = b.pick(ALL)
    attrs = {"start": int(b.rng.integers(-t.rank, 1))} if t.rank and b.rng.random() < 0.3 else {}
    (s,) = b.add("Shape", [t.name], pool=False, **attrs)
    follow = b.rng.choice(["pool", "cos", "reshape"])
    if follow == "pool" or not s.size:
        b.pool.append(s)
    elif follow == "cos":  # the shape as data: a float vector
        (f,) = b.add("Cast", [s.name], to=1, pool=False)
        b.add("Cos", [f.name])
    else:  # a shape subgraph: reshape another tensor to this one's shape
        u = b.pick(ALL, where=lambda u: u.size == t.size and u.rank >= 1)
        b.add("Reshape", [u.name, s.name])


@op("Size")
def _size(b: Builder) -> None:
    b.add("Size", [b.pick(ALL).name])


@op("ConstantOfShape")
def _constant_of_shape(b: Builder) -> None:
    shape = b.rng.integers(1, 4, int(b.rng.integers(1, 4)))
    dtype = str(b.rng.choice(["float32", "int64", "bool"]))
    value = random_values(b.rng, [1], dtype)
    (c,) = b.add("ConstantOfShape", [b.const(_i64(shape))], pool=False,
                 value=numpy_helper.from_array(value))
    t = b.pick((dtype,), max_rank=3, where=lambda u: _broadcasts(u.shape, c.shape))
    b.add("Add" if dtype != "bool" else "Or", [t.name, c.name])


def _broadcasts(a, c) -> bool:
    try:
        np.broadcast_shapes(a, c)
    except ValueError:
        return False
    return True


@op("Trilu")
def _trilu(b: Builder) -> None:
    t = b.pick(("float32", "int64"), min_rank=2)
    b.add("Trilu", [t.name, b.const(np.array(b.rng.integers(-2, 3), np.int64))],
          upper=int(b.rng.random() < 0.5))


for _name in ("DepthToSpace", "SpaceToDepth"):
    @op(_name)
    def _d2s(b: Builder, name: str = _name) -> None:
        if name == "DepthToSpace":
            t = b.pick(("float32",), 4, 4, where=lambda u: u.shape[1] % 4 == 0)
            b.add(name, [t.name], blocksize=2, mode=str(b.rng.choice(["DCR", "CRD"])))
        else:
            t = b.pick(("float32",), 4, 4, where=lambda u: u.shape[2] % 2 == u.shape[3] % 2 == 0)
            b.add(name, [t.name], blocksize=2)


@op("MatMul")
def _matmul(b: Builder) -> None:
    t = b.pick(FLOAT, min_rank=1)
    k = t.shape[-1]
    if b.rng.random() < 0.4:
        others = [u for u in b.pool if u.dtype == t.dtype and u.rank >= 2 and u.shape[-2] == k
                  and _broadcasts(u.shape[:-2], t.shape[:-2])]
        if others:
            b.add("MatMul", [t.name, others[int(b.rng.integers(len(others)))].name])
            return
    shape = [k, int(b.rng.integers(1, 9))] if b.rng.random() < 0.9 else [k]
    b.add("MatMul", [t.name, b.const(b.rng.standard_normal(shape).astype(t.dtype) * 0.5)])


@op("Gemm")
def _gemm(b: Builder) -> None:
    t = b.pick(FLOAT, 2, 2)
    trans_a, trans_b = (int(b.rng.random() < 0.3) for _ in range(2))
    m, k = t.shape[::-1] if trans_a else t.shape
    n = int(b.rng.integers(1, 9))
    w = b.rng.standard_normal([n, k] if trans_b else [k, n]).astype(t.dtype)
    ins = [t.name, b.const(w)]
    if b.rng.random() < 0.7:
        c_shape = [[n], [m, n], [1]][int(b.rng.integers(3))]
        ins.append(b.const(b.rng.standard_normal(c_shape).astype(t.dtype)))
    b.add("Gemm", ins, transA=trans_a, transB=trans_b, alpha=float(b.rng.choice([1.0, 0.5])),
          beta=float(b.rng.choice([1.0, 2.0])))


def _window(b: Builder, spatial: int) -> dict:
    kernel = b.rng.integers(1, 4, spatial).tolist()
    attrs = {"kernel_shape": kernel}
    if b.rng.random() < 0.5:
        attrs["strides"] = b.rng.integers(1, 3, spatial).tolist()
    if b.rng.random() < 0.5:
        attrs["pads"] = [int(b.rng.integers(0, k)) for k in kernel * 2]
    elif b.rng.random() < 0.3:
        attrs["auto_pad"] = str(b.rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    return attrs


def _fits(shape, attrs: dict) -> None:
    """Raise :class:`Invalid` if a window is wider than the padded input (no output)."""
    spatial = shape[2:]
    pads = attrs.get("pads", [0] * 2 * len(spatial))
    dilations = attrs.get("dilations", [1] * len(spatial))
    for k, d in enumerate(spatial):
        extent = (attrs["kernel_shape"][k] - 1) * dilations[k] + 1
        if extent > d + pads[k] + pads[k + len(spatial)]:
            raise Invalid("window wider than the padded input")


@op("Conv")
def _conv(b: Builder) -> None:
    t = b.pick(FLOAT, 3, 4)
    attrs = _window(b, t.rank - 2)
    channels = t.shape[1]
    group = int(b.rng.choice([g for g in (1, 2, channels) if channels % g == 0]))
    out = group * int(b.rng.integers(1, 4))
    if b.rng.random() < 0.3 and "auto_pad" not in attrs:
        attrs["dilations"] = b.rng.integers(1, 3, t.rank - 2).tolist()
    _fits(t.shape, attrs)
    w = b.rng.standard_normal([out, channels // group, *attrs["kernel_shape"]]) * 0.3
    ins = [t.name, b.const(w.astype(t.dtype))]
    if b.rng.random() < 0.6:
        ins.append(b.const(b.rng.standard_normal(out).astype(t.dtype)))
    b.add("Conv", ins, group=group, **attrs)


@op("ConvTranspose")
def _conv_transpose(b: Builder) -> None:
    t = b.pick(("float32",), 4, 4)
    attrs = _window(b, 2)
    attrs.pop("auto_pad", None)
    out = int(b.rng.integers(1, 4))
    w = b.rng.standard_normal([t.shape[1], out, *attrs["kernel_shape"]]) * 0.3
    b.add("ConvTranspose", [t.name, b.const(w.astype(np.float32))], **attrs)


for _name in ("MaxPool", "AveragePool"):
    @op(_name)
    def _pool(b: Builder, name: str = _name) -> None:
        t = b.pick(FLOAT, 3, 4)
        attrs = _window(b, t.rank - 2)
        if name == "AveragePool" and b.rng.random() < 0.5:
            attrs["count_include_pad"] = 1
        if b.rng.random() < 0.2:
            attrs["ceil_mode"] = 1
        _fits(t.shape, attrs)
        b.add(name, [t.name], **attrs)


for _name in ("GlobalAveragePool", "GlobalMaxPool"):
    op(_name)(lambda b, name=_name: b.add(name, [b.pick(FLOAT, 3, 4).name]))


@op("Resize")
def _resize(b: Builder) -> None:
    t = b.pick(("float32",), 3, 4)
    mode = str(b.rng.choice(["nearest", "linear"]))
    scales = [1.0, 1.0] + b.rng.choice([1.0, 2.0, 0.5], t.rank - 2).tolist()
    b.add("Resize", [t.name, "", b.const(np.array(scales, np.float32))], mode=mode)


@op("Dropout")
def _dropout(b: Builder) -> None:
    b.add("Dropout", [b.pick(FLOAT).name])
