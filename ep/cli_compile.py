"""``npu-sim compile``: ahead-of-time compilation of a model to an EPContext model.

Runs :class:`ep.ModelCompiler` with the NPU provider (then the CPU provider for what it declines)
as ``docs/epcontext.md`` describes, and prints every file it wrote with its size, how many of the
model's nodes went to the NPU, and the external weight files if ``--external-weights`` put the
weights beside the context binary.

``--share MODEL ...`` compiles several models into one shared context (``ep.share_ep_contexts``,
the last with ``ep.stop_share_ep_contexts``): one ``<model>_ctx.onnx`` per model and one context
binary, ``<first model>_npusim.bin``, holding every model's graphs with each distinct weight
stored once. The files of a group live in one folder: ``-o`` is then that folder (default: the
first model's). If one model fails, the files of the group written so far are removed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TextIO

from ep import cli_errors, cli_progress
from ep.cli_dims import add_dim_option, fix_dims
from ep.npusim.external_weights import LOCK

NPU = "NpuSimExecutionProvider"


def add_compile(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim compile``."""
    p = commands.add_parser(
        "compile", help="compile a model to <model>_ctx.onnx and its context binary",
        description="Compile MODEL ahead of time for the simulated NPU (ep.ModelCompiler): "
                    "writes an EPContext model and the context binary it refers to. The graph "
                    "is compiled after the basic rewrites a session applies (constant folding), "
                    "so it partitions as `npu-sim run` does. With --share, several models "
                    "share one context binary (weights stored once).")
    p.add_argument("model", help="path of an .onnx model")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="path of the EPContext model (default: MODEL with .onnx -> _ctx.onnx); "
                        "with --share, the folder of every _ctx.onnx and the binary")
    p.add_argument("--share", nargs="+", action="extend", default=[], metavar="MODEL",
                   help="more models compiled into the same context binary as MODEL "
                        "(ep.share_ep_contexts)")
    p.add_argument("--embed", action="store_true",
                   help="embed the context binary in the model (ep.context_embed_mode=1)")
    p.add_argument("--prefix", default=None, metavar="P",
                   help="prefix of the EPContext node names (ep.context_node_name_prefix)")
    p.add_argument("--external-weights", choices=("0", "1", "2"), default="0",
                   help="0: weights in the binary; 1: one file per weight; 2: one combined file")
    p.add_argument("--device", default="npu-m",
                   help="device preset (npu-s, npu-m, npu-l, os32) or a JSON/TOML config path")
    p.add_argument("--cpu-nodes", default=None, metavar="NAMES",
                   help="comma-separated node names or op types to keep on the CPU "
                        "(provider option cpu_nodes)")
    add_dim_option(p)
    p.set_defaults(handler=compile_model, parser=p)


def compile_model(args: argparse.Namespace, out: TextIO) -> int:
    """Handler of ``npu-sim compile``: compile, then print what was written."""
    models = [args.model, *args.share]
    outputs = _outputs(args, models)
    before = _listing({o.parent for o in outputs})
    try:
        for k, (model, output) in enumerate(zip(models, outputs, strict=True)):
            _compile_one(args, model, output, out, shared=bool(args.share),
                         last=k == len(models) - 1)
    except BaseException:
        if args.share:
            _abandon_group(outputs, before)
        raise
    after = _listing({o.parent for o in outputs})
    for path in sorted(p for p, stamp in after.items() if before.get(p) != stamp):
        kind = " (external weights)" if path.parent not in {o.parent for o in outputs} else ""
        print(f"  wrote {path} ({path.stat().st_size:,} bytes){kind}", file=out)
    return 0


def _outputs(args: argparse.Namespace, models: list[str]) -> list[Path]:
    """The ``_ctx.onnx`` of each model; usage errors (exit status 2) for what cannot combine."""
    if not args.share:
        return [Path(args.output or _default_output(args.model))]
    parser: argparse.ArgumentParser = args.parser
    if args.embed:
        parser.error("--embed cannot be combined with --share: a group shares one binary file")
    if args.prefix:
        parser.error("--prefix names the nodes of one model; with --share each model's name "
                     "prefixes its own nodes")
    folder = Path(args.output) if args.output else Path(args.model).parent
    outputs = [folder / Path(_default_output(m)).name for m in models]
    seen: dict[Path, str] = {}
    for model, output in zip(models, outputs, strict=True):
        if output in seen:
            parser.error(f"{seen[output]} and {model} would both write {output}; rename one")
        seen[output] = model
    return outputs


def _compile_one(args: argparse.Namespace, model: str, output: Path, out: TextIO, *,
                 shared: bool, last: bool) -> None:
    import onnx

    import ep

    source = cli_errors.load_model(model)
    so = ep.SessionOptions()
    options = {"device": args.device, "external_weights": args.external_weights}
    if args.cpu_nodes:
        options["cpu_nodes"] = args.cpu_nodes
    so.add_provider(NPU, options)
    fix_dims(so, args.dim)
    if args.prefix:
        so.add_session_config_entry("ep.context_node_name_prefix", args.prefix)
    if shared:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        if last:
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    with cli_progress.phase(f"compiling {model} for {args.device}"):
        # onnxruntime's ModelCompiler optimizes nothing by default; the command compiles what
        # a session (and `npu-sim run`) would run: the graph after the basic rewrites.
        ep.ModelCompiler(so, model, embed_compiled_data_into_model=args.embed,
                         graph_optimization_level=ep.GraphOptimizationLevel.ORT_ENABLE_ALL,
                         ).compile_to_file(str(output))
    compiled = onnx.load(str(output), load_external_data=False)
    contexts = [n for n in compiled.graph.node if n.op_type == "EPContext"]
    on_cpu = len(compiled.graph.node) - len(contexts)
    print(f"compiled {model} ({len(source.graph.node)} nodes) for {args.device}: "
          f"{len(contexts)} EPContext node(s) run on the NPU, {on_cpu} node(s) stay on the CPU",
          file=out)


def _abandon_group(outputs: list[Path], before: dict[Path, tuple[int, int]]) -> None:
    """A model of a group failed: drop the group and the files it wrote so far."""
    from ep.npusim.shared import workspace

    workspace().reset()
    for path, stamp in _listing({o.parent for o in outputs}).items():
        if before.get(path) != stamp:
            path.unlink(missing_ok=True)


def _default_output(model: str) -> str:
    stem = model[:-len(".onnx")] if model.endswith(".onnx") else model
    return f"{stem}_ctx.onnx"


def _listing(folders: set[Path]) -> dict[Path, tuple[int, int]]:
    """Every file under ``folders`` with its (size, mtime in ns), to tell which ones changed."""
    found = {}
    for folder in folders:
        for root, _, files in os.walk(folder):
            for name in files:
                if name == LOCK:  # the external weights folder's lock, not an output
                    continue
                path = Path(root) / name
                stat = path.stat()
                found[path] = (stat.st_size, stat.st_mtime_ns)
    return found
