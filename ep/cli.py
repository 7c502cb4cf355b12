"""The ``npu-sim`` command line.

One program with subcommands, each registered by a small ``_add_<name>`` function that adds its
parser and sets ``handler``; :func:`main` parses and dispatches. Subcommands:

- ``npu-sim run [MODEL]``: the main job. Run a model (default: the bundled ``tiny_cnn``) through
  ``ep.InferenceSession`` on the simulated NPU with CPU fallback, check its outputs against
  onnxruntime's CPU provider, and print the partitioning, the simulated latency and the
  per-engine utilization. Exits with status 1 if the outputs do not match.
- ``npu-sim inspect FILE``: print everything a context binary holds (header, section table,
  every graph with its tensors, launches and decoded commands, and how the weights blob is
  shared). A file that does not load prints the :class:`ep.errors.InvalidGraph` message to stderr
  and exits with status 1.
- ``npu-sim export | replay | report | diff | sweep``: traces (:mod:`ep.cli_trace`); ``run
  --trace FILE`` records one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from ep import cli_trace
from ep.errors import OrtError
from ep.npusim.binary import ContextBinary, SectionEntry, SectionKind
from firmware_model import commands as fc
from firmware_model.program import AttrValue, Program, Region
from npu_sim.errors import InvalidCommand, NpuSimError

Handler = Callable[[argparse.Namespace, TextIO], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args, sys.stdout)
    except (OrtError, NpuSimError, OSError) as exc:
        # A model or file error: one line, no traceback (unless --debug), exit status 1.
        if args.debug:
            raise
        message = exc.message if isinstance(exc, OrtError) else \
            f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename \
            else str(exc)
        print(f"npu-sim {args.command}: {message}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="npu-sim", description="Tools for the simulated NPU and its execution provider.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run(commands)
    _add_inspect(commands)
    cli_trace.add_export(commands)
    cli_trace.add_replay(commands)
    cli_trace.add_report(commands)
    cli_trace.add_diff(commands)
    cli_trace.add_sweep(commands)
    return parser


# -- run --------------------------------------------------------------------------------------


def _add_run(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "run", help="run a model on the simulated NPU and check it against onnxruntime",
        description="Run MODEL (default: the bundled tiny_cnn, built in code) with "
                    "NpuSimExecutionProvider and CPU fallback on random inputs, compare the "
                    "outputs with onnxruntime's CPU provider, and report the simulated run.")
    p.add_argument("model", nargs="?", default=None, help="path of an .onnx model")
    p.add_argument("--device", default="npu-m",
                   help="device preset (npu-s, npu-m, npu-l, os32) or a JSON/TOML config path")
    p.add_argument("--timing-only", action="store_true",
                   help="simulate timing only: no values computed, no comparison")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="record the run's replayable trace to FILE (.trace.jsonl); the ONNX "
                        "Runtime profile is written beside it")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    import numpy as np
    import onnxruntime as ort

    from ep import InferenceSession
    from ep.framework.pipeline import load_model
    from ep.models import DEFAULT_MODEL_NAME, sample_input, tiny_cnn

    if args.model is None:
        model, label = tiny_cnn(), f"{DEFAULT_MODEL_NAME} (bundled)"
        source: str | bytes = model.SerializeToString()
    else:
        model, label, source = load_model(args.model, {})[0], args.model, args.model
    options = {"device": args.device, "functional": "0" if args.timing_only else "1"}
    session = InferenceSession(source, cli_trace.profiling(args.trace),
                               providers=[("NpuSimExecutionProvider", options)])
    feeds = sample_input(model, args.seed)
    outputs = session.run(None, feeds)
    if args.trace:
        print(cli_trace.save_profile(session, args.trace), file=out)

    print(f"model: {label}", file=out)
    for part in session.get_partitions():
        nodes = part["nodes"]
        print(f"  {part['name']:<10} {part['provider']:<26} {len(nodes):>4} node(s)", file=out)
    for node, why in session.get_decline_reasons().items():
        reason = why.get("NpuSimExecutionProvider", "")
        print(f"  declined {node}: {reason[:100]}", file=out)
    for name, stats in session.get_run_stats().items():
        if not isinstance(stats, dict) or "cycles" not in stats:
            continue
        print(f"{name}: {stats['cycles']:,} cycles = {stats['microseconds']:.1f} us simulated "
              f"over {len(stats.get('partitions', {}))} partition(s)", file=out)
        busy = ", ".join(f"{engine} {100 * u:.0f}%" for engine, u in stats["utilization"].items())
        print(f"  utilization: {busy}", file=out)
        energy = stats.get("energy")
        if energy:
            print(f"  energy: {energy['total_pj'] / 1e6:,.2f} uJ (dynamic "
                  f"{energy['dynamic_pj'] / 1e6:,.2f}, leakage {energy['static_pj'] / 1e6:,.2f}), "
                  f"average {energy['average_power_w']:.2f} W, {energy['tops_per_w']:.3f} TOPS/W",
                  file=out)
        for part, figures in stats.get("partitions", {}).items():
            print(f"  {part}: {figures['cycles']:,} cycles = {figures['microseconds']:.1f} us",
                  file=out)
    if args.timing_only:
        return 0

    reference = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)
    ok = True
    for arg, got, want in zip(session.get_outputs(), outputs, reference, strict=True):
        match = got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-5)
        diff = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
        print(f"output {arg.name}: {got.dtype}{list(got.shape)} max |diff| vs onnxruntime "
              f"{diff:.2e} {'OK' if match else 'MISMATCH'}", file=out)
        ok &= match
    return 0 if ok else 1


# -- inspect ----------------------------------------------------------------------------------


def _add_inspect(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "inspect", help="print the contents of a context binary",
        description="Validate a context binary and print its header, sections, graphs "
                    "(tensors, launches, commands) and weights.")
    p.add_argument("file", help="path of the context binary (e.g. model_npusim.bin)")
    p.add_argument("--expect-architecture", default=None, metavar="NAME",
                   help="fail unless the binary was compiled for this hardware architecture")
    p.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    with ContextBinary.open(args.file, expected_architecture=args.expect_architecture) as binary:
        _print_header(binary, args.file, out)
        for program in binary.programs():
            _print_program(program, out)
        _print_weights(binary, out)
    return 0


def _print_header(binary: ContextBinary, path: str, out: TextIO) -> None:
    h = binary.header
    rows = [
        ("magic", h.magic.decode("ascii")),
        ("format version", f"{h.format_version[0]}.{h.format_version[1]}"),
        ("sdk version", h.sdk_version),
        ("architecture", h.hardware_architecture),
        ("config digest", h.config_digest or "(none)"),
        ("file size", f"{h.file_size:,} bytes"),
        ("header", f"{h.header_size} bytes, crc32 0x{h.header_crc32:08x} ok"),
        ("section table", f"at {h.section_table_offset}, {h.section_count} entries, "
                          f"crc32 0x{h.section_table_crc32:08x} ok"),
    ]
    print(f"context binary {path}", file=out)
    for key, value in rows:
        print(f"  {key:<15} {value}", file=out)
    print(f"\nsections ({len(binary.sections)})", file=out)
    _table([(str(i), s.kind_name, str(s.offset), f"{s.length:,}", _section_crc(s), "ok")
            for i, s in enumerate(binary.sections)],
           ("#", "kind", "offset", "length", "crc32", "checksum"), out)
    print(f"\ngraphs ({len(binary.graph_names())}): {', '.join(binary.graph_names())}", file=out)


def _section_crc(section: SectionEntry) -> str:
    # The weights are checked per block (their table is the WEIGHT_CHECKSUMS section), so
    # their own entry's crc32 field is unused.
    if section.kind == SectionKind.WEIGHTS:
        return "per block"
    return f"0x{section.crc32:08x}"


def _shape(program: Program, index: int) -> str:
    t = program.tensors[index]
    return f"{t.name} {t.dtype}[{', '.join(map(str, t.shape))}]"


def _attr(value: AttrValue) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _print_program(program: Program, out: TextIO) -> None:
    weights_bytes = sum(len(w) for w in program.weights.values())
    print(f"\ngraph {program.name!r}", file=out)
    print(f"  architecture  {program.hardware_architecture or '(none)'}", file=out)
    print(f"  inputs        {'; '.join(_shape(program, i) for i in program.inputs)}", file=out)
    print(f"  outputs       {'; '.join(_shape(program, i) for i in program.outputs)}", file=out)
    print(f"  arena         {program.arena_bytes:,} bytes", file=out)
    print(f"  weights       {len(program.weights)} tensors, {weights_bytes:,} bytes "
          f"(region {program.weights_bytes:,} bytes)", file=out)
    print(f"  tensors ({len(program.tensors)})", file=out)
    _table([(str(i), t.name, t.dtype, str(list(t.shape)), Region(t.region).name.lower(),
             f"{t.offset:#x}", f"{len(program.weights[i]):,} B" if i in program.weights else "")
            for i, t in enumerate(program.tensors)],
           ("#", "name", "dtype", "shape", "region", "offset", "weight"), out, indent=4)
    print(f"  launches ({len(program.launches)})", file=out)
    for i, k in enumerate(program.launches):
        attrs = " ".join(f"{name}={_attr(v)}" for name, v in k.attrs.items())
        print(f"    {i}: {k.op} node={k.node!r} inputs={list(k.inputs)} "
              f"outputs={list(k.outputs)}{' ' + attrs if attrs else ''}", file=out)
    _print_commands(program.commands, out)


def _print_commands(stream: bytes, out: TextIO) -> None:
    whole = len(stream) // fc.COMMAND_BYTES
    print(f"  commands ({whole} x {fc.COMMAND_BYTES} B)", file=out)
    for offset in range(0, whole * fc.COMMAND_BYTES, fc.COMMAND_BYTES):
        try:
            line = fc.describe(fc.decode(stream, offset))
        except InvalidCommand as exc:
            line = f"undecodable: {exc.message}"
        print(f"    @{offset:<6} {line}", file=out)
    if len(stream) % fc.COMMAND_BYTES:
        print(f"    {len(stream) % fc.COMMAND_BYTES} trailing bytes do not form a descriptor",
              file=out)


def _print_weights(binary: ContextBinary, out: TextIO) -> None:
    w = binary.weights_summary
    saved = w.referenced_bytes - w.distinct_bytes
    print("\nweights blob", file=out)
    print(f"  distinct blobs    {w.blobs} ({w.references} references)", file=out)
    print(f"  total bytes       {w.referenced_bytes:,} (sum over graphs)", file=out)
    print(f"  deduplicated      {w.distinct_bytes:,} (saved {saved:,})", file=out)
    print(f"  section bytes     {w.section_bytes:,} (with 512-byte alignment)", file=out)


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...], out: TextIO,
           indent: int = 2) -> None:
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows, strict=True)]
    for row in (head, *rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(" " * indent + "  ".join(cells).rstrip(), file=out)


if __name__ == "__main__":
    sys.exit(main())
