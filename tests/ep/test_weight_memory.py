"""User-provided device memory for external weight files (``aclmdlSetExternalWeightAddress``):
the caller allocates a buffer on the session's device and hands it over by file name; the
session puts the file's weights there, never allocates or frees it, and checks its size."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import ep
from ep.errors import InvalidArgument
from ep.framework.provider import ProviderContext
from ep.npusim import NpuSimExecutionProvider
from npu_sim import Device
from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

NPU = "NpuSimExecutionProvider"


def compile_external(folder: Path, mode: str, source: onnx.ModelProto) -> Path:
    onnx.save(source, folder / "m.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(folder / "m.onnx"), so,
                        providers=[(NPU, {"external_weights": mode})])
    return folder / "m_ctx.onnx"


def provider(on: Device, memory: dict, **options: str) -> NpuSimExecutionProvider:
    return NpuSimExecutionProvider(ProviderContext(provider_options=options), device=on,
                                   weight_memory=memory)


@pytest.mark.parametrize("streaming", ["1", "0"])
def test_the_combined_file_lives_in_the_callers_buffer(tmp_path, streaming):
    source = matmul_add(k=64, n=32, seed=3)
    ctx = compile_external(tmp_path, "2", source)
    combined = tmp_path / "weight" / "m_weight_combined"
    device = Device("npu-m")
    buffer = device.malloc(combined.stat().st_size)
    before = device.stats()["hbm.bytes_in_use"]
    npu = provider(device, {"m_weight_combined": buffer}, weight_streaming=streaming)
    session = ep.InferenceSession(str(ctx), providers=[npu])
    feed = random_feed(source)
    np.testing.assert_allclose(session.run(None, feed)[0], ort_run(source, feed)[0],
                               rtol=1e-5, atol=1e-6)
    stats = npu.runtime.firmware.stats()
    weights = sum(w.size for w in session.get_external_weight_files())
    assert stats["hbm.weights.user_bytes"] == stats["hbm.weights.bytes"] == weights
    # The session allocated its arena, no weight: compare with one that owns its weights.
    own = ep.InferenceSession(str(ctx), providers=[(NPU, {"weight_streaming": streaming})])
    own.run(None, feed)
    arena_only = stats["hbm.bytes_in_use"] - before
    owning = own._providers[0].runtime.firmware.stats()["hbm.bytes_in_use"]
    assert owning - arena_only >= weights
    # Every weight is in the buffer at its offset in the file.
    meta = json.loads((tmp_path / "weight" / "meta.json").read_text())
    data = combined.read_bytes()
    for item in session.get_external_weight_files():
        assert meta["hash_to_weight_offset"][item.id] == item.offset
        got = device.hbm.read(buffer.address + item.offset, item.size)
        assert got.tobytes() == data[item.offset:item.offset + item.size]
    del session, npu
    gc.collect()
    assert not buffer.freed  # the caller's to free
    device.free(buffer)


def test_one_file_in_user_memory_the_other_allocated(tmp_path):
    source = matmul_add(k=64, n=32, seed=4)
    ctx = compile_external(tmp_path, "1", source)
    listed = ep.InferenceSession(str(ctx)).get_external_weight_files()
    big = max(listed, key=lambda w: w.size)
    name = Path(big.path).name
    device = Device("npu-m")
    buffer = device.malloc(big.size)
    npu = provider(device, {})
    npu.set_external_weight_address(name, buffer)
    session = ep.InferenceSession(str(ctx), providers=[npu])
    feed = random_feed(source)
    np.testing.assert_allclose(session.run(None, feed)[0], ort_run(source, feed)[0],
                               rtol=1e-5, atol=1e-6)
    stats = npu.runtime.firmware.stats()
    assert stats["hbm.weights.user_bytes"] == big.size
    assert stats["hbm.weights.bytes"] == sum(w.size for w in listed)


def test_a_buffer_too_small_names_both_sizes(tmp_path):
    ctx = compile_external(tmp_path, "2", matmul_add(k=64, n=32, seed=3))
    size = (tmp_path / "weight" / "m_weight_combined").stat().st_size
    device = Device("npu-m")
    buffer = device.malloc(size - 1)
    with pytest.raises(InvalidArgument, match=rf"is {size - 1} bytes; the file is {size} bytes"):
        ep.InferenceSession(str(ctx), providers=[provider(device,
                                                          {"m_weight_combined": buffer})])
    assert not buffer.freed


def test_a_file_the_model_does_not_use(tmp_path):
    ctx = compile_external(tmp_path, "2", matmul_add(seed=3))
    device = Device("npu-m")
    with pytest.raises(InvalidArgument, match=r"\['other'\].*m_weight_combined"):
        ep.InferenceSession(str(ctx), providers=[provider(device, {"other": device.malloc(64)})])


def test_a_buffer_of_another_device_or_a_freed_one(tmp_path):
    ctx = compile_external(tmp_path, "2", matmul_add(seed=3))
    size = (tmp_path / "weight" / "m_weight_combined").stat().st_size
    device, other = Device("npu-m"), Device("npu-m")
    with pytest.raises(InvalidArgument, match="another device"):
        ep.InferenceSession(str(ctx), providers=[
            provider(device, {"m_weight_combined": other.malloc(size)})])
    freed = device.malloc(size)
    device.free(freed)
    with pytest.raises(InvalidArgument, match="live DeviceBuffer"):
        provider(device, {"m_weight_combined": freed})


def test_the_device_option_must_agree_with_the_given_device():
    with pytest.raises(InvalidArgument, match="'npu-s'.*'npu-m'"):
        provider(Device("npu-m"), {}, device="npu-s")
