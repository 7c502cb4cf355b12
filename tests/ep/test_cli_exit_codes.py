"""Every ``npu-sim`` subcommand's exit status: 0 success, 1 a model or file error (one line on
stderr, no traceback unless --debug), 2 a usage error; and the next step a load failure names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import ep
from ep import cli_errors
from ep.cli import main
from ep.models import sample_input, tiny_cnn
from npu_sim.config import DeviceConfig

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "tiny_cnn.trace.jsonl")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A missing path and a file of garbage, with each suffix the subcommands read."""
    found = {}
    for suffix in (".onnx", ".bin", ".trace.jsonl", ".json"):
        garbage = tmp_path / f"garbage{suffix}"
        garbage.write_bytes(b"\x00\x01 not what it should be \xff" * 4)
        found[f"garbage{suffix}"] = str(garbage)
        found[f"missing{suffix}"] = str(tmp_path / f"missing{suffix}")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"hbm_gbps": [100, 200]}))
    found["grid"] = str(grid)
    found["out"] = str(tmp_path / "out")
    return found


# (subcommand argv with {placeholders} from `files`) for a missing file and for a bad one
FILE_ERRORS = {
    "run": ["run", "{}.onnx"],
    "compile": ["compile", "{}.onnx"],
    "inspect binary": ["inspect", "{}.bin"],
    "inspect model": ["inspect", "{}.onnx"],
    "export": ["export", "{}.trace.jsonl", "--format", "perfetto", "-o", "{out}"],
    "replay": ["replay", "{}.trace.jsonl"],
    "report": ["report", "{}.trace.jsonl"],
    "diff": ["diff", TRACE, "{}.trace.jsonl"],
    "sweep": ["sweep", "{}.trace.jsonl", "--grid", "{grid}", "-o", "{out}"],
    "sweep grid": ["sweep", TRACE, "--grid", "{}.json", "-o", "{out}"],
    "run device": ["run", "--device", "{}.json"],
}


def _argv(template: list[str], kind: str, files: dict[str, str]) -> list[str]:
    out = []
    for arg in template:
        if arg.startswith("{}"):
            arg = files[kind + arg[2:]]
        out.append(arg.format(**files) if "{" in arg else arg)
    return out


@pytest.mark.parametrize("kind", ["missing", "garbage"])
@pytest.mark.parametrize("name", sorted(FILE_ERRORS))
def test_file_errors_are_one_line_and_status_1(name, kind, files, capsys):
    argv = _argv(FILE_ERRORS[name], kind, files)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"npu-sim {argv[0]}: ")
    assert "Traceback" not in captured.err
    bad = next(a for a in argv if "missing" in a or "garbage" in a)
    assert Path(bad).name in captured.err, captured.err


def test_debug_shows_the_traceback_after_the_subcommand_too(files):
    with pytest.raises(ep.errors.NoSuchFile):
        main(["run", files["missing.onnx"], "--debug"])
    with pytest.raises(ep.errors.NoSuchFile):
        main(["--debug", "run", files["missing.onnx"]])


USAGE_ERRORS = [
    [],
    ["no-such-command"],
    ["run", "--no-such-flag"],
    ["run", "--seed", "x"],
    ["compile"],
    ["compile", "m.onnx", "--external-weights", "3"],
    ["compile", "a.onnx", "--share"],
    ["devices", "--bogus"],
    ["inspect"],
    ["export", TRACE, "--format", "nope", "-o", "x"],
    ["export", TRACE],
    ["replay", TRACE, "--mode", "sideways"],
    ["report", TRACE, "--top", "many"],
    ["diff", TRACE],
    ["sweep", TRACE],
    ["sweep", TRACE, "--grid", "g.json", "--workers", "two"],
    ["bench", "--bogus"],
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=lambda a: " ".join(a) or "(nothing)")
def test_usage_errors_are_status_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage: npu-sim" in capsys.readouterr().err


def test_share_with_embed_or_prefix_is_a_usage_error(tmp_path, capsys):
    for extra in (["--embed"], ["--prefix", "P_"]):
        with pytest.raises(SystemExit) as exit_:
            main(["compile", "a.onnx", "--share", "b.onnx", *extra])
        assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--embed cannot be combined with --share" in err
    assert "each model's name prefixes its own nodes" in err
    with pytest.raises(SystemExit):
        main(["compile", str(tmp_path / "a.onnx"), "--share", str(tmp_path / "x" / "a.onnx")])
    assert "would both write" in capsys.readouterr().err


def test_bench_without_a_checkout_says_so_in_one_line(tmp_path, capsys):
    assert main(["bench", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the benchmarks ship with the source, not the wheel" in err


def test_an_unknown_bench_is_a_usage_error_of_the_runner(capsys):
    assert main(["bench", "--only", "nope"]) == 2


def test_as_a_subprocess_no_traceback_and_the_statuses(files):
    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ep.cli", *argv], capture_output=True,
                              text=True, check=False, cwd=ROOT)

    missing = cli("inspect", files["missing.bin"])
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "Traceback" not in missing.stderr
    assert cli("report", files["garbage.trace.jsonl"]).returncode == 1
    assert cli("replay", TRACE, "--mode", "x").returncode == 2
    debug = cli("--debug", "inspect", files["missing.bin"])
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# -- what to do next -----------------------------------------------------------------------------


@pytest.fixture
def small_hbm(tmp_path: Path) -> str:
    """npu-s with 1 MiB of HBM (the smallest valid) in a config file."""
    path = tmp_path / "small.json"
    config = DeviceConfig.preset("npu-s").replace(hbm_bytes=1 << 20)
    path.write_text(json.dumps(config.to_dict()))
    return str(path)


def _big_model(path: Path) -> None:
    """A Gemm with 2 MiB of weights: does not fit in 1 MiB of HBM."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((512, 1024), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="big_matmul")], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_out_of_hbm_names_bigger_presets_and_cpu_nodes(tmp_path, small_hbm, capsys):
    model = tmp_path / "big.onnx"
    _big_model(model)
    assert main(["run", str(model), "--device", small_hbm]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "npu.hbm: cannot allocate" in err
    assert f"next: the device {small_hbm} (npu-s) has 1.0 MiB of HBM: pick a device with more, " \
           "--device os32 (1.0 GiB), --device npu-s (4.0 GiB)" in err
    assert "--cpu-nodes" in err
    # The suggested fix works: the node kept on the CPU, the run matches onnxruntime.
    assert main(["run", str(model), "--device", small_hbm, "--cpu-nodes", "big_matmul",
                 "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["y"]["ok"]
    assert report["declined"] == {"MatMul": {
        "moved to the CPU by the provider option cpu_nodes": ["big_matmul"]}}


def test_a_failing_node_is_named_with_the_option_that_moves_it(capsys):
    import argparse

    from npu_sim.errors import KernelError

    args = argparse.Namespace(device="npu-m", cpu_nodes=None)
    exc = ep.errors.InvalidGraph("NpuSim: cannot compile partition 'NpuSim_0': "
                                 + str(KernelError("Conv", "conv_7", "bad pads")))
    assert cli_errors.next_step(exc, args) == (
        "to run the rest of the model, keep node 'conv_7' on the CPU: --cpu-nodes 'conv_7' "
        "(or every Conv: --cpu-nodes Conv)")
    bare = ep.errors.InvalidGraph("NpuSim: cannot compile partition 'NpuSim_3': shape")
    assert "--debug for the failing operator of NpuSim_3" in cli_errors.next_step(bare, args)
    # Subcommands without --cpu-nodes get no advice they cannot follow.
    assert cli_errors.next_step(exc, argparse.Namespace()) is None


def test_cpu_nodes_moves_op_types_and_rejects_unknown_names(tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), path)
    session = ep.InferenceSession(str(path), providers=[
        ("NpuSimExecutionProvider", {"cpu_nodes": "Relu"})])
    relus = [n.name for n in tiny_cnn().graph.node if n.op_type == "Relu"]
    reasons = session.get_decline_reasons()
    assert relus and all(reasons[n]["NpuSimExecutionProvider"].startswith("moved to the CPU")
                         for n in relus)
    feeds = sample_input(tiny_cnn())
    want = ep.InferenceSession(str(path)).run(None, feeds)
    for got, ref in zip(session.run(None, feeds), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert main(["run", str(path), "--cpu-nodes", "Relu,nothing_by_this_name"]) == 1
    assert "cpu_nodes: nothing_by_this_name names no node and no op type of the model" in \
        capsys.readouterr().err
