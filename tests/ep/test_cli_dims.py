"""``--dim NAME=VALUE`` of ``npu-sim run`` and ``npu-sim compile`` (:mod:`ep.cli_dims`) on a
model exported from torch with a dynamic batch: without it every node stays on the CPU (the
NPU compiles static shapes, and says to set the dim), with it the NPU takes them; a model
compiled with it runs at that size, inputs generated to match."""

from __future__ import annotations

import json
import warnings

import pytest

from ep.cli import main

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dynamic_batch(tmp_path_factory) -> str:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(8, 4)).eval()
    path = tmp_path_factory.mktemp("dims") / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.rand(2, 3, 8, 8),), str(path), input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                          dynamo=False)
    return str(path)


def report(capsys, *args: str) -> dict:
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_dynamic_batch_stays_on_the_cpu_until_fixed(dynamic_batch, capsys) -> None:
    plain = report(capsys, dynamic_batch, "--check")
    assert {p["provider"] for p in plain["partitions"]} == {"CPUExecutionProvider"}
    reasons = [r for by_reason in plain["declined"].values() for r in by_reason]
    assert any("npu-sim --dim batch=VALUE" in r for r in reasons)
    fixed = report(capsys, dynamic_batch, "--check", "--dim", "batch=3")
    assert {p["provider"] for p in fixed["partitions"]} == {"NpuSimExecutionProvider"}
    assert fixed["outputs"]["y"]["shape"] == [3, 4]
    assert all(c["ok"] for c in fixed["check"].values())


def test_a_model_compiled_at_a_size_runs_at_that_size(dynamic_batch, tmp_path, capsys) -> None:
    ctx = str(tmp_path / "net_ctx.onnx")
    assert main(["compile", dynamic_batch, "--dim", "batch=5", "-o", ctx]) == 0
    assert "1 EPContext node(s) run on the NPU, 0 node(s) stay on the CPU" in \
        capsys.readouterr().out
    # Its source is not beside it: --check needs it, a plain run generates from the ctx model.
    ran = report(capsys, ctx)
    assert ran["outputs"]["y"]["shape"] == [5, 4]


@pytest.mark.parametrize("value", ["batch=-1", "batch=two", "=3", "batch"])
def test_a_bad_dim_is_a_usage_error_naming_it(dynamic_batch, capsys, value) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", dynamic_batch, "--dim", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dim: " in err and repr(value) in err
