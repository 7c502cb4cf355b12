"""The ``npu-sim`` command line.

One program with subcommands, each registered by a small ``_add_<name>`` function that adds its
parser and sets ``handler``; :func:`main` parses and dispatches. Subcommands:

- ``npu-sim run [MODEL]``: the main job (:mod:`ep.cli_run`). Run a model (default: the bundled
  ``tiny_cnn``) on the simulated NPU with CPU fallback and print the partitioning, the simulated
  latency, throughput and per-engine utilization; ``--check`` compares with onnxruntime CPU
  (always done for the bundled model) and exits with status 1 on a mismatch.
- ``npu-sim compile MODEL``: an EPContext model and its context binary (:mod:`ep.cli_compile`).
- ``npu-sim devices``: every device preset with its key figures.
- ``npu-sim inspect FILE``: print everything a context binary holds (header, section table,
  every graph with its tensors, launches and decoded commands, and how the weights blob is
  shared). A file that does not load prints the :class:`ep.errors.InvalidGraph` message to stderr
  and exits with status 1.
- ``npu-sim export | replay | report | diff | sweep``: traces (:mod:`ep.cli_trace`); ``run
  --trace FILE`` records one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from ep import cli_compile, cli_run, cli_trace
from ep.errors import OrtError
from ep.npusim.binary import ContextBinary, SectionEntry, SectionKind
from firmware_model import commands as fc
from firmware_model.program import AttrValue, Program, Region
from npu_sim.config import MAC_DTYPES, PRESETS, DeviceConfig
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
    cli_run.add_run(commands)
    cli_compile.add_compile(commands)
    _add_devices(commands)
    _add_inspect(commands)
    cli_trace.add_export(commands)
    cli_trace.add_replay(commands)
    cli_trace.add_report(commands)
    cli_trace.add_diff(commands)
    cli_trace.add_sweep(commands)
    return parser


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


# -- devices ----------------------------------------------------------------------------------


def _add_devices(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("devices", help="list every device preset with its key figures",
                            description="Print every DeviceConfig preset: cores, array, "
                                        "dataflow, clock, peak TOPS per dtype, memory and links.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_devices)


def device_figures(config: DeviceConfig) -> dict[str, object]:
    """The key figures of ``config``, as ``npu-sim devices`` prints them."""
    return {
        "cores": config.cores,
        "array": f"{config.array_rows}x{config.array_cols}",
        "dataflow": config.dataflow,
        "clock_ghz": config.clock_ghz,
        "peak_tops": {dtype: round(config.peak_tops(dtype), 3) for dtype in MAC_DTYPES},
        "hbm_gib": config.hbm_bytes / 2**30,
        "hbm_gbps": config.hbm_gbps,
        "host_link_gbps": config.host_link_gbps,
        "dma_channels": config.dma_channels,
        "sram_mib_per_core": config.sram_bytes_per_core / 2**20,
    }


def _devices(args: argparse.Namespace, out: TextIO) -> int:
    figures = {name: device_figures(DeviceConfig.preset(name)) for name in PRESETS}
    if args.json:
        print(json.dumps(figures), file=out)
        return 0
    head = ("preset", "cores", "array", "dataflow", "GHz", "peak TOPS",
            "HBM", "host link", "DMA", "SRAM/core")
    rows = [(name, str(f["cores"]), f["array"], f["dataflow"], f"{f['clock_ghz']:g}",
             " ".join(f"{d} {t:g}" for d, t in f["peak_tops"].items()),
             f"{f['hbm_gib']:g} GiB @ {f['hbm_gbps']:g} GB/s", f"{f['host_link_gbps']:g} GB/s",
             str(f["dma_channels"]), f"{f['sram_mib_per_core']:g} MiB")
            for name, f in figures.items()]
    _table(rows, head, out, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
