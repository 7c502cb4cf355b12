"""The benchmarks' shared protocol: every bench reports :class:`Figure` records.

Each ``bench/bench_*.py`` has a ``main()`` that calls :func:`bench_main`: the bench's own
options, plus ``--quick`` (a smoke run with small sizes, seconds rather than minutes; its
figures are not the recorded ones) and ``--json``. Its detailed lines go to stdout, then the
table of its figures; with ``--json`` the detail goes to stderr and stdout holds one JSON list
of figures (the runner, ``python -m bench``, reads that).

A figure is a value measured in one run, usually a ratio against a reference measured in the
same process, with an optional target: ``ok`` is ``True`` (pass), ``False`` (falls short) or
``None`` (informational, no target). JSON keys, stable: ``bench``, ``name``, ``value``, ``unit``,
``target``, ``direction`` (``"<="`` or ``">="``, null without a target), ``ok``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

DIRECTIONS = ("<=", ">=")


@dataclass(frozen=True)
class Figure:
    """One measured figure of a bench, with its target (None: informational)."""

    bench: str
    name: str
    value: float
    unit: str = "x"
    target: float | None = None
    direction: str | None = None

    def __post_init__(self) -> None:
        if (self.target is None) != (self.direction is None):
            raise ValueError(f"figure {self.name!r}: target and direction go together "
                             f"(target {self.target!r}, direction {self.direction!r})")
        if self.direction is not None and self.direction not in DIRECTIONS:
            raise ValueError(f"figure {self.name!r}: direction {self.direction!r}, expected one "
                             f"of {DIRECTIONS}")

    @property
    def ok(self) -> bool | None:
        """Whether the value meets the target; None without a target or for a NaN value."""
        if self.target is None or math.isnan(self.value):
            return None
        return self.value <= self.target if self.direction == "<=" else self.value >= self.target

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (the module docstring lists the keys)."""
        return {**asdict(self), "value": None if math.isnan(self.value) else self.value,
                "ok": self.ok}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figure:
        """The figure of :meth:`to_dict`'s output (``ok`` is derived, so it is not read)."""
        value = data["value"]
        return cls(str(data["bench"]), str(data["name"]),
                   math.nan if value is None else float(value), str(data["unit"]),
                   None if data["target"] is None else float(data["target"]), data["direction"])


def at_most(bench: str, name: str, value: float, target: float, unit: str = "x") -> Figure:
    """A figure whose target is an upper bound."""
    return Figure(bench, name, float(value), unit, float(target), "<=")


def at_least(bench: str, name: str, value: float, target: float, unit: str = "x") -> Figure:
    """A figure whose target is a lower bound."""
    return Figure(bench, name, float(value), unit, float(target), ">=")


def info(bench: str, name: str, value: float, unit: str = "x") -> Figure:
    """A figure reported without a target."""
    return Figure(bench, name, float(value), unit)


def number(value: float, unit: str) -> str:
    """``value`` with its unit, 3 significant figures (ratios: ``1.23x``)."""
    if math.isnan(value):
        return "n/a"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text}{unit}" if unit in ("x", "%") else f"{text} {unit}".rstrip()


def verdict(figure: Figure) -> str:
    """``pass``, ``falls short`` or ``-`` (no target)."""
    return {True: "pass", False: "falls short", None: "-"}[figure.ok]


def table(figures: Sequence[Figure]) -> str:
    """The figures as one text table with a closing count of targets met."""
    head = ("bench", "figure", "measured", "target", "result")
    rows = [(f.bench, f.name, number(f.value, f.unit),
             f"{f.direction} {number(f.target, f.unit)}" if f.target is not None else "-",
             verdict(f)) for f in figures]
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows, strict=True)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in (head, *rows)]
    judged = [f for f in figures if f.ok is not None]
    lines.append(f"{sum(bool(f.ok) for f in judged)} of {len(judged)} figures with a target "
                 f"meet it; {len(figures) - len(judged)} figure(s) without a target")
    return "\n".join(lines)


def markdown(figures: Sequence[Figure]) -> str:
    """The figures as a Markdown table (for ``docs/performance.md``)."""
    lines = ["| bench | figure | measured | target | result |", "|---|---|---:|---:|---|"]
    for f in figures:
        target = f"{f.direction} {number(f.target, f.unit)}" if f.target is not None else "-"
        name = f.name.replace("|", "\\|")  # a pipe would end the cell
        lines.append(f"| {f.bench} | {name} | {number(f.value, f.unit)} | {target} | "
                     f"{verdict(f)} |")
    return "\n".join(lines)


def bench_main(parser: argparse.ArgumentParser,
               measure: Callable[[argparse.Namespace], list[Figure]],
               quick_args: Sequence[str] = (), argv: Sequence[str] | None = None,
               out: TextIO | None = None) -> None:
    """A bench's ``main``: its ``parser`` plus ``--quick`` (parse ``quick_args`` on top of the
    given ones) and ``--json``; run ``measure`` and print its figures."""
    out = out or sys.stdout
    parser.add_argument("--quick", action="store_true",
                        help=f"a fast smoke run ({' '.join(quick_args) or 'defaults'})")
    parser.add_argument("--json", action="store_true",
                        help="detail to stderr, one JSON list of figures to stdout")
    args = parser.parse_args(argv)
    if args.quick:
        args = parser.parse_args([*quick_args, *(argv if argv is not None else sys.argv[1:])])
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            found = measure(args)
        print(json.dumps([f.to_dict() for f in found]), file=out)
    else:
        found = measure(args)
        print("\n" + table(found), file=out)
