"""Weights of an EPContext model live in simulated HBM as views of the mapped context binary.

Every figure is checked against a control: outputs against onnxruntime on the source model,
cycles and trace against the same session with the weights copied into HBM as before.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import ep
from ep.errors import InvalidGraph
from npu_sim.hbm import Hbm
from tests.ep.npusim_graphs import conv_bn_relu, matmul_add, ort_run, random_feed

NPU = "NpuSimExecutionProvider"


def compile_ctx(folder: Path, source: onnx.ModelProto, embed: str = "0") -> Path:
    onnx.save(source, folder / "m.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", embed)
    ep.InferenceSession(str(folder / "m.onnx"), so, providers=[NPU])
    return folder / "m_ctx.onnx"


def mapped(path: Path) -> bool:
    """Whether this process maps ``path``."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


def fw_stats(session: ep.InferenceSession) -> dict:
    return session._providers[0].runtime.firmware.stats()


@pytest.mark.parametrize("streaming", ["1", "0"])
@pytest.mark.parametrize("embed", ["0", "1"])
def test_weights_are_the_binarys_bytes_not_a_copy(tmp_path, monkeypatch, embed, streaming):
    source = conv_bn_relu(c_in=4, c_out=16, hw=12)
    ctx = compile_ctx(tmp_path, source, embed)
    feed = random_feed(source)
    options = {"weight_streaming": streaming}
    session = ep.InferenceSession(str(ctx), providers=[(NPU, options)])
    got = session.run(None, feed)
    np.testing.assert_allclose(got[0], ort_run(source, feed)[0], rtol=1e-4, atol=1e-5)
    stats = fw_stats(session)
    assert stats["hbm.weights.bytes"] > 0
    assert stats["hbm.mapped_bytes"] >= stats["hbm.weights.bytes"]
    # The control: the same session with every DMA copying, as HBM did before.
    monkeypatch.setattr(Hbm, "share", lambda self, address, root, at, n:
                        self.store(address, root[at:at + n]))
    copied = ep.InferenceSession(str(ctx), providers=[(NPU, options)])
    again = copied.run(None, feed)
    control = fw_stats(copied)
    assert control["hbm.mapped_bytes"] == 0
    np.testing.assert_array_equal(got[0], again[0])
    for key in ("device.cycles", "dma.h2d.bytes", "dma.chunks", "hbm.weights.bytes"):
        assert stats[key] == control[key], key
    assert session.get_run_stats()[NPU]["cycles"] == copied.get_run_stats()[NPU]["cycles"]


def test_the_binary_stays_mapped_until_the_last_instance_is_gone(tmp_path):
    source = matmul_add(k=64, n=32, seed=5)
    ctx = compile_ctx(tmp_path, source)
    binary = tmp_path / "m_npusim.bin"
    feed = random_feed(source)
    want = ort_run(source, feed)[0]
    first = ep.InferenceSession(str(ctx), providers=[NPU])
    second = first.create_instance()
    assert fw_stats(first)["hbm.weights.shared_bytes"] > 0  # one device copy for both
    assert mapped(binary)
    del first
    gc.collect()
    assert mapped(binary)  # the instance still reads its weights from it
    np.testing.assert_allclose(second.run(None, feed)[0], want, rtol=1e-5, atol=1e-6)
    del second
    gc.collect()
    assert not mapped(binary)


def test_eight_threads_on_instances_reading_mapped_weights_match_serial_runs(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    source = matmul_add(m=8, k=128, n=64, seed=6)
    ctx = compile_ctx(tmp_path, source)
    session = ep.InferenceSession(str(ctx), providers=[NPU])
    instances = [session, *(session.create_instance() for _ in range(3))]
    feeds = [random_feed(source, seed=k) for k in range(8)]
    serial = [instances[k % 4].run(None, feed)[0] for k, feed in enumerate(feeds)]
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda k: instances[k % 4].run(None, feeds[k])[0], range(8)))
    for k in range(8):
        np.testing.assert_array_equal(threaded[k], serial[k])
        np.testing.assert_allclose(serial[k], ort_run(source, feeds[k])[0], rtol=1e-5,
                                   atol=1e-5)


def test_a_truncated_binary_is_invalid_graph_at_creation(tmp_path):
    ctx = compile_ctx(tmp_path, matmul_add(k=64, n=32, seed=7))
    binary = tmp_path / "m_npusim.bin"
    os.truncate(binary, binary.stat().st_size - 700)  # cuts into the weights
    with pytest.raises(InvalidGraph, match="truncated context binary"):
        ep.InferenceSession(str(ctx), providers=[NPU])
