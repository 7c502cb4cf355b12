"""Graph rewrites: small functions that each make a :class:`~.ir.SubGraph` cheaper to run.

Each rewrite edits the graph in place, keeps it numerically equivalent (checked against
onnxruntime on the original subgraph by ``tests/ep/test_rewrite.py``) and returns how many
times it fired. :func:`optimize` runs them in an order where each one sees the result of the
previous:

0. :func:`transposed_weights` -- MatMul(A, Transpose(W)) with W a 2-D weight reads W itself
   (``transB``), so a tied embedding is never stored twice (W and its folded transpose).
1. :func:`fold_constants` -- a node whose inputs are all constant is evaluated once with the
   device's kernels and its outputs become weights; ``Constant``, ``ConstantOfShape`` and
   ``Shape`` of a static tensor are evaluated directly. This first pass keeps
   DequantizeLinear of constant weights for step 2 and a second pass after it folds the rest.
2. :func:`fold_qdq` -- DequantizeLinear -> Conv/MatMul -> QuantizeLinear with a constant
   quantized weight becomes QLinearConv/QLinearMatMul (int8/uint8; per-tensor scales, and
   per-output-channel weight scales for Conv).
3. :func:`fold_batchnorm` -- Conv -> BatchNormalization folds into the Conv's weight and bias.
4. :func:`matmul_add_to_gemm` -- MatMul(2-D A, 2-D B) + constant bias becomes Gemm.
5. :func:`fuse_activations` -- Conv/ConvTranspose/Gemm/MatMul -> activation becomes one node
   with ``activation`` / ``activation_params`` attributes.
6. :func:`~.epilogue.fuse_epilogues` -- the elementwise ops after such a node (gates, residual
   Add, scales) join its launch as an epilogue.

Dead nodes and constants are dropped at the end. A rewrite fires only where the intermediate
tensor it removes has no other reader and is not a graph output.
"""

from __future__ import annotations

import numpy as np

from npu_sim import dtypes
from npu_sim.errors import NpuSimError
from npu_sim.kernels.gemm import broadcasts_to
from npu_sim.kernels.limits import check_elements

from ..ops import Fusion, ops_where
from .epilogue import fuse_epilogues
from .ir import Node, SubGraph, Uses, activation_params, contiguous, run_node

FUSABLE_ACTIVATIONS = ops_where(fusion=Fusion.ACTIVATION)
ACTIVATION_HOSTS = ops_where(fusion=Fusion.HOST)
FLOAT_TYPES = ("float32", "float16", "bfloat16")

# The first constant-folding pass keeps DequantizeLinear of constant weights, so that fold_qdq
# still sees the QDQ pattern; the second pass folds whichever of them fold_qdq did not take.
_KEEP_FOR_QDQ = frozenset({"DequantizeLinear"})


def optimize(graph: SubGraph) -> dict[str, int]:
    """Run every rewrite in order; returns how often each fired (for the compile report)."""
    counts = {
        "transposed_weights": transposed_weights(graph),
        "fold_constants": fold_constants(graph, keep=_KEEP_FOR_QDQ),
        "fold_qdq": fold_qdq(graph),
    }
    graph.remove_dead()
    counts["fold_constants"] += fold_constants(graph)
    counts["fold_batchnorm"] = fold_batchnorm(graph)
    counts["matmul_add_to_gemm"] = matmul_add_to_gemm(graph)
    counts["fuse_activations"] = fuse_activations(graph)
    counts["fuse_epilogues"] = fuse_epilogues(graph)
    graph.remove_dead()
    return counts


# -- constant folding -------------------------------------------------------------------------


def fold_constants(graph: SubGraph, keep: frozenset[str] = frozenset()) -> int:
    """Evaluate nodes whose inputs are all constant; their outputs become constants.

    Nodes whose op type is in ``keep`` are left in place even when they could be folded.
    """
    folded = 0
    kept: list[Node] = []
    for node in graph.nodes:
        widens = node.op == "Cast" and _widens_a_weight(graph, node)
        values = None if node.op in keep or widens else _constant_outputs(graph, node)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values, strict=False):
            if name:
                value = contiguous(value)
                graph.consts[name] = value
                graph.types[name] = (dtypes.from_numpy(value.dtype), tuple(value.shape))
        folded += 1
    graph.nodes = kept
    return folded


WEIGHT_BYTES = 1024
"""A constant of this many bytes or more is a weight (as the framework's optimizer counts)."""


def _widens_a_weight(graph: SubGraph, node: Node) -> bool:
    """A Cast of a constant weight to a wider type (float16 weights read as float32): folded,
    the weight would be stored at twice its size; it stays a kernel that widens on device."""
    value = graph.consts.get(node.inputs[0]) if node.inputs else None
    if value is None or value.nbytes < WEIGHT_BYTES:
        return False
    try:
        wider = dtypes.itemsize(dtypes.from_onnx(int(node.attrs.get("to", 0))))
    except (NpuSimError, TypeError, ValueError):
        return False
    return wider > value.dtype.itemsize


def _constant_outputs(graph: SubGraph, node: Node) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op == "Constant":
        (key,) = [k for k in node.attrs if not k.startswith("_")]
        return [np.asarray(node.attrs[key], dtype=_constant_dtype(key, node.attrs[key]))]
    if node.op == "Shape" and node.inputs[0] in graph.types:
        shape = graph.types[node.inputs[0]][1]
        start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
        return [np.array(shape[start:end], dtype=np.int64)]
    if not node.inputs or not all(i == "" or i in graph.consts for i in node.inputs):
        return None
    if node.op == "ConstantOfShape":  # a constant generator, like Constant: no kernel needed
        fill = node.attrs.get("value", np.zeros(1, np.float32))
        shape = check_elements("ConstantOfShape", "output",
                               graph.consts[node.inputs[0]].reshape(-1).tolist())
        return [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]
    return run_node(node, [graph.consts[i] if i else None for i in node.inputs])


def _constant_dtype(key: str, value: object) -> np.dtype | None:
    if key in ("value_float", "value_floats"):
        return np.dtype(np.float32)
    if key in ("value_int", "value_ints"):
        return np.dtype(np.int64)
    return None


# -- MatMul of a transposed weight ------------------------------------------------------------


def transposed_weights(graph: SubGraph) -> int:
    """MatMul(A, Transpose(W, perm=[1, 0])) with W a 2-D constant becomes MatMul(A, W) with
    ``transB=1``: the array reads B column by column instead, at the same cost, and W is stored
    once even when it is also read as is (a Gather of a tied embedding). Runs before constant
    folding, which would otherwise store the transpose as a second weight."""
    rewritten = 0
    for mm in graph.nodes:
        if mm.op != "MatMul" or mm.domain not in ("", "ai.onnx") or len(mm.inputs) != 2:
            continue
        tr = graph.producer(mm.inputs[1])
        if tr is None or tr.op != "Transpose" or tr.domain not in ("", "ai.onnx"):
            continue
        w = graph.const(tr.inputs[0])
        if w is None or w.ndim != 2 or tuple(tr.attrs.get("perm", (1, 0))) != (1, 0):
            continue
        mm.inputs = [mm.inputs[0], tr.inputs[0]]
        mm.attrs = {**mm.attrs, "transB": 1}
        rewritten += 1
    return rewritten


# -- BatchNormalization into Conv -------------------------------------------------------------


def fold_batchnorm(graph: SubGraph) -> int:
    """Fold an inference BatchNormalization into the Conv producing its input.

    ``y = s * (conv(x, W) + b - mean) + beta`` with ``s = scale / sqrt(var + eps)`` equals
    ``conv(x, s * W) + (s * (b - mean) + beta)``: the Conv keeps its shape, with new constant
    weight and bias (computed in float64, rounded once to the weight dtype).
    """
    folded = 0
    for bn in list(graph.nodes):
        if bn.op != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1:
            continue
        conv = graph.producer(bn.inputs[0])
        if conv is None or conv.op != "Conv" or graph.only_consumer(conv.outputs[0]) is not bn:
            continue
        w = graph.const(conv.inputs[1])
        b = graph.const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        params = [graph.const(name) for name in bn.inputs[1:5]]
        if w is None or any(p is None for p in params) or w.dtype.name not in FLOAT_TYPES:
            continue
        if len(conv.inputs) > 2 and conv.inputs[2] and b is None:
            continue
        scale, beta, mean, var = (p.astype(np.float64) for p in params)
        s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        bias = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        # w * s promotes to float64 element by element: no float64 copy of the weight first.
        new_w = (w * s.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
        new_b = (s * (bias - mean) + beta).astype(w.dtype)
        conv.inputs = [conv.inputs[0], graph.add_const(f"{conv.name}_bn_w", new_w),
                       graph.add_const(f"{conv.name}_bn_b", new_b)]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        folded += 1
    return folded


# -- MatMul + Add -> Gemm ---------------------------------------------------------------------


def matmul_add_to_gemm(graph: SubGraph) -> int:
    """MatMul(A, B) + C with A and B 2-D and C a constant broadcastable to (M, N) -> Gemm."""
    rewritten = 0
    for mm in list(graph.nodes):
        if mm.op != "MatMul" or mm.domain not in ("", "ai.onnx"):
            continue
        (a_type, a_shape), (_, b_shape) = graph.types[mm.inputs[0]], graph.types[mm.inputs[1]]
        if len(a_shape) != 2 or len(b_shape) != 2 or a_type not in FLOAT_TYPES:
            continue
        add = graph.only_consumer(mm.outputs[0])
        if add is None or add.op != "Add":
            continue
        other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        bias = graph.const(other)
        out_shape = (a_shape[0], b_shape[1])
        if bias is None or bias.dtype.name != a_type or not broadcasts_to(bias.shape, out_shape):
            continue
        mm.op = "Gemm"
        mm.inputs = [mm.inputs[0], mm.inputs[1], other]
        mm.attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
        mm.outputs = [add.outputs[0]]
        graph.nodes.remove(add)
        rewritten += 1
    return rewritten


# -- activation fusion ------------------------------------------------------------------------


def fuse_activations(graph: SubGraph) -> int:
    """Fold an activation into the Conv/ConvTranspose/Gemm/MatMul that produces its input."""
    fused = 0
    uses = Uses(graph)
    for act in list(graph.nodes):
        if act.op not in FUSABLE_ACTIVATIONS or act.domain not in ("", "ai.onnx"):
            continue
        host = uses.writer.get(act.inputs[0])
        if (host is None or host.op not in ACTIVATION_HOSTS or "activation" in host.attrs
                or host.domain not in ("", "ai.onnx")
                or uses.only(act.inputs[0]) is not act
                or graph.types[act.inputs[0]][0] not in FLOAT_TYPES):
            continue
        params = activation_params(graph, act)
        if params is None:
            continue
        host.attrs["activation"] = act.op
        host.attrs["activation_params"] = params
        host.outputs = [act.outputs[0]]
        uses.writer[host.outputs[0]] = host
        uses.drop(act)
        graph.nodes.remove(act)
        fused += 1
    return fused


# -- QDQ -> QLinear ---------------------------------------------------------------------------


def fold_qdq(graph: SubGraph) -> int:
    """DequantizeLinear(x), DequantizeLinear(W const) -> Conv/MatMul -> QuantizeLinear -> QLinear.

    Scales and zero points must be constant; the activation's are per tensor, the weight's per
    tensor or (Conv only) per output channel. A Conv bias must be constant: it is requantized
    to int32 with scale ``x_scale * w_scale`` (which ONNX QDQ exporters already use, so a bias
    given as DequantizeLinear of int32 with that scale is taken as is).
    """
    if not any(n.op == "QuantizeLinear" for n in graph.nodes):
        return 0  # every fold ends in one: no need to look for the rest of the pattern
    folded = 0
    for node in list(graph.nodes):
        if node.op not in ("Conv", "MatMul") or node.domain not in ("", "ai.onnx"):
            continue
        q = graph.only_consumer(node.outputs[0])
        x_dq, w_dq = graph.producer(node.inputs[0]), graph.producer(node.inputs[1])
        if (q is None or q.op != "QuantizeLinear" or x_dq is None or w_dq is None
                or x_dq.op != "DequantizeLinear" or w_dq.op != "DequantizeLinear"):
            continue
        x = _quant_params(graph, x_dq, per_channel=False)
        w = _quant_params(graph, w_dq, per_channel=node.op == "Conv")
        y = _quant_params(graph, q, per_channel=False)
        w_q = graph.const(w_dq.inputs[0])
        if x is None or w is None or y is None or w_q is None:
            continue
        if node.op == "MatMul" and len(graph.types[node.inputs[1]][1]) != 2:
            continue
        inputs = [x_dq.inputs[0], *x, w_dq.inputs[0], *w, *y]
        if node.op == "Conv":
            bias = _quantized_bias(graph, node, x, w)
            if bias is False:
                continue
            if bias is not None:
                inputs.append(bias)
        node.op = "QLinearConv" if node.op == "Conv" else "QLinearMatMul"
        node.inputs = inputs
        node.outputs = [q.outputs[0]]
        graph.nodes.remove(q)
        folded += 1
    return folded


def _quant_params(graph: SubGraph, node: Node, *, per_channel: bool) -> list[str] | None:
    """``[scale, zero_point]`` tensor names of a (De)QuantizeLinear with constant parameters.

    A missing zero point becomes a constant 0 of the quantized type. Returns None when the
    parameters are not constant, not int8/uint8, or per-channel where that is not allowed.
    """
    scale = graph.const(node.inputs[1])
    zp_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zp = graph.const(zp_name)
    if scale is None or (zp_name and zp is None):
        return None
    qtype = graph.types[node.inputs[0] if node.op == "DequantizeLinear" else node.outputs[0]][0]
    if qtype not in ("int8", "uint8") or node.attrs.get("block_size", 0):
        return None
    if scale.size != 1:
        if not per_channel or scale.ndim != 1 or node.attrs.get("axis", 1) != 0:
            return None
    if zp is None:
        zp_name = graph.add_const(f"{node.name}_zero_point", np.zeros((), dtypes.to_numpy(qtype)))
    elif zp.size != 1 and np.any(zp != 0):
        return None
    return [node.inputs[1], zp_name]


def _quantized_bias(graph: SubGraph, conv: Node, x: list[str], w: list[str]) -> str | None | bool:
    """The int32 bias name for QLinearConv, None if the Conv has no bias, False if it cannot."""
    if len(conv.inputs) < 3 or not conv.inputs[2]:
        return None
    bias_scale = (graph.consts[x[0]].astype(np.float64).reshape(())
                  * graph.consts[w[0]].astype(np.float64).reshape(-1))
    producer = graph.producer(conv.inputs[2])
    if producer is not None and producer.op == "DequantizeLinear":
        q_bias = graph.const(producer.inputs[0])
        scale = graph.const(producer.inputs[1])
        if (q_bias is not None and q_bias.dtype == np.int32 and scale is not None
                and np.allclose(scale.astype(np.float64).reshape(-1), bias_scale, rtol=1e-6)):
            return producer.inputs[0]
        return False
    bias = graph.const(conv.inputs[2])
    if bias is None:
        return False
    q_bias = np.round(bias.astype(np.float64) / bias_scale)
    q_bias = np.clip(q_bias, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    return graph.add_const(f"{conv.name}_bias_q", q_bias)
