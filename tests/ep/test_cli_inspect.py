"""``npu-sim inspect`` on EPContext models (files beside, embedded) and its --json form, checked
against what ContextBinary and the model itself say."""

from __future__ import annotations

import json

import onnx
import pytest

from ep.cli import main
from ep.framework import epcontext as E
from ep.models import tiny_cnn
from ep.npusim.binary import ContextBinary


@pytest.fixture
def compiled(tmp_path):
    onnx.save(tiny_cnn(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx")]) == 0
    return tmp_path


def test_inspect_json_of_a_binary_matches_the_binary(compiled, capsys):
    capsys.readouterr()
    path = compiled / "m_npusim.bin"
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"file", "kind", "header", "sections", "graphs", "weights"}
    assert report["kind"] == "context_binary"
    with ContextBinary.open(path) as binary:
        assert report["header"]["file_size"] == path.stat().st_size == binary.header.file_size
        assert report["header"]["architecture"] == "npu-m"
        assert [g["name"] for g in report["graphs"]] == binary.graph_names()
        program = binary.programs()[0]
        graph = report["graphs"][0]
        assert [launch["op"] for launch in graph["launches"]] == [k.op for k in program.launches]
        assert graph["weight_bytes"] == sum(len(w) for w in program.weights.values())
        assert report["weights"]["distinct_bytes"] == binary.weights_summary.distinct_bytes
        assert len(report["sections"]) == len(binary.sections)


def test_inspect_of_a_ctx_model_prints_its_nodes_then_the_binary(compiled, capsys):
    capsys.readouterr()
    assert main(["inspect", str(compiled / "m_ctx.onnx")]) == 0
    text = capsys.readouterr().out
    node = next(n for n in onnx.load(compiled / "m_ctx.onnx").graph.node
                if E.is_ep_context_node(n))
    assert text.startswith(f"EPContext model {compiled / 'm_ctx.onnx'}: 1 EPContext node(s), "
                           "1 other node(s)\n")
    assert f"  {node.name}\n" in text and "    ep_cache_context       m_npusim.bin\n" in text
    assert f"context binary {compiled / 'm_npusim.bin'}\n" in text
    assert "weights blob" in text


def test_inspect_json_of_an_embedded_ctx_model(tmp_path, capsys):
    onnx.save(tiny_cnn(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "--embed"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "m_ctx.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "epcontext_model" and report["other_nodes"] == 1
    (node,) = report["ep_context_nodes"]
    assert node["embed_mode"] == 1 and node["main_context"] == 1
    assert node["ep_cache_context"].endswith("embedded bytes>")
    assert node["source"] == "NpuSimExecutionProvider"
    (binary,) = report["binaries"]
    assert binary["file"].endswith("(embedded in node " + repr(node["name"]) + ")")
    assert [g["name"] for g in binary["graphs"]] == [node["partition_name"]]


def test_inspect_of_a_model_without_ep_context_nodes_says_what_to_do(tmp_path, capsys):
    onnx.save(tiny_cnn(), tmp_path / "plain.onnx")
    assert main(["inspect", str(tmp_path / "plain.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compile it first (npu-sim compile MODEL)" in err


def test_inspect_of_a_ctx_model_whose_binary_is_gone(compiled, capsys):
    (compiled / "m_npusim.bin").unlink()
    assert main(["inspect", str(compiled / "m_ctx.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m_npusim.bin' does not exist" in err
