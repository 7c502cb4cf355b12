"""A decoder-only transformer as prefill and decode graphs over the same weights: greedy
generation through the NPU matches onnxruntime token for token, and compiled as one sharing
group its weights are stored once in the context binary and resident once on the device."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ep
from ep.models_decoder import NEG, DecoderSpec, decode, prefill, weights
from ep.npusim.shared import workspace

NPU = "NpuSimExecutionProvider"


@pytest.fixture(autouse=True)
def clean_workspace():
    workspace().reset()
    yield
    workspace().reset()


def generate(make, prefill_path: str, decode_path: str, spec: DecoderSpec,
             steps: int = 16) -> list[int]:
    """Greedy decoding: the prompt through prefill, then ``steps`` tokens through decode."""
    first, step = make(prefill_path), make(decode_path)
    prompt = np.random.default_rng(1).integers(0, spec.vocab, (1, spec.prompt))
    logits, *cache = first.run(None, {"input_ids": prompt.astype(np.int64)})
    tokens = [int(np.argmax(logits[0, -1]))]
    mask = np.full((1, 1, 1, spec.cache), NEG, np.float32)
    mask[..., :spec.prompt] = 0
    past = [i.name for i in step.get_inputs() if i.name.startswith("past_")]
    for k in range(steps):
        position = spec.prompt + k
        mask[..., position] = 0
        feeds = {"input_ids": np.array([[tokens[-1]]], np.int64),
                 "position": np.array([position], np.int64), "attention_mask": mask.copy(),
                 **dict(zip(past, cache, strict=True))}
        logits, *cache = step.run(None, feeds)
        tokens.append(int(np.argmax(logits[0, -1])))
    return tokens


def test_greedy_generation_matches_onnxruntime(tmp_path: Path) -> None:
    spec = DecoderSpec()
    onnx.save(prefill(spec), tmp_path / "prefill.onnx")
    onnx.save(decode(spec), tmp_path / "decode.onnx")
    paths = (str(tmp_path / "prefill.onnx"), str(tmp_path / "decode.onnx"))
    for path in paths:  # the whole model runs on the NPU, in one partition
        session = ep.InferenceSession(path, providers=[NPU])
        assert [p["provider"] for p in session.get_partitions()] == [NPU]
    want = generate(lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]),
                    *paths, spec)
    got = generate(lambda p: ep.InferenceSession(p, providers=[NPU]), *paths, spec)
    assert got == want
    assert len(set(want)) > 3  # the random model does not just repeat one token


def compile_pair(folder: Path, spec: DecoderSpec, share: bool) -> int:
    """Compile both graphs into ``folder`` (one sharing group or apart); the binaries' bytes."""
    onnx.save(prefill(spec), folder / "prefill.onnx")
    onnx.save(decode(spec), folder / "decode.onnx")
    for name, last in (("prefill", False), ("decode", True)):
        so = ep.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        if share:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if last:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        ep.InferenceSession(str(folder / f"{name}.onnx"), so, providers=[NPU])
    return sum(os.path.getsize(folder / f) for f in os.listdir(folder) if f.endswith(".bin"))


def test_shared_weights_are_stored_and_resident_once(tmp_path: Path) -> None:
    spec = DecoderSpec(dim=256, heads=4)
    weight_bytes = sum(v.nbytes for v in weights(spec).values())
    apart, together = tmp_path / "apart", tmp_path / "together"
    apart.mkdir(), together.mkdir()
    assert compile_pair(apart, spec, share=False) > 1.9 * weight_bytes
    assert compile_pair(together, spec, share=True) <= 1.05 * weight_bytes
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    sessions = [ep.InferenceSession(str(together / f"{n}_ctx.onnx"), so, providers=[NPU])
                for n in ("prefill", "decode")]
    firmware = sessions[0]._providers[0].runtime.firmware
    assert sessions[1]._providers[0].runtime.firmware is firmware
    assert firmware.stats()["hbm.weights.bytes"] <= 1.05 * weight_bytes
    # Loaded from the shared binary onto one device, the programs compute what the freshly
    # compiled ones do, bit for bit (onnxruntime agreement is the generation test's).
    prompt = {"input_ids": np.arange(spec.prompt, dtype=np.int64).reshape(1, -1) % spec.vocab}
    fresh = ep.InferenceSession(str(together / "prefill.onnx"), providers=[NPU])
    for got, ref in zip(sessions[0].run(None, prompt), fresh.run(None, prompt), strict=True):
        np.testing.assert_array_equal(got, ref)


def test_float16_weights_stay_float16_in_the_binary(tmp_path: Path) -> None:
    """Weights stored in float16 and cast where read: the compiler keeps the widening casts on
    the device instead of folding them, so the context binary holds the float16 bytes (its
    size is the float32 model's less exactly half its weight bytes, up to alignment), and
    generation still matches onnxruntime token for token."""
    spec = DecoderSpec(weight_dtype="float16")
    sizes = {}
    for dtype in ("float32", "float16"):
        folder = tmp_path / dtype
        folder.mkdir()
        onnx.save(prefill(DecoderSpec(weight_dtype=dtype)), folder / "prefill.onnx")
        so = ep.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        ep.InferenceSession(str(folder / "prefill.onnx"), so, providers=[NPU])
        sizes[dtype] = os.path.getsize(folder / "prefill_npusim.bin")
    half = sum(v.astype(np.float16).nbytes for v in weights(spec).values())
    assert abs(sizes["float32"] - sizes["float16"] - half) <= 512 * len(weights(spec))
    onnx.save(prefill(spec), tmp_path / "prefill.onnx")
    onnx.save(decode(spec), tmp_path / "decode.onnx")
    paths = (str(tmp_path / "prefill.onnx"), str(tmp_path / "decode.onnx"))
    want = generate(lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]),
                    *paths, spec, steps=4)
    got = generate(lambda p: ep.InferenceSession(p, providers=[NPU]), *paths, spec, steps=4)
    assert got == want
