"""The one line ``npu-sim`` prints for a model or file error, and what to do next.

:func:`message` turns an error into the line after ``npu-sim <command>:``; :func:`next_step`
adds the fix when the error says which one applies: a model that does not fit in the device's
HBM names the presets with more HBM (and ``--cpu-nodes`` to keep part of it on the CPU); a
node the NPU cannot compile or run is named with the ``--cpu-nodes`` (provider option
``cpu_nodes``) that moves it to the CPU provider.
"""

from __future__ import annotations

import argparse
import re

import onnx

from ep.errors import InvalidProtobuf, OrtError
from npu_sim.config import PRESETS, DeviceConfig
from npu_sim.errors import NpuSimError, format_bytes

# KernelError's "Conv (node 'conv1')" and the compiler's partition failure.
_NODE = re.compile(r"(?P<op>[A-Za-z][\w.]*) \(node '(?P<node>[^']+)'\)")
_PARTITION = re.compile(r"cannot compile partition '(?P<part>[^']+)'")
_HBM = "npu.hbm: cannot allocate"


def load_model(path: str) -> onnx.ModelProto:
    """The model at ``path`` (external data loaded); an unparsable file is InvalidProtobuf
    naming it."""
    from ep.framework.pipeline import load_model as load

    try:
        return load(path, {})[0]
    except InvalidProtobuf as exc:
        raise InvalidProtobuf(f"{path}: not an ONNX model ({exc.message})") from None


def message(exc: BaseException) -> str:
    """The error's own one-line message (an OSError as ``path: reason``)."""
    if isinstance(exc, OrtError):
        text = exc.message
    elif isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc)
    return " ".join(text.split())  # one line, whatever the error held


def next_step(exc: BaseException, args: argparse.Namespace) -> str | None:
    """What to try next for this error, or None when the message says it all."""
    text = message(exc)
    takes_cpu_nodes = hasattr(args, "cpu_nodes")
    if _HBM in text:
        return _bigger_devices(getattr(args, "device", None), takes_cpu_nodes)
    node = _NODE.search(text)
    if node and takes_cpu_nodes:
        return (f"to run the rest of the model, keep node {node['node']!r} on the CPU: "
                f"--cpu-nodes '{node['node']}' (or every {node['op']}: --cpu-nodes "
                f"{node['op']})")
    part = _PARTITION.search(text)
    if part and takes_cpu_nodes:
        return (f"rerun with --debug for the failing operator of {part['part']}, then keep it "
                "on the CPU with --cpu-nodes NODE_OR_OP")
    return None


def _bigger_devices(device: str | None, takes_cpu_nodes: bool) -> str:
    current = _config(device)
    cpu = "; or keep the largest nodes on the CPU with --cpu-nodes NODE_OR_OP" \
        if takes_cpu_nodes else ""
    if current is None:
        return f"pick a device with more HBM (npu-sim devices lists them){cpu}"
    bigger = sorted((DeviceConfig.preset(n) for n in PRESETS
                     if DeviceConfig.preset(n).hbm_bytes > current.hbm_bytes),
                    key=lambda c: c.hbm_bytes)
    name = current.name if device in (None, current.name) else f"{device} ({current.name})"
    have = f"the device {name} has {format_bytes(current.hbm_bytes)} of HBM"
    if not bigger:
        return f"{have}, the most of any preset: use a config file with a larger hbm_bytes{cpu}"
    choices = ", ".join(f"--device {c.name} ({format_bytes(c.hbm_bytes)})" for c in bigger)
    return f"{have}: pick a device with more, {choices}{cpu}"


def _config(device: str | None) -> DeviceConfig | None:
    try:
        return DeviceConfig.named(device or "npu-m")
    except NpuSimError:
        return None
