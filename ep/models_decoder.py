"""A decoder-only transformer built in code as two graphs over the same weights: prefill and
decode, with the KV cache as graph inputs and outputs.

The model is GPT-like: token embedding, learned positions, ``layers`` blocks of pre-norm
attention and MLP (Gelu), a final layer norm and the output projection tied to the token
embedding (``MatMul(h, Transpose(wte))``). Both graphs read the same initializers, so compiled
together with ``ep.share_ep_contexts`` their weights are stored once, and loaded on one device
they are resident once.

* ``prefill``: ``input_ids`` (1, S) -> ``logits`` (1, S, vocab) and, per layer,
  ``present_key_i`` / ``present_value_i`` (1, heads, cache, head_dim): the prompt's keys and
  values in slots ``0..S-1``, zeros after.
* ``decode``: ``input_ids`` (1, 1), ``position`` (1,) int64, ``attention_mask`` (1, 1, 1, cache)
  float (0 where a slot is valid, a large negative number elsewhere) and ``past_key_i`` /
  ``past_value_i`` -> ``logits`` (1, 1, vocab) and the cache with the new token's key and value
  written at slot ``position`` (``Where`` of a one-hot slot mask, no scatter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
NEG = -1e9


@dataclass(frozen=True)
class DecoderSpec:
    """Sizes of the decoder (small defaults for tests; scale ``dim``/``layers`` for benches)."""

    vocab: int = 256
    dim: int = 64
    heads: int = 2
    layers: int = 2
    prompt: int = 128
    cache: int = 144
    seed: int = 0
    weight_dtype: str = "float32"
    """``"float16"`` stores the weights in half precision, each cast to float32 where the graph
    reads it (halves the weight bytes of a large bench model; computation stays float32)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def weights(spec: DecoderSpec) -> dict[str, np.ndarray]:
    """Random weights (seeded), shared by both graphs, as stored (``spec.weight_dtype``; each
    made in float32 and converted alone, so a gigabyte model never exists in float32 whole)."""
    if spec.weight_dtype not in ("float32", "float16"):
        raise ValueError(f"weight_dtype={spec.weight_dtype!r}; expected 'float32' or 'float16'")
    rng = np.random.default_rng(spec.seed)
    d, stored = spec.dim, np.dtype(spec.weight_dtype)

    def w(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(stored)

    out = {"wte": w(spec.vocab, d, scale=0.2), "wpe": w(spec.cache, d, scale=0.5),
           "lnf_g": 1 + w(d), "lnf_b": w(d)}
    for i in range(spec.layers):
        out.update({f"l{i}_ln1_g": 1 + w(d), f"l{i}_ln1_b": w(d), f"l{i}_qkv": w(d, 3 * d),
                    f"l{i}_qkv_b": w(3 * d), f"l{i}_proj": w(d, d), f"l{i}_proj_b": w(d),
                    f"l{i}_ln2_g": 1 + w(d), f"l{i}_ln2_b": w(d), f"l{i}_fc": w(d, 4 * d),
                    f"l{i}_fc_b": w(4 * d), f"l{i}_out": w(4 * d, d), f"l{i}_out_b": w(d)})
    return out


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.consts: dict[str, np.ndarray] = {}
        self._k = 0

    def op(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        self._k += 1
        outs = [f"{op.lower()}_{self._k}_{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"{op}_{self._k}", **attrs))
        return outs

    def const(self, name: str, value: np.ndarray) -> str:
        self.consts[name] = np.asarray(value)
        return name


def _block(g: _Graph, spec: DecoderSpec, i: int, x: str, seq: int, keys: str, values: str,
           mask: str) -> str:
    """One pre-norm block; ``keys``/``values`` are the full cache (1, H, L, Dh) to attend."""
    d, h, dh = spec.dim, spec.heads, spec.head_dim
    (n1,) = g.op("LayerNormalization", [x, f"l{i}_ln1_g", f"l{i}_ln1_b"], axis=-1)
    (q,) = g.op("MatMul", [n1, f"l{i}_qkv"])
    (q,) = g.op("Add", [q, f"l{i}_qkv_b"])
    (q,) = g.op("Slice", [q, g.const("s0", np.array([0], np.int64)),
                          g.const("sd", np.array([d], np.int64)),
                          g.const("ax2", np.array([2], np.int64))])
    (q,) = g.op("Reshape", [q, g.const(f"qshape{seq}", np.array([1, seq, h, dh], np.int64))])
    (q,) = g.op("Transpose", [q], perm=[0, 2, 1, 3])
    (kt,) = g.op("Transpose", [keys], perm=[0, 1, 3, 2])
    (s,) = g.op("MatMul", [q, kt])
    (s,) = g.op("Mul", [s, g.const("scale", np.array(1 / np.sqrt(dh), np.float32))])
    (s,) = g.op("Add", [s, mask])
    (p,) = g.op("Softmax", [s], axis=-1)
    (a,) = g.op("MatMul", [p, values])
    (a,) = g.op("Transpose", [a], perm=[0, 2, 1, 3])
    (a,) = g.op("Reshape", [a, g.const(f"ashape{seq}", np.array([1, seq, d], np.int64))])
    (a,) = g.op("MatMul", [a, f"l{i}_proj"])
    (a,) = g.op("Add", [a, f"l{i}_proj_b"])
    (x,) = g.op("Add", [x, a])
    (n2,) = g.op("LayerNormalization", [x, f"l{i}_ln2_g", f"l{i}_ln2_b"], axis=-1)
    (m,) = g.op("MatMul", [n2, f"l{i}_fc"])
    (m,) = g.op("Add", [m, f"l{i}_fc_b"])
    (m,) = g.op("Gelu", [m])
    (m,) = g.op("MatMul", [m, f"l{i}_out"])
    (m,) = g.op("Add", [m, f"l{i}_out_b"])
    (x,) = g.op("Add", [x, m])
    return x


def _kv(g: _Graph, spec: DecoderSpec, i: int, n1: str, seq: int) -> tuple[str, str]:
    """The new keys and values (1, H, seq, Dh) of block ``i`` from its normed input."""
    d, h, dh = spec.dim, spec.heads, spec.head_dim
    (kv,) = g.op("MatMul", [n1, f"l{i}_qkv"])
    (kv,) = g.op("Add", [kv, f"l{i}_qkv_b"])
    out = []
    for start, name in ((d, "k"), (2 * d, "v")):
        (t,) = g.op("Slice", [kv, g.const(f"s{name}", np.array([start], np.int64)),
                              g.const(f"e{name}", np.array([start + d], np.int64)),
                              g.const("ax2", np.array([2], np.int64))])
        (t,) = g.op("Reshape", [t, g.const(f"qshape{seq}", np.array([1, seq, h, dh],
                                                                       np.int64))])
        (t,) = g.op("Transpose", [t], perm=[0, 2, 1, 3])
        out.append(t)
    return out[0], out[1]


def _head(g: _Graph, x: str) -> str:
    (x,) = g.op("LayerNormalization", [x, "lnf_g", "lnf_b"], axis=-1)
    (wt,) = g.op("Transpose", ["wte"], perm=[1, 0])
    (logits,) = g.op("MatMul", [x, wt])
    return logits


def _model(g: _Graph, spec: DecoderSpec, name: str, inputs: list, outputs: list,
           rename: dict[str, str]) -> onnx.ModelProto:
    for node in g.nodes:
        node.output[:] = [rename.get(o, o) for o in node.output]
        node.input[:] = [rename.get(i, i) for i in node.input]
    stored = weights(spec)
    casts = []
    if spec.weight_dtype == "float16":
        casts = [helper.make_node("Cast", [f"{k}_fp16"], [k], name=f"Cast_{k}", to=F)
                 for k in stored]
        stored = {f"{k}_fp16": v for k, v in stored.items()}
    inits = [numpy_helper.from_array(v, k) for k, v in {**stored, **g.consts}.items()]
    graph = helper.make_graph(casts + g.nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def prefill(spec: DecoderSpec = DecoderSpec()) -> onnx.ModelProto:
    """The prefill graph (see the module docstring)."""
    g, s, lc = _Graph(), spec.prompt, spec.cache
    (x,) = g.op("Gather", ["wte", "input_ids"])
    pos = g.const("positions", np.arange(s, dtype=np.int64).reshape(1, s))
    (p,) = g.op("Gather", ["wpe", pos])
    (x,) = g.op("Add", [x, p])
    causal = np.triu(np.full((s, s), NEG, np.float32), 1).reshape(1, 1, s, s)
    mask = g.const("causal", causal)
    rename: dict[str, str] = {}
    outputs = []
    for i in range(spec.layers):
        (n1,) = g.op("LayerNormalization", [x, f"l{i}_ln1_g", f"l{i}_ln1_b"], axis=-1)
        k, v = _kv(g, spec, i, n1, s)
        x = _block(g, spec, i, x, s, k, v, mask)
        for t, which in ((k, "key"), (v, "value")):
            pads = g.const("cache_pads", np.array([0, 0, 0, 0, 0, 0, lc - s, 0], np.int64))
            (padded,) = g.op("Pad", [t, pads])
            rename[padded] = f"present_{which}_{i}"
            outputs.append(helper.make_tensor_value_info(
                f"present_{which}_{i}", F, [1, spec.heads, lc, spec.head_dim]))
    rename[_head(g, x)] = "logits"
    return _model(g, spec, "prefill", [helper.make_tensor_value_info("input_ids", I64, [1, s])],
                  [helper.make_tensor_value_info("logits", F, [1, s, spec.vocab]), *outputs],
                  rename)


def decode(spec: DecoderSpec = DecoderSpec()) -> onnx.ModelProto:
    """The decode graph (see the module docstring)."""
    g, lc = _Graph(), spec.cache
    (x,) = g.op("Gather", ["wte", "input_ids"])
    (p,) = g.op("Gather", ["wpe", "position"])
    (p,) = g.op("Unsqueeze", [p, g.const("ax0", np.array([0], np.int64))])
    (x,) = g.op("Add", [x, p])
    slots = g.const("slots", np.arange(lc, dtype=np.int64))
    (here,) = g.op("Equal", [slots, "position"])
    (here,) = g.op("Reshape", [here, g.const("slot_shape", np.array([1, 1, lc, 1], np.int64))])
    rename: dict[str, str] = {}
    inputs = [helper.make_tensor_value_info("input_ids", I64, [1, 1]),
              helper.make_tensor_value_info("position", I64, [1]),
              helper.make_tensor_value_info("attention_mask", F, [1, 1, 1, lc])]
    outputs = []
    cache_shape = [1, spec.heads, lc, spec.head_dim]
    for i in range(spec.layers):
        (n1,) = g.op("LayerNormalization", [x, f"l{i}_ln1_g", f"l{i}_ln1_b"], axis=-1)
        k, v = _kv(g, spec, i, n1, 1)
        present = []
        for t, which in ((k, "key"), (v, "value")):
            (updated,) = g.op("Where", [here, t, f"past_{which}_{i}"])
            present.append(updated)
            rename[updated] = f"present_{which}_{i}"
            inputs.append(helper.make_tensor_value_info(f"past_{which}_{i}", F, cache_shape))
            outputs.append(helper.make_tensor_value_info(f"present_{which}_{i}", F,
                                                         cache_shape))
        x = _block(g, spec, i, x, 1, present[0], present[1], "attention_mask")
    rename[_head(g, x)] = "logits"
    # Renamed outputs are read under their new names by the blocks that follow.
    return _model(g, spec, "decode", inputs,
                  [helper.make_tensor_value_info("logits", F, [1, 1, spec.vocab]), *outputs],
                  rename)
