"""``npu-sim compile`` run through :func:`ep.cli.main`; the written model loads back and runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ep
from ep.cli import main
from ep.models import sample_input, tiny_cnn


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_cnn(), path)
    return path


def _run(path, model) -> list[np.ndarray]:
    session = ep.InferenceSession(str(path), providers=["NpuSimExecutionProvider"])
    return session.run(None, sample_input(model))


def test_compile_writes_model_and_binary_that_load_back(model_path, tmp_path, capsys):
    assert main(["compile", str(model_path)]) == 0
    text = capsys.readouterr().out
    ctx, binary = tmp_path / "m_ctx.onnx", tmp_path / "m_npusim.bin"
    assert f"wrote {ctx} ({ctx.stat().st_size:,} bytes)" in text
    assert f"wrote {binary} ({binary.stat().st_size:,} bytes)" in text
    assert "1 EPContext node(s) run on the NPU, 1 node(s) stay on the CPU" in text
    want = _run(model_path, tiny_cnn())
    got = _run(ctx, tiny_cnn())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_compile_embed_prefix_and_output(model_path, tmp_path, capsys):
    out = tmp_path / "out" / "x_ctx.onnx"
    out.parent.mkdir()
    assert main(["compile", str(model_path), "-o", str(out), "--embed", "--prefix", "P_"]) == 0
    text = capsys.readouterr().out
    assert text.count("wrote ") == 1 and f"wrote {out}" in text
    node = next(n for n in onnx.load(out).graph.node if n.op_type == "EPContext")
    assert node.name.startswith("P_")
    assert {a.name: a.i for a in node.attribute}["embed_mode"] == 1


def test_compile_with_external_weights_lists_their_files(model_path, tmp_path, capsys):
    assert main(["compile", str(model_path), "--external-weights", "2"]) == 0
    text = capsys.readouterr().out
    combined = tmp_path / "weight" / "m_weight_combined"
    assert f"wrote {combined} ({combined.stat().st_size:,} bytes) (external weights)" in text
    assert ".meta.lock" not in text
    got = _run(tmp_path / "m_ctx.onnx", tiny_cnn())
    assert got[0].shape == (1, 10)


def test_compile_of_a_missing_model_is_one_line(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "none.onnx")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
