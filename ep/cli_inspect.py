"""``npu-sim inspect FILE``: what a context binary or an EPContext model holds.

A context binary (``<model>_npusim.bin``) prints its header, section table, every graph with its
tensors, launches and decoded commands, and how the weights blob is shared. An EPContext model
(``<model>_ctx.onnx``) prints each EPContext node's attributes and then every context binary it
refers to (a file beside the model, or the bytes embedded in the node). Loading validates the
whole file: one that does not load prints the :class:`ep.errors.InvalidGraph` message and exits
with status 1. ``--json`` prints one object with the stable keys of :func:`binary_dict` and
:func:`model_dict`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from ep import cli_errors
from ep.errors import InvalidGraph
from ep.npusim.binary import ContextBinary, SectionEntry, SectionKind
from firmware_model import commands as fc
from firmware_model.program import AttrValue, Program, Region
from npu_sim.errors import InvalidCommand


def add_inspect(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim inspect``."""
    p = commands.add_parser(
        "inspect", help="print the contents of a context binary or an EPContext model",
        description="Validate a context binary (or an EPContext model and the binaries it "
                    "refers to) and print its header, sections, graphs (tensors, launches, "
                    "commands) and weights.")
    p.add_argument("file", help="a context binary (model_npusim.bin) or an EPContext model "
                                "(model_ctx.onnx)")
    p.add_argument("--expect-architecture", default=None, metavar="NAME",
                   help="fail unless the binary was compiled for this hardware architecture")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=inspect)


def inspect(args: argparse.Namespace, out: TextIO) -> int:
    """Handler of ``npu-sim inspect``."""
    if Path(args.file).suffix.lower() == ".onnx":
        return _inspect_model(args, out)
    try:
        binary = ContextBinary.open(args.file, expected_architecture=args.expect_architecture)
    except InvalidGraph as exc:
        if args.file in exc.message:
            raise
        raise InvalidGraph(f"{args.file}: {exc.message}") from None
    with binary:
        if args.json:
            print(json.dumps(binary_dict(binary, args.file)), file=out)
        else:
            _print_binary(binary, args.file, out)
    return 0


# -- EPContext models ----------------------------------------------------------------------------


def _context_nodes(path: str) -> tuple[list[Any], int]:
    """The model's EPContext nodes (parsed) and how many other nodes it has."""
    from ep.framework import epcontext as E

    model = cli_errors.load_model(path)
    nodes = [E.parse_ep_context_node(n) for n in model.graph.node if E.is_ep_context_node(n)]
    if not nodes:
        raise InvalidGraph(f"{path}: an ONNX model without EPContext nodes; compile it first "
                           "(npu-sim compile MODEL) and inspect the _ctx.onnx")
    return nodes, len(model.graph.node) - len(nodes)


def _binaries(path: str, nodes: list[Any]) -> list[tuple[str, bytes | Path]]:
    """``(label, source)`` of every distinct context binary the nodes refer to."""
    from ep.framework import epcontext as E

    found: dict[str, bytes | Path] = {}
    for node in nodes:
        if node.embed_mode == 1 and node.ep_cache_context:
            found[f"{path} (embedded in node {node.name!r})"] = node.ep_cache_context
        elif node.embed_mode == 0:
            file = E.resolve_context_file(node.ep_cache_context, Path(path).parent,
                                          node=node.name)
            found.setdefault(str(file), file)
    return list(found.items())


def _open(source: bytes | Path, expected: str | None) -> ContextBinary:
    if isinstance(source, Path):
        return ContextBinary.open(source, expected_architecture=expected)
    return ContextBinary.from_bytes(source, expected_architecture=expected)


def node_dict(node: Any) -> dict[str, Any]:
    """An EPContext node's attributes (keys: its ONNX attribute names, plus ``name``)."""
    cache = node.ep_cache_context
    return {"name": node.name, "partition_name": node.partition_name,
            "main_context": node.main_context, "embed_mode": node.embed_mode,
            "ep_cache_context": (f"<{len(cache)} embedded bytes>" if node.embed_mode == 1
                                 else cache.decode("utf-8", errors="replace")),
            "source": node.source, "ep_sdk_version": node.ep_sdk_version,
            "hardware_architecture": node.hardware_architecture,
            "onnx_model_filename": node.onnx_model_filename, "max_size": node.max_size,
            "notes": node.notes, "inputs": list(node.inputs), "outputs": list(node.outputs)}


def model_dict(path: str, nodes: list[Any], other: int,
               binaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON form of an EPContext model: ``file``, ``kind`` (``"epcontext_model"``),
    ``ep_context_nodes``, ``other_nodes`` (a count), ``binaries`` (each :func:`binary_dict`)."""
    return {"file": path, "kind": "epcontext_model",
            "ep_context_nodes": [node_dict(n) for n in nodes], "other_nodes": other,
            "binaries": binaries}


def _inspect_model(args: argparse.Namespace, out: TextIO) -> int:
    nodes, other = _context_nodes(args.file)
    sources = _binaries(args.file, nodes)
    if args.json:
        dicts = []
        for label, source in sources:
            with _open(source, args.expect_architecture) as binary:
                dicts.append(binary_dict(binary, label))
        print(json.dumps(model_dict(args.file, nodes, other, dicts)), file=out)
        return 0
    print(f"EPContext model {args.file}: {len(nodes)} EPContext node(s), {other} other node(s)",
          file=out)
    for node in nodes:
        attrs = node_dict(node)
        print(f"  {node.name}", file=out)
        for key in ("partition_name", "main_context", "embed_mode", "ep_cache_context",
                    "source", "ep_sdk_version", "hardware_architecture", "onnx_model_filename",
                    "max_size", "notes"):
            print(f"    {key:<22} {attrs[key]}", file=out)
    for label, source in sources:
        print(file=out)
        with _open(source, args.expect_architecture) as binary:
            _print_binary(binary, label, out)
    return 0


# -- context binaries ----------------------------------------------------------------------------


def _section_crc(section: SectionEntry) -> int | None:
    # The weights are checked per block (their table is the WEIGHT_CHECKSUMS section), so
    # their own entry's crc32 field is unused.
    return None if section.kind == SectionKind.WEIGHTS else section.crc32


def _tensor(program: Program, index: int) -> dict[str, Any]:
    t = program.tensors[index]
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def binary_dict(binary: ContextBinary, path: str) -> dict[str, Any]:
    """The JSON form of a context binary. Keys: ``file``, ``kind`` (``"context_binary"``),
    ``header`` (``format_version``, ``sdk_version``, ``architecture``, ``config_digest``,
    ``file_size``), ``sections`` (``kind``, ``offset``, ``length``, ``crc32``: null for the
    weights, checked per block), ``graphs`` (``name``, ``architecture``, ``inputs`` /
    ``outputs`` (``name``, ``dtype``, ``shape``), ``arena_bytes``, ``weight_tensors``,
    ``weight_bytes``, ``tensors``, ``launches`` (``op``, ``node``), ``commands``) and
    ``weights`` (``blobs``, ``references``, ``referenced_bytes``, ``distinct_bytes``,
    ``section_bytes``)."""
    h, w = binary.header, binary.weights_summary
    return {
        "file": path, "kind": "context_binary",
        "header": {"format_version": f"{h.format_version[0]}.{h.format_version[1]}",
                   "sdk_version": h.sdk_version, "architecture": h.hardware_architecture,
                   "config_digest": h.config_digest or None, "file_size": h.file_size},
        "sections": [{"kind": s.kind_name, "offset": s.offset, "length": s.length,
                      "crc32": _section_crc(s)} for s in binary.sections],
        "graphs": [{"name": p.name, "architecture": p.hardware_architecture or None,
                    "inputs": [_tensor(p, i) for i in p.inputs],
                    "outputs": [_tensor(p, i) for i in p.outputs],
                    "arena_bytes": p.arena_bytes, "weight_tensors": len(p.weights),
                    "weight_bytes": sum(len(v) for v in p.weights.values()),
                    "tensors": len(p.tensors),
                    "launches": [{"op": k.op, "node": k.node} for k in p.launches],
                    "commands": len(p.commands) // fc.COMMAND_BYTES}
                   for p in binary.programs()],
        "weights": {"blobs": w.blobs, "references": w.references,
                    "referenced_bytes": w.referenced_bytes, "distinct_bytes": w.distinct_bytes,
                    "section_bytes": w.section_bytes},
    }


def _print_binary(binary: ContextBinary, path: str, out: TextIO) -> None:
    _print_header(binary, path, out)
    for program in binary.programs():
        _print_program(program, out)
    _print_weights(binary, out)


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
    table([(str(i), s.kind_name, str(s.offset), f"{s.length:,}",
            "per block" if _section_crc(s) is None else f"0x{s.crc32:08x}", "ok")
           for i, s in enumerate(binary.sections)],
          ("#", "kind", "offset", "length", "crc32", "checksum"), out)
    print(f"\ngraphs ({len(binary.graph_names())}): {', '.join(binary.graph_names())}", file=out)


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
    table([(str(i), t.name, t.dtype, str(list(t.shape)), Region(t.region).name.lower(),
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


def table(rows: list[tuple[str, ...]], head: tuple[str, ...], out: TextIO,
          indent: int = 2) -> None:
    """Print ``rows`` under ``head`` in left-aligned columns."""
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows, strict=True)]
    for row in (head, *rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(" " * indent + "  ".join(cells).rstrip(), file=out)
