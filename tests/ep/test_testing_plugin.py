"""The pytest plugin, as an installed package's user gets it: registered through ``pytest11``,
options and fixtures work in a project of its own (a fresh pytest run in a temporary folder)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

USER_TESTS = '''
from hypothesis import settings

def test_profile_and_device(npu_device, npu_device_name, npu_session):
    print("PROFILE", settings().max_examples, settings().derandomize)
    print("DEVICE", npu_device_name, npu_device.config.name)
'''


def test_registered_through_the_pytest11_entry_point():
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins.get("npu_sim") == "ep.testing.pytest_plugin"


def _pytest(folder, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                             *args], cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_options_pick_the_devices_and_the_hypothesis_profile(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    out = _pytest(tmp_path, "--npu-device", "npu-s", "--npu-device", "os32",
                  "--npu-hypothesis-profile", "ci")
    assert "2 passed" in out
    assert "DEVICE npu-s npu-s" in out and "DEVICE os32 os32" in out
    assert "PROFILE 50 True" in out
    out = _pytest(tmp_path, "--npu-hypothesis-profile", "long")
    assert "PROFILE 1000 False" in out and "DEVICE npu-m npu-m" in out
    # Without the option the plugin leaves hypothesis's active profile alone.
    out = _pytest(tmp_path)
    assert "PROFILE 100 " in out
