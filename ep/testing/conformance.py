"""onnx's backend node test cases through :mod:`ep.backend`, side by side with onnxruntime CPU.

``python -m ep.testing.conformance`` runs every node test case shipped with the installed onnx
(``onnx.backend.test.loader.load_model_tests(kind="node")``) on ``ep.backend`` (NPU, then CPU)
and on onnxruntime's CPU provider, judges both with onnx's own criterion (the case's
rtol/atol, ``Runner.assert_similar_outputs``), and writes ``docs/conformance.md``: how many
cases pass, fail and are skipped (onnxruntime fails them too), how many ran a node on the NPU,
and every failure with its reason (run it from the repository's root). ``--cases a,b`` runs
some; ``--check`` exits 1 if a case
onnxruntime passes fails on ep.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

NPU = "NpuSimExecutionProvider"
DOC = Path("docs") / "conformance.md"
"""Where the report goes, relative to the working directory (the repository's root)."""
BEGIN, END = "<!-- node-tests:begin -->", "<!-- node-tests:end -->"


@dataclass
class CaseResult:
    """One node test case on ep and on onnxruntime: ``None`` passed, else the reason."""

    name: str
    ep_error: str | None
    ort_error: str | None
    on_npu: bool

    @property
    def status(self) -> str:
        """``passed``, ``failed`` (ep fails where onnxruntime passes) or ``skipped``."""
        if self.ep_error is None:
            return "passed"
        return "skipped" if self.ort_error is not None else "failed"


def node_cases(names: Iterable[str] | None = None) -> list[Any]:
    """onnx's node test cases (all, or those named), sorted by name."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    if names is not None:
        wanted = set(names)
        cases = [c for c in cases if c.name in wanted]
        missing = wanted - {c.name for c in cases}
        if missing:
            raise ValueError(f"no onnx node test case named {sorted(missing)}")
    return sorted(cases, key=lambda c: c.name)


def _reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = " ".join(lines[:3]) if lines else ""
    return f"{type(exc).__name__}: {text}"[:300]


def _check(case: Any, run: Any) -> str | None:
    from onnx.backend.test.runner import Runner

    try:
        for inputs, outputs in case.data_sets:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got = run(inputs)
            Runner.assert_similar_outputs(outputs, got, rtol=case.rtol, atol=case.atol)
    except BaseException as exc:  # noqa: BLE001 - any failure is this case's result
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return _reason(exc)
    return None


def run_case(case: Any) -> CaseResult:
    """Run one case on ep (NPU, then CPU) and on onnxruntime CPU."""
    import ep.backend

    names = [i.name for i in case.model.graph.input
             if i.name not in {t.name for t in case.model.graph.initializer}]
    state: dict[str, Any] = {}

    def ep_run(inputs: Sequence[Any]) -> list[Any]:
        if "rep" not in state:
            state["rep"] = ep.backend.prepare(case.model)
        return state["rep"].run(list(inputs))

    def ort_run(inputs: Sequence[Any]) -> list[Any]:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(case.model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, dict(zip(names, inputs, strict=False)))

    ep_error = _check(case, ep_run)
    rep = state.get("rep")
    on_npu = rep is not None and NPU in rep.session.get_node_assignment().values()
    return CaseResult(case.name, ep_error, _check(case, ort_run), on_npu)


def run(cases: Sequence[Any]) -> list[CaseResult]:
    """Every case, in order."""
    return [run_case(c) for c in cases]


def summary(results: Sequence[CaseResult]) -> dict[str, int]:
    """Counts: total, passed, failed, skipped, onnxruntime_passed, ep_passed_ort_failed,
    on_npu (cases where the NPU ran a node), on_npu_passed."""
    count = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
    return {"total": len(results), **count,
            "onnxruntime_passed": sum(r.ort_error is None for r in results),
            "ep_passed_ort_failed": sum(r.ep_error is None and r.ort_error is not None
                                        for r in results),
            "on_npu": sum(r.on_npu for r in results),
            "on_npu_passed": sum(r.on_npu and r.ep_error is None for r in results)}


def report(results: Sequence[CaseResult], seconds: float) -> str:
    """The Markdown section of docs/conformance.md for these results."""
    import onnx

    s = summary(results)
    lines = [
        BEGIN,
        "## ONNX backend node tests",
        "",
        f"onnx {onnx.__version__}, onnxruntime {ort.__version__}; "
        f"{s['total']} node test cases, each run through `ep.backend` (NpuSimExecutionProvider "
        "then CPUExecutionProvider) and through onnxruntime's CPU provider, judged by onnx's "
        "own criterion (the case's rtol/atol). Regenerate with "
        "`python -m ep.testing.conformance` "
        f"(this run: {seconds:.0f} s).",
        "",
        "| | cases |",
        "|---|---|",
        f"| passed on ep | {s['passed']} |",
        f"| failed on ep, passed on onnxruntime | {s['failed']} |",
        f"| skipped: failed on both | {s['skipped']} |",
        f"| passed on onnxruntime | {s['onnxruntime_passed']} |",
        f"| passed on ep, failed on onnxruntime | {s['ep_passed_ort_failed']} |",
        f"| the NPU ran a node of the case | {s['on_npu']} ({s['on_npu_passed']} passed) |",
        "",
    ]
    failed = [r for r in results if r.status == "failed"]
    lines += ["### Failures (onnxruntime passes these)", ""]
    lines += ([f"- `{r.name}`: {_md(r.ep_error)}" for r in failed] or ["None."]) + [""]
    skipped = [r for r in results if r.status == "skipped"]
    lines += ["### Skipped: onnxruntime fails these too", "",
              "| case | ep | onnxruntime |", "|---|---|---|"]
    lines += [f"| `{r.name}` | {_md(r.ep_error)} | {_md(r.ort_error)} |" for r in skipped]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _md(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def write_doc(section: str, path: Path = DOC) -> None:
    """Replace the node-test section of ``path`` (or append it), keeping the rest."""
    text = path.read_text() if path.exists() else "# Conformance\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases, print the summary, rewrite docs/conformance.md (full runs only)."""
    parser = argparse.ArgumentParser(prog="python -m ep.testing.conformance")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a case onnxruntime passes fails on ep")
    parser.add_argument("--no-write", action="store_true", help="do not rewrite the doc")
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the report (default {DOC})")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cases = node_cases(args.cases.split(",") if args.cases else None)
    results = run(cases)
    seconds = time.perf_counter() - started
    print(" ".join(f"{k}={v}" for k, v in summary(results).items()), f"seconds={seconds:.0f}")
    for r in results:
        if r.status == "failed":
            print(f"FAILED {r.name}: {r.ep_error}")
    if not args.cases and not args.no_write:
        write_doc(report(results, seconds), args.doc)
        print(f"wrote {args.doc}")
    return 1 if args.check and any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
