"""Compiling to an EPContext model hashes each weight once: the binary's content addressing and
the graph digest recorded in the EPContext node's ``notes`` share one SHA-256 per weight."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import onnx
import pytest

import ep
from ep.framework import epcontext as E
from ep.npusim import binary_writer
from ep.npusim.binary import ContextBinary
from ep.npusim.epcontext import recorded_digest
from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

NPU = "NpuSimExecutionProvider"


class CountingSha256:
    """``hashlib`` as ``binary_writer`` sees it, counting the bytes of every SHA-256 begun."""

    def __init__(self) -> None:
        self.sizes: Counter[int] = Counter()

    def sha256(self, data: bytes = b"") -> hashlib._Hash:
        self.sizes[memoryview(data).nbytes] += 1
        return hashlib.sha256(data)


@pytest.mark.parametrize("embed", ["0", "1"])
def test_each_weight_is_hashed_once_and_the_notes_match_the_binary(tmp_path, monkeypatch, embed):
    source = matmul_add(k=64, n=48, seed=8)
    onnx.save(source, tmp_path / "m.onnx")
    counting = CountingSha256()
    monkeypatch.setattr(binary_writer, "hashlib", counting)
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", embed)
    ep.InferenceSession(str(tmp_path / "m.onnx"), so, providers=[NPU])
    assert counting.sizes[64 * 48 * 4] == 1  # the weight matrix
    assert counting.sizes[48 * 4] == 1  # the bias
    monkeypatch.undo()
    # The digest in the notes is the binary's, so the model loads and computes.
    ctx = onnx.load(tmp_path / "m_ctx.onnx")
    (node,) = [n for n in ctx.graph.node if E.is_ep_context_node(n)]
    info = E.parse_ep_context_node(node)
    binary = ContextBinary.open(tmp_path / "m_npusim.bin") if embed == "0" else \
        ContextBinary.from_bytes(info.ep_cache_context)
    with binary:
        assert recorded_digest(info) == binary.graph_digest(node.name)
    session = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"), providers=[NPU])
    feed = random_feed(source)
    np.testing.assert_allclose(session.run(None, feed)[0], ort_run(source, feed)[0], rtol=1e-5,
                               atol=1e-6)
