"""``python -m ep.npusim.ops [--check]``: write (or check) ``docs/operators.md``, the table of
every op the NPU runs, generated from the operator catalogue."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import Fusion, Lowering, Tiling, entries

DOC = Path("docs") / "operators.md"
"""Where the doc goes, relative to the working directory (the repository root)."""

_HEADER = """# Operators the NPU runs

Generated from the operator catalogue (`ep/npusim/ops/`) by `python -m ep.npusim.ops`; do not
edit by hand (`tests/ep/test_catalogue.py` fails when it is stale). How to add an op:
[adding_an_op.md](adding_an_op.md). A node outside these rules runs on the CPU provider, and
`InferenceSession.get_decline_reasons()` says why.

Opsets are those of the model's default domain. *Constant* inputs must be initializers or
`Constant` outputs. *Checks*: further rules on attributes and shapes (the op's class has
them in full).
*Lowering*: `launch` (one kernel launch), `view` (aliases its input, no launch), `fold`
(evaluated at compile time). *Tiling*: `gemm`, `conv` (im2col) or `vector`. *Fusion*: `host`
applies a fused activation, `activation` is fused into its producer.
"""


def _cell(values: tuple[str, ...] | None) -> str:
    return ", ".join(values) if values else ""


def _rule(check: object) -> str:
    """The first line of a check's docstring: what it requires."""
    if check is None:
        return ""
    doc = (getattr(check, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else "yes"


def render() -> str:
    """The whole of ``docs/operators.md``."""
    rows = ["| op | opsets | dtypes | output dtypes | constant inputs | checks | lowering | "
            "tiling | fusion |", "|---|---|---|---|---|---|---|---|---|"]
    for op, e in sorted(entries().items()):
        s = e.support
        rows.append("| " + " | ".join([
            f"`{op}`", f"{s.since_opset}-{s.until_opset}", _cell(s.dtypes),
            _cell(s.output_dtypes), _cell(tuple(name for _, name in s.const_inputs)),
            _rule(s.check), e.lowering.value,
            "" if e.lowering is Lowering.FOLD else e.tiling.value,
            "" if e.fusion is Fusion.NONE else e.fusion.value,
        ]) + " |")
    array = sum(e.tiling is not Tiling.VECTOR for e in entries().values())
    count = f"\n{len(rows) - 2} ops, {array} of them tiled as GEMMs or convolutions.\n\n"
    return _HEADER + count + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the doc; with ``--check``, exit 1 if it differs from the catalogue instead."""
    parser = argparse.ArgumentParser(prog="python -m ep.npusim.ops")
    parser.add_argument("--check", action="store_true", help="only check the doc is current")
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the doc (default: {DOC})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.doc.read_text() if args.doc.exists() else ""
        if current != text:
            print(f"{args.doc} is stale: run python -m ep.npusim.ops", file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(text)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
