"""``npu-sim run`` and ``npu-sim devices`` run through :func:`ep.cli.main`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ep import cli_run
from ep.cli import main
from npu_sim.config import PRESETS, DeviceConfig


def embedding_model(vocab: int = 3) -> onnx.ModelProto:
    """ids (int32) -> Cast -> Unsqueeze -> Gather on a (vocab, 4) table: BERT's embedding shape."""
    table = numpy_helper.from_array(np.arange(vocab * 4, dtype=np.float32).reshape(vocab, 4),
                                    "table")
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], name="cast", to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids2"], name="unsq"),
             helper.make_node("Gather", ["table", "ids2"], ["emb"], name="gather", axis=0)]
    graph = helper.make_graph(
        nodes, "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 8])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, None)], [table, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def embedding_path(tmp_path):
    path = tmp_path / "embedding.onnx"
    onnx.save(embedding_model(), path)
    return str(path)


def test_bundled_run_is_checked_and_prints_tolerances(capsys):
    assert main(["run"]) == 0
    text = capsys.readouterr().out
    assert "tolerance rtol 1e-4, atol 1e-5): OK" in text
    assert "check top3_index vs onnxruntime CPU (whole model) (tolerance exact): OK" in text
    assert "throughput:" in text


def test_gather_indices_are_generated_in_range():
    model = embedding_model(vocab=3)
    assert cli_run.index_bounds(model) == {"ids": 3}
    for seed in range(5):
        ids = cli_run.generate_inputs(model, seed)["ids"]
        assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 3


def test_run_of_an_embedding_model_passes_its_check(embedding_path, capsys):
    assert main(["run", embedding_path, "--check"]) == 0
    assert "check emb vs onnxruntime CPU (whole model) (tolerance rtol 1e-4, atol 1e-5): OK" \
        in capsys.readouterr().out


def test_inputs_file_is_fed_and_a_bad_value_names_the_input(embedding_path, tmp_path, capsys):
    good = tmp_path / "good.npz"
    np.savez(good, ids=np.array([[0, 1, 2, 2, 1, 0, 0, 1]], dtype=np.int32))
    assert main(["run", embedding_path, "--inputs", str(good), "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["emb"]["ok"]
    bad = tmp_path / "bad.npz"
    np.savez(bad, ids=np.array([[0, 1, 7, 2, 1, 0, 0, 1]], dtype=np.int32))
    assert main(["run", embedding_path, "--inputs", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "input 'ids' has values in [0, 7], out of range of the axis of size 3" in err


@pytest.mark.parametrize("arrays, problem", [
    ({}, "no array for graph input 'ids'"),
    ({"ids": np.zeros((1, 8), np.int32), "mask": np.zeros(3)}, "'mask' is not a graph input"),
    ({"ids": np.zeros((1, 8), np.float32)}, "input 'ids' is float32, the model expects int32"),
])
def test_inputs_file_errors_are_one_line_naming_the_input(embedding_path, tmp_path, capsys,
                                                          arrays, problem):
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    assert main(["run", embedding_path, "--inputs", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err


def test_missing_model_is_one_line_and_usage_error_is_status_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.onnx")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--no-such-flag"])
    assert exit_.value.code == 2


def test_one_quantization_step_on_an_int8_output_is_not_a_mismatch():
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quant")], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [4])], [scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    feeds = {"x": np.array([0.0, 1.0, -1.0, 2.0], np.float32)}
    want = np.array([0, 10, -10, 20], np.int8)
    one_step = cli_run.check(model, model.SerializeToString(), feeds, [want + 1])["q"]
    assert one_step["ok"] and one_step["tolerance"] == "1 quantization step"
    two_steps = cli_run.check(model, model.SerializeToString(), feeds, [want + 2])["q"]
    assert not two_steps["ok"] and "quantization step apart" in two_steps["problem"]


def test_run_json_is_one_object_with_whole_decline_reasons(capsys):
    assert main(["run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"]["top3_index"] == {"dtype": "int64", "shape": [1, 3]}
    stats = report["runs"]["NpuSimExecutionProvider"]
    assert stats["cycles"] > 0 and stats["throughput_per_s"] > 0 and stats["utilization"]
    assert "energy" in stats
    (reason, nodes), = report["declined"]["TopK"].items()
    assert nodes == ["topk"] and reason.endswith("Where, Xor")
    assert {p["provider"]: p["nodes"] for p in report["partitions"]}["CPUExecutionProvider"] \
        == ["topk"]


def test_devices_lists_every_preset(capsys):
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == list(PRESETS)
    assert main(["devices", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    npu_m = DeviceConfig.preset("npu-m")
    assert figures["npu-m"]["cores"] == npu_m.cores
    assert figures["npu-m"]["peak_tops"]["int8"] == pytest.approx(npu_m.peak_tops("int8"),
                                                                  abs=1e-3)
    assert figures["npu-l"]["dataflow"] == "ws"


def test_exit_codes_as_a_subprocess(tmp_path):
    import subprocess
    import sys

    missing = subprocess.run([sys.executable, "-m", "ep.cli", "run", str(tmp_path / "x.onnx")],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.count("\n") == 1 and "x.onnx" in missing.stderr
    usage = subprocess.run([sys.executable, "-m", "ep.cli", "devices", "--bogus"],
                           capture_output=True, text=True, check=False)
    assert usage.returncode == 2


def test_exported_bert_runs_with_generated_token_ids(tmp_path, capsys):
    """A torch-exported BERT: input_ids and token_type_ids (2 types) get indices in range."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=16)
    bert = transformers.BertModel(config).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, types):
            return self.bert(input_ids=ids, attention_mask=mask,
                             token_type_ids=types).last_hidden_state

    path = tmp_path / "bert.onnx"
    with torch.no_grad():
        torch.onnx.export(Encoder(), tuple(torch.zeros((1, 8), dtype=torch.int64) for _ in names),
                          str(path), input_names=names, output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False)
    bounds = cli_run.index_bounds(onnx.load(path))
    assert bounds["input_ids"] == 100 and bounds["token_type_ids"] == 2
    assert main(["run", str(path), "--check"]) == 0
    assert "check last_hidden_state vs onnxruntime CPU" in capsys.readouterr().out


def test_text_decline_reasons_are_whole(capsys):
    """The text report prints each decline reason whole, as the session gives it."""
    import ep
    from ep.models import tiny_cnn

    session = ep.InferenceSession(tiny_cnn().SerializeToString())
    (reason,) = {r["NpuSimExecutionProvider"] for r in session.get_decline_reasons().values()}
    assert main(["run"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("  declined"))
    assert line == f"  declined TopK x1 (topk): {reason}"


def test_check_of_an_epcontext_model_runs_onnxruntime_on_its_source(tmp_path, capsys,
                                                                    monkeypatch):
    from ep import cli_errors
    from ep.models import tiny_cnn

    onnx.save(tiny_cnn(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx")]) == 0
    capsys.readouterr()
    loaded = []
    load_model = cli_errors.load_model
    monkeypatch.setattr(cli_errors, "load_model", lambda p: loaded.append(p) or load_model(p))
    assert main(["run", str(tmp_path / "m_ctx.onnx"), "--check", "--json"]) == 0
    # the EPContext model, then its source once (its inputs and the check share it)
    assert loaded == [str(tmp_path / "m_ctx.onnx"), str(tmp_path / "m.onnx")]
    report = json.loads(capsys.readouterr().out)
    assert all(c["ok"] for c in report["check"].values())
    assert {c["reference"] for c in report["check"].values()} == {
        f"onnxruntime CPU (whole model) of {tmp_path / 'm.onnx'}"}
    (tmp_path / "m.onnx").unlink()
    assert main(["run", str(tmp_path / "m_ctx.onnx"), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "as ['m.onnx'] in" in err
