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


def _shared_sources(folder):
    """a and b: the same weights under two graphs (b adds a Relu); c: its own weights."""
    from tests.ep.npusim_graphs import matmul_add

    models = {"a": matmul_add(seed=1), "b": matmul_add(act="Relu", seed=1),
              "c": matmul_add(k=8, n=4, seed=7)}
    for name, model in models.items():
        onnx.save(model, folder / f"{name}.onnx")
    return models


def test_compile_share_writes_one_binary_with_weights_stored_once(tmp_path, capsys):
    from ep.npusim.binary import ContextBinary
    from tests.ep.npusim_graphs import ort_run, random_feed

    models = _shared_sources(tmp_path)
    argv = ["compile", str(tmp_path / "a.onnx"), "--share", str(tmp_path / "b.onnx"),
            str(tmp_path / "c.onnx")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["a_npusim.bin"]
    for name in ("a_ctx.onnx", "b_ctx.onnx", "c_ctx.onnx", "a_npusim.bin"):
        path = tmp_path / name
        assert f"wrote {path} ({path.stat().st_size:,} bytes)" in text
    assert text.count("compiled ") == 3
    with ContextBinary.open(tmp_path / "a_npusim.bin") as binary:
        assert sorted(binary.graph_names()) == ["a_NpuSim_0", "b_NpuSim_0", "c_NpuSim_0"]
        summary = binary.weights_summary
        assert summary.distinct_bytes < summary.referenced_bytes  # a's and b's weights once
    for name, source in models.items():
        session = ep.InferenceSession(str(tmp_path / f"{name}_ctx.onnx"),
                                      providers=["NpuSimExecutionProvider"])
        feeds = random_feed(source, seed=3)
        for got, want in zip(session.run(None, feeds), ort_run(source, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_compile_share_into_a_folder_and_a_failure_leaves_nothing(tmp_path, capsys):
    _shared_sources(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    argv = ["compile", str(tmp_path / "a.onnx"), "--share", str(tmp_path / "b.onnx"), str(bad),
            "-o", str(out)]
    assert main(argv) == 1
    assert "bad.onnx: not an ONNX model" in capsys.readouterr().err
    assert list(out.iterdir()) == []  # a's and b's _ctx.onnx were removed with the group
    argv = ["compile", str(tmp_path / "a.onnx"), "--share", str(tmp_path / "b.onnx"),
            "-o", str(out)]
    assert main(argv) == 0  # the abandoned group does not block the next one
    assert sorted(p.name for p in out.iterdir()) == ["a_ctx.onnx", "a_npusim.bin", "b_ctx.onnx"]
    assert main(argv) == 1  # the binary exists: the EP's Fail, nothing overwritten
    assert "a_npusim.bin': the file exists already" in capsys.readouterr().err


def test_compile_cpu_nodes_keeps_them_out_of_the_context(model_path, tmp_path, capsys):
    conv = next(n.name for n in tiny_cnn().graph.node if n.op_type == "Conv")
    assert main(["compile", str(model_path), "--cpu-nodes", conv]) == 0
    compiled = onnx.load(tmp_path / "m_ctx.onnx")
    assert conv in [n.name for n in compiled.graph.node if n.op_type == "Conv"]
    want = _run(model_path, tiny_cnn())
    for got, ref in zip(_run(tmp_path / "m_ctx.onnx", tiny_cnn()), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
