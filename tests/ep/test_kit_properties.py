"""Property tests of the EP built on the testing kit (``ep.testing``).

For any generated model (arbitrary, CNN-like, transformer-like; float32 and float16; NPU ops
plus CPU-only ops that force partition boundaries; quantize/dequantize pairs): NPU+CPU
execution matches onnxruntime CPU, with NaN and infinities in the inputs too and on any device
config; compiling, saving as an EPContext model (embed modes 0 and 1) and reloading gives
identical outputs; timing-only and functional runs take identical simulated cycles; a recorded
trace replays to its makespan, recorded and elastic under its own config. CI runs them
derandomized (tests/conftest.py).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ep
from ep.testing import assert_matches_onnxruntime
from ep.testing.strategies import device_configs, feeds, models, npu_ops
from npu_sim.trace import load as load_trace
from npu_sim.trace import replay

NPU = "NpuSimExecutionProvider"


# Max-type windows and reductions are left out with NaN/Inf inputs: onnxruntime's own result
# there depends on the NaN's position and the tensor's length (docs/conformance.md).
NONFINITE_SAFE = sorted(npu_ops() - {"MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"})


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_model_on_npu_and_cpu_matches_onnxruntime(data):
    model = data.draw(models(max_nodes=8, dtypes=("float32", "float16")), label="model")
    inputs = data.draw(feeds(model), label="feeds")
    assert assert_matches_onnxruntime(model, inputs) is not None


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_nan_and_inf_inputs_give_onnxruntimes_results(data):
    model = data.draw(models(ops=NONFINITE_SAFE, dtypes=("float32", "float16")), label="model")
    inputs = data.draw(feeds(model, nonfinite=True), label="feeds")
    assert assert_matches_onnxruntime(model, inputs) is not None


def _session(model: onnx.ModelProto | str, **config: str) -> ep.InferenceSession:
    options = ep.SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ep.InferenceSession(data, options, providers=[NPU, "CPUExecutionProvider"])


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)  # NaN equals NaN here; values bit for bit


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(["0", "1"]))
def test_epcontext_round_trip_gives_identical_outputs(data, embed_mode):
    model = data.draw(models(max_nodes=6), label="model")
    inputs = data.draw(feeds(model), label="feeds")
    with tempfile.TemporaryDirectory() as folder:
        ctx = str(Path(folder) / "model_ctx.onnx")
        first = _session(model, **{"ep.context_enable": "1", "ep.context_file_path": ctx,
                                   "ep.context_embed_mode": embed_mode})
        fresh = first.run(None, inputs)
        assume(NPU in first.get_node_assignment().values())  # else there is no context
        written = onnx.load(ctx)
        assert any(n.op_type == "EPContext" for n in written.graph.node)
        _same(_session(ctx).run(None, inputs), fresh)


def _cycles(model: onnx.ModelProto, inputs: dict, functional: str) -> int | None:
    session = ep.InferenceSession(model.SerializeToString(), providers=[
        (NPU, {"functional": functional}), "CPUExecutionProvider"])
    session.run(None, inputs)
    return session.get_run_stats().get(NPU, {}).get("cycles")


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_timing_only_and_functional_runs_take_the_same_cycles(data):
    model = data.draw(models(max_nodes=6, cpu_ops=()), label="model")
    inputs = data.draw(feeds(model), label="feeds")
    functional = _cycles(model, inputs, "1")
    assert functional is None or functional > 0
    assert _cycles(model, inputs, "0") == functional


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_any_device_config_gives_onnxruntimes_results(data):
    config = data.draw(device_configs(data.draw(st.sampled_from(["npu-s", "npu-m", "os32"]))),
                       label="config")
    model = data.draw(models(max_nodes=6), label="model")
    inputs = data.draw(feeds(model), label="feeds")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "device.json"
        path.write_text(json.dumps(config.to_dict()))
        providers = [(NPU, {"device": str(path)}), "CPUExecutionProvider"]
        assert assert_matches_onnxruntime(model, inputs, providers) is not None


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_a_recorded_trace_replays_to_its_makespan(data):
    model = data.draw(models(max_nodes=6), label="model")
    inputs = data.draw(feeds(model), label="feeds")
    with tempfile.TemporaryDirectory() as folder:
        options = ep.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "prof")
        session = ep.InferenceSession(model.SerializeToString(), options,
                                      providers=[NPU, "CPUExecutionProvider"])
        for _ in range(2):
            session.run(None, inputs)
        profile = session.end_profiling()
        trace_file = Path(profile[:-len(".json")] + ".trace.jsonl")
        assume(trace_file.exists())  # a model with nothing on the NPU records no device trace
        trace = load_trace(trace_file)
    assert replay(trace, mode="recorded").makespan == trace.makespan
    assert replay(trace, trace.config, "elastic").makespan == trace.makespan
