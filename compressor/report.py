"""Human-readable views of report.json (the JSON itself is built by the pipeline)."""

from __future__ import annotations


def markdown_table(report: dict) -> str:
    """The teacher and every variant: accuracy, retention, agreement, size."""
    teacher = report["teacher"]
    rows = [("teacher", teacher["accuracy"], teacher.get("macro_f1"), 1.0, 1.0, teacher["params"],
             teacher["size_bytes"])]
    rows += [(m["name"], m["accuracy"], m.get("macro_f1"), m["retention"], m.get("agreement"),
              m["params"], m["size_bytes"]) for m in report["models"]]
    lines = ["| model | accuracy | macro-F1 | retention | agreement with teacher | params | weights (MB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, acc, f1, retention, agree, params, size in rows:
        lines.append(f"| {name} | {acc:.4f} | {fmt(f1)} | {fmt(retention, 3)} | {fmt(agree, 3)} | "
                     f"{params:,} | {size / 1e6:.1f} |")
    return "\n".join(lines)


def exports_table(report: dict) -> str:
    """One row per ONNX export (empty when the recipe exported nothing)."""
    entries = [("teacher", report["teacher"])] + [(m["name"], m) for m in report["models"]]
    rows = [(name, entry["onnx"]) for name, entry in entries if "onnx" in entry]
    if not rows:
        return ""
    lines = ["| export | precision | fused | accuracy | change vs fp32 | agreement with fp32 | "
             "max logit diff | MB |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, onnx in rows:
        lines.append(f"| {name} | {onnx['precision']} | {'yes' if onnx['optimized'] else 'no'} | "
                     f"{onnx['accuracy']:.4f} | {onnx['accuracy_change'] * 100:+.2f} pt | "
                     f"{fmt(onnx['agreement_with_fp32'], 3)} | {onnx['parity_max_abs_diff']:.1e} | "
                     f"{onnx['size_bytes'] / 1e6:.1f} |")
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
