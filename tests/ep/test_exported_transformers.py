"""Transformers as users export them: built in code from transformers' default configs with
random weights, exported by torch's TorchScript exporter, run through ep.InferenceSession.

onnxruntime's basic optimizations run before partitioning (the exporter's Shape/Gather/Concat
arithmetic folds away), so the encoders land on the NPU in at most two partitions with fewer
than ten CPU nodes, and match onnxruntime on the same inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import ep

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NPU, CPU = "NpuSimExecutionProvider", "CPUExecutionProvider"
SEQ = 128


class _Encoder(torch.nn.Module):
    """The encoder's last hidden state from keyword inputs (the exporter passes positions)."""

    def __init__(self, model, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs, strict=True))).last_hidden_state


def export(kind: str, folder: Path) -> tuple[Path, dict[str, np.ndarray], int]:
    """The exported model, inputs for it and its hidden size."""
    torch.manual_seed(0)
    if kind == "t5-small-encoder":
        config = transformers.T5Config()  # transformers' default: t5-small
        model = transformers.T5EncoderModel(config)
        names = ("input_ids", "attention_mask")
    else:
        config = transformers.BertConfig()  # transformers' default: bert-base
        model = transformers.BertModel(config)
        names = ("input_ids", "attention_mask", "token_type_ids")
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, config.vocab_size, (1, SEQ)).astype(np.int64),
             "attention_mask": np.ones((1, SEQ), np.int64),
             "token_type_ids": np.zeros((1, SEQ), np.int64)}
    feeds = {name: feeds[name] for name in names}
    path = folder / f"{kind}.onnx"
    with torch.no_grad():
        torch.onnx.export(_Encoder(model.eval(), names),
                          tuple(torch.from_numpy(feeds[n]) for n in names), str(path),
                          input_names=list(names), output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False)
    hidden = config.d_model if kind.startswith("t5") else config.hidden_size
    return path, feeds, hidden


@pytest.mark.parametrize("kind", ["bert-base", "t5-small-encoder"])
def test_exported_encoder_lands_on_the_npu_and_matches_onnxruntime(tmp_path: Path,
                                                                   kind: str) -> None:
    path, feeds, hidden = export(kind, tmp_path)
    session = ep.InferenceSession(str(path), providers=[NPU])
    partitions = session.get_partitions()
    cpu_nodes = [n for n, p in session.get_node_assignment().items() if p == CPU]
    assert sum(p["provider"] == NPU for p in partitions) <= 2, partitions
    assert len(cpu_nodes) < 10, (cpu_nodes, session.get_decline_reasons())
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(str(path), providers=[CPU]).run(None, feeds)
    assert got.shape == want.shape == (1, SEQ, hidden)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_exported_bert_compiled_by_the_cli_loads_back_and_matches(tmp_path: Path,
                                                                  capsys) -> None:
    """The README's tour on a BERT as torch exports it: `npu-sim compile` puts the whole
    encoder in one EPContext node (the graph is compiled after the basic rewrites, as a
    session runs it), and `npu-sim run --check` on the `_ctx.onnx` generates token ids in
    range of the embedding it cannot see (from the source model beside it) and matches
    onnxruntime on the source model."""
    from ep.cli import main

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100)
    names = ("input_ids", "attention_mask", "token_type_ids")
    ids = torch.randint(0, config.vocab_size, (1, 16))
    path = tmp_path / "bert.onnx"
    with torch.no_grad():
        torch.onnx.export(_Encoder(transformers.BertModel(config).eval(), names),
                          (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(path),
                          input_names=list(names), output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False)
    assert main(["compile", str(path)]) == 0
    assert "1 EPContext node(s) run on the NPU, 0 node(s) stay on the CPU" in \
        capsys.readouterr().out
    assert main(["run", str(tmp_path / "bert_ctx.onnx"), "--check"]) == 0
    assert "last_hidden_state vs onnxruntime CPU" in capsys.readouterr().out
