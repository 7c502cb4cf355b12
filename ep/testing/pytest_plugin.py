"""The npu-sim pytest plugin, active in every pytest run once ``npu-sim`` is installed.

Registered through the ``pytest11`` entry point (``pyproject.toml``). It adds:

- ``--npu-device PRESET`` (repeatable; a preset name or a ``.json``/``.toml`` device config,
  default ``npu-m``): tests using the fixtures below run once per device given;
- ``--npu-hypothesis-profile {ci,dev,long}``: load one of the plugin's hypothesis profiles
  (registered as ``npu-sim-ci``, ``npu-sim-dev``, ``npu-sim-long``, so a project's own
  ``ci``/``dev`` profiles are never replaced); without the option the plugin leaves the active
  profile alone;
- fixtures ``npu_device`` (a fresh :class:`npu_sim.Device`), ``npu_session`` (a factory making
  ``ep.InferenceSession``\\ s bound to the device's config) and ``assert_matches_onnxruntime``
  (:func:`ep.testing.assert_matches_onnxruntime` with the NPU on that device first).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

PROFILES = {
    "ci": dict(derandomize=True, deadline=None, max_examples=50, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow]),
    "dev": dict(derandomize=False, deadline=None, max_examples=50),
    "long": dict(derandomize=False, deadline=None, max_examples=1000,
                 suppress_health_check=[HealthCheck.too_slow]),
}
"""The plugin's hypothesis profiles (registered with the prefix ``npu-sim-``)."""
DEFAULT_DEVICE = "npu-m"

for _name, _values in PROFILES.items():
    settings.register_profile(f"npu-sim-{_name}", **_values)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--npu-device`` and ``--npu-hypothesis-profile``."""
    group = parser.getgroup("npu-sim", "npu-sim simulated NPU")
    group.addoption("--npu-device", action="append", default=None, metavar="PRESET",
                    help="device preset name or .json/.toml config for the npu_* fixtures "
                         f"(repeatable; default {DEFAULT_DEVICE})")
    group.addoption("--npu-hypothesis-profile", choices=sorted(PROFILES), default=None,
                    help="load the hypothesis profile npu-sim-<name>: ci (derandomized, 50 "
                         "examples), dev (50 random examples), long (1000 examples)")


def pytest_configure(config: pytest.Config) -> None:
    """Load the chosen hypothesis profile (after conftest files, so the option wins)."""
    profile = config.getoption("--npu-hypothesis-profile", default=None)
    if profile:
        settings.load_profile(f"npu-sim-{profile}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One run per ``--npu-device`` for tests that use the npu_* fixtures."""
    if "npu_device_name" in metafunc.fixturenames:
        devices = metafunc.config.getoption("--npu-device", default=None) or [DEFAULT_DEVICE]
        metafunc.parametrize("npu_device_name", devices, scope="session")


@pytest.fixture(scope="session")
def npu_device_name(request: pytest.FixtureRequest) -> str:
    """The ``--npu-device`` value of this run (a preset name or a config path)."""
    return request.param


@pytest.fixture(scope="session")
def npu_device_config(npu_device_name: str) -> Any:
    """The :class:`npu_sim.DeviceConfig` of ``npu_device_name``."""
    from npu_sim import DeviceConfig

    return DeviceConfig.named(npu_device_name)


@pytest.fixture
def npu_device(npu_device_config: Any) -> Iterator[Any]:
    """A fresh :class:`npu_sim.Device` on the configured device, one per test."""
    from npu_sim import Device

    yield Device(npu_device_config)


def _providers(device: str) -> list[Any]:
    return [("NpuSimExecutionProvider", {"device": device}), "CPUExecutionProvider"]


@pytest.fixture
def npu_session(npu_device_name: str) -> Callable[..., Any]:
    """``npu_session(model, sess_options=None, **provider_options)``: an
    ``ep.InferenceSession`` with the NPU (on the configured device) first, then the CPU."""
    import ep

    def make(model: Any, sess_options: Any = None, **provider_options: str) -> Any:
        options = {"device": npu_device_name, **provider_options}
        return ep.InferenceSession(model, sess_options, providers=[
            ("NpuSimExecutionProvider", options), "CPUExecutionProvider"],
            enable_fallback=0)  # a fault of the NPU fails the test, not re-run on the CPU

    return make


@pytest.fixture(name="assert_matches_onnxruntime")
def assert_matches_onnxruntime_fixture(npu_device_name: str) -> Callable[..., Any]:
    """:func:`ep.testing.assert_matches_onnxruntime` with the NPU on the configured device
    first (pass ``providers=`` to choose others)."""
    from ep.testing import assert_matches_onnxruntime

    return functools.partial(assert_matches_onnxruntime, providers=_providers(npu_device_name))
