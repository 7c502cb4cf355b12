"""Fixtures for the trace tests: traces of the bundled sample models, recorded once."""

from __future__ import annotations

import pytest

from npu_sim.config import DeviceConfig


@pytest.fixture(scope="session")
def base_config() -> DeviceConfig:
    return DeviceConfig.preset("npu-m")


@pytest.fixture(scope="session")
def sample_traces(base_config):
    """name -> (model, trace of two timing-only runs on npu-m)."""
    from ep.traces import SAMPLES, record

    out = {}
    for name, build in SAMPLES.items():
        model = build()
        out[name] = (model, record(model, base_config, runs=2))
    return out


@pytest.fixture(scope="session")
def cnn_trace(sample_traces):
    return sample_traces["tiny_cnn"][1]
