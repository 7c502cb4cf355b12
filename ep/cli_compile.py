"""``npu-sim compile``: ahead-of-time compilation of a model to an EPContext model.

Runs :class:`ep.ModelCompiler` with the NPU provider (then the CPU provider for what it declines)
as ``docs/epcontext.md`` describes, and prints every file it wrote with its size, how many of the
model's nodes went to the NPU, and the external weight files if ``--external-weights`` put the
weights beside the context binary.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TextIO

from ep.npusim.external_weights import LOCK

NPU = "NpuSimExecutionProvider"


def add_compile(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim compile``."""
    p = commands.add_parser(
        "compile", help="compile a model to <model>_ctx.onnx and its context binary",
        description="Compile MODEL ahead of time for the simulated NPU (ep.ModelCompiler): "
                    "writes an EPContext model and the context binary it refers to.")
    p.add_argument("model", help="path of an .onnx model")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="path of the EPContext model (default: MODEL with .onnx -> _ctx.onnx)")
    p.add_argument("--embed", action="store_true",
                   help="embed the context binary in the model (ep.context_embed_mode=1)")
    p.add_argument("--prefix", default=None, metavar="P",
                   help="prefix of the EPContext node names (ep.context_node_name_prefix)")
    p.add_argument("--external-weights", choices=("0", "1", "2"), default="0",
                   help="0: weights in the binary; 1: one file per weight; 2: one combined file")
    p.add_argument("--device", default="npu-m",
                   help="device preset (npu-s, npu-m, npu-l, os32) or a JSON/TOML config path")
    p.set_defaults(handler=compile_model)


def compile_model(args: argparse.Namespace, out: TextIO) -> int:
    """Handler of ``npu-sim compile``: compile, then print what was written."""
    import onnx

    import ep
    from ep.framework.pipeline import load_model

    source = load_model(args.model, {})[0]
    output = Path(args.output or _default_output(args.model))
    so = ep.SessionOptions()
    so.add_provider(NPU, {"device": args.device, "external_weights": args.external_weights})
    if args.prefix:
        so.add_session_config_entry("ep.context_node_name_prefix", args.prefix)
    before = _listing(output.parent)
    ep.ModelCompiler(so, args.model, embed_compiled_data_into_model=args.embed
                     ).compile_to_file(str(output))
    written = sorted(p for p, stamp in _listing(output.parent).items() if before.get(p) != stamp)
    compiled = onnx.load(str(output), load_external_data=False)
    contexts = [n for n in compiled.graph.node if n.op_type == "EPContext"]
    on_cpu = len(compiled.graph.node) - len(contexts)
    print(f"compiled {args.model} ({len(source.graph.node)} nodes) for {args.device}: "
          f"{len(contexts)} EPContext node(s) run on the NPU, {on_cpu} node(s) stay on the CPU",
          file=out)
    for path in written:
        kind = " (external weights)" if path.parent != output.parent else ""
        print(f"  wrote {path} ({path.stat().st_size:,} bytes){kind}", file=out)
    return 0


def _default_output(model: str) -> str:
    stem = model[:-len(".onnx")] if model.endswith(".onnx") else model
    return f"{stem}_ctx.onnx"


def _listing(folder: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``folder`` with its (size, mtime in ns), to tell which ones changed."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name == LOCK:  # the external weights folder's lock, not an output
                continue
            path = Path(root) / name
            stat = path.stat()
            found[path] = (stat.st_size, stat.st_mtime_ns)
    return found
