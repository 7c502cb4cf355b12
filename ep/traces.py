"""Recording traces of models through a session, and the sample traces under ``traces/``.

:func:`record` runs a model in a profiling :class:`~ep.InferenceSession` (timing only by
default) and returns its :class:`npu_sim.trace.Trace`; :func:`simulate` runs it again, from the
model, under a config: what elastic replay is measured against. :data:`SAMPLES` are the bundled
models the repository keeps traces of; regenerate ``traces/`` with::

    python -m ep.traces [OUT_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npu_sim.config import DeviceConfig
from npu_sim.trace import Trace, export, load, save

from .framework.options import SessionOptions
from .framework.session import InferenceSession
from .models import sample_input, tiny_cnn
from .models_decoder import DecoderSpec, prefill


def mlp(batch: int = 32, widths: Sequence[int] = (512, 1024, 1024, 10),
        seed: int = 0) -> onnx.ModelProto:
    """A multilayer perceptron: Gemm + Relu layers (no Relu after the last), float32."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:], strict=False)):
        inits += [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) * 0.05)
                                          .astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}")]
        y = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], name=f"fc{i}"))
        x = y
        if i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                     [batch, widths[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, widths[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def transformer_block() -> onnx.ModelProto:
    """One pre-norm attention + MLP block of the bundled decoder, prefilling 64 tokens."""
    return prefill(DecoderSpec(layers=1, dim=128, heads=2, prompt=64, cache=64))


SAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "tiny_cnn": tiny_cnn,
    "transformer_block": transformer_block,
    "mlp": mlp,
}
"""The models of the sample traces: a CNN, a transformer block and an MLP."""

CONFIG_CHANGES: dict[str, dict[str, float | int]] = {
    "hbm x2": dict(hbm_gbps=920.0),
    "hbm /4": dict(hbm_gbps=115.0),
    "link x2": dict(host_link_gbps=50.0),
    "link /4": dict(host_link_gbps=6.25),
    "dma 1 channel": dict(dma_channels=1),
    "dma 8 channels": dict(dma_channels=8),
    "clock 2 GHz": dict(clock_ghz=2.0),
    "array 32x32": dict(array_rows=32, array_cols=32),
    "array 128x128": dict(array_rows=128, array_cols=128),
    "cores 2": dict(cores=2),
    "cores 8": dict(cores=8),
    "chunk 64 KiB": dict(dma_chunk_bytes=64 << 10),
}
"""The config changes elastic replay is checked against re-simulation under (in
``tests/trace/test_replay.py`` and ``bench/bench_replay.py``): bandwidths, channels, clock,
array, cores and chunk size, each on the npu-m preset."""


def _session(model: onnx.ModelProto, config: DeviceConfig, options: SessionOptions | None,
             folder: str) -> InferenceSession:
    path = os.path.join(folder, "device.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f)
    return InferenceSession(model.SerializeToString(), options,
                            providers=[("NpuSimExecutionProvider",
                                        {"device": path, "functional": "0"})],
                            enable_fallback=0)


def compiler_split(config: DeviceConfig, op: str, in_specs: list, out_specs: list,
                   attrs: dict) -> int:
    """The compiler's core split of one launch under ``config``: the ``split`` rule for
    :func:`npu_sim.trace.retime.replay` when the core count or the array changes."""
    from .npusim.compiler.tiling import plan_launch

    return plan_launch(config, op, in_specs, out_specs, attrs).cores


def record(model: onnx.ModelProto, config: DeviceConfig, runs: int = 1) -> Trace:
    """The trace of ``runs`` timing-only runs of ``model`` on ``config``."""
    with tempfile.TemporaryDirectory() as folder:
        options = SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "profile")
        session = _session(model, config, options, folder)
        feeds = sample_input(model, 0)
        for _ in range(runs):
            session.run(None, feeds)
        profile = session.end_profiling()
        return load(profile[:-len(".json")] + ".trace.jsonl")


def simulate(model: onnx.ModelProto, config: DeviceConfig, runs: int = 1) -> int:
    """Simulated cycles of ``runs`` timing-only runs of ``model`` compiled for ``config``, added
    up (the first run also waits for the weights still streaming in)."""
    with tempfile.TemporaryDirectory() as folder:
        session = _session(model, config, None, folder)
        feeds = sample_input(model, 0)
        total = 0
        for _ in range(runs):
            session.run(None, feeds)
            total += int(session.get_run_stats()["NpuSimExecutionProvider"]["cycles"])
        return total


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the sample traces (and their Perfetto exports) into ``OUT_DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m ep.traces",
        description="Regenerate the sample traces and their Perfetto exports.")
    parser.add_argument("out_dir", nargs="?", default="traces", metavar="OUT_DIR",
                        help="folder to write into (default: traces)")
    out = Path(parser.parse_args(argv).out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = DeviceConfig.preset("npu-m")
    for name, build in SAMPLES.items():
        trace = record(build(), config)
        save(trace, out / f"{name}.trace.jsonl")
        export(trace, "perfetto", out / f"{name}.perfetto.json")
        print(f"{name}: {len(trace.records)} records, makespan {trace.makespan} cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
