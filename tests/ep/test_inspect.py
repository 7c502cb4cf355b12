"""``npu-sim inspect``: prints what a context binary holds; a bad file exits 1 with the message."""

from __future__ import annotations

import numpy as np
import pytest

from ep.cli import main
from ep.npusim.binary import write_context_binary
from firmware_model import commands as fc
from firmware_model.program import KernelLaunch, Program, Region, TensorDesc, reloc

SHARED = np.arange(300, dtype=np.float32).tobytes()
OWN = {"encoder": bytes(range(40)), "decoder": bytes(range(1, 41))}
STREAM = fc.pack([
    fc.Dma(1, reloc(Region.WEIGHTS, 0), reloc(Region.ARENA, 0x80), len(SHARED)),
    fc.Kernel(2, 0, 0b11, deps=(1,)),
    fc.Signal(3, 5, 1, deps=(2,)),
])
BAD_DESCRIPTOR = bytes([0xEE]) + bytes(63)  # unknown opcode


def program(name: str, stream: bytes) -> Program:
    tensors = (
        TensorDesc("images", (1, 3, 10, 10), "float32", Region.ARENA, 0),
        TensorDesc("kernel", (300,), "float32", Region.WEIGHTS, 0),
        TensorDesc("bias", (10,), "float32", Region.WEIGHTS, 1536),
        TensorDesc("logits", (1, 10), "float16", Region.ARENA, 1280),
    )
    launch = KernelLaunch("Conv", (0, 1, 2), (3,), {"strides": (2, 2), "auto_pad": "SAME_UPPER"},
                          node=f"{name}/conv")
    return Program(name, tensors, (launch,), stream, (0,), (3,), {1: SHARED, 2: OWN[name]},
                   4096, "npu-m")


@pytest.fixture
def binary_path(tmp_path):
    path = tmp_path / "model_npusim.bin"
    write_context_binary(path, [program("encoder", STREAM), program("decoder", BAD_DESCRIPTOR)],
                         hardware_architecture="npu-m", config_digest="c0ffee" * 10 + "0123")
    return path


def test_inspect_prints_header_graphs_commands_and_dedup(binary_path, capsys):
    assert main(["inspect", str(binary_path)]) == 0
    out = capsys.readouterr().out
    assert "architecture    npu-m" in out
    assert "c0ffee" * 10 + "0123" in out
    assert f"file size       {binary_path.stat().st_size:,} bytes" in out
    for kind in ("strings", "graphs", "programs", "commands", "weights"):
        assert f"  {kind} " in out
    assert "graphs (2): encoder, decoder" in out
    weights_row = next(line for line in out.splitlines() if " weights " in f" {line} ")
    assert "per block" in weights_row and "0x00000000" not in weights_row
    assert "graph 'encoder'" in out and "graph 'decoder'" in out
    assert "images float32[1, 3, 10, 10]" in out and "logits float16[1, 10]" in out
    assert "Conv node='encoder/conv' inputs=[0, 1, 2] outputs=[3]" in out
    assert "strides=(2, 2) auto_pad='SAME_UPPER'" in out
    for cmd in fc.unpack(STREAM):
        assert fc.describe(cmd) in out
    assert "commands (3 x 64 B)" in out
    assert "undecodable:" in out and "unknown opcode 238" in out
    total = 2 * len(SHARED) + sum(map(len, OWN.values()))
    distinct = len(SHARED) + sum(map(len, OWN.values()))
    assert "distinct blobs    3 (4 references)" in out
    assert f"total bytes       {total:,}" in out
    assert f"deduplicated      {distinct:,} (saved {len(SHARED):,})" in out


def test_inspect_corrupt_file_exits_1_with_the_message(binary_path, capsys):
    data = binary_path.read_bytes()
    binary_path.write_bytes(data[:-100])
    assert main(["inspect", str(binary_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"npu-sim inspect: {binary_path}: truncated context binary: header says "
        f"{len(data)} bytes, file has {len(data) - 100}\n"
    )


def test_inspect_wrong_architecture_and_missing_file(binary_path, tmp_path, capsys):
    assert main(["inspect", str(binary_path), "--expect-architecture", "npu-l"]) == 1
    assert "compiled for hardware architecture 'npu-m', this device is 'npu-l'" in \
        capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "absent.bin")]) == 1
    assert "cannot open context binary" in capsys.readouterr().err


def test_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "inspect" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "text"), [
    (None, "File doesn't exist"),
    (b"garbage", "Protobuf parsing failed"),
])
def test_run_on_a_bad_model_file_is_one_line_and_exit_1(tmp_path, capsys, content, text):
    path = tmp_path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(Exception, match=text):
        main(["--debug", "run", str(path)])
