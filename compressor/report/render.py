"""report.md, report.html and pareto.png: renderings of a finished report.json.

Everything here derives from the JSON (built by compressor/pipeline/report_data.py), so
the human reports can be regenerated from a report.json alone (`write_reports`).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from compressor.report.analysis import as_timed_on, latency_row, measurement_keys
from pretrain.atomic import atomic_files, json_bytes

Table = tuple[list[str], list[list[str]]]


# -- tables ----------------------------------------------------------------------------

def baselines_of(report: dict) -> list[dict]:
    return [m for m in report["models"] if m.get("baseline")]


def summary_table(report: dict) -> Table:
    """Every model and baseline: accuracy, retention, size, and size ratios vs each baseline."""
    teacher = report["teacher"]
    bases = baselines_of(report)
    tokens = report.get("flops_sequence_length")
    # macro-F1 beside accuracy: on imbalanced labels a model predicting the commonest one scores
    # a high accuracy and a low macro-F1.
    head = ["model", "kind", "precision", "accuracy", "macro-F1", "retention", "agreement with teacher", "params",
            f"M mult-adds ({tokens} tokens)" if tokens else "M mult-adds", "MB", "compressed MB"]
    head += [f"size vs {b['name']}" for b in bases]
    rows = [["teacher (PyTorch)", "torch", "fp32", f"{teacher['accuracy']:.4f}", fmt(teacher.get("macro_f1")),
             "1.000", "1.000", f"{teacher['params']:,}", millions(teacher.get("flops")),
             f"{teacher['size_bytes'] / 1e6:.1f}", "-"] +
            [ratio(teacher["size_bytes"], b["size_bytes"]) for b in bases]]
    for m in report["models"]:
        rows.append([m["name"] + (" (baseline)" if m.get("baseline") else ""), m.get("kind", "torch"),
                     m.get("precision", "fp32"), f"{m['accuracy']:.4f}", fmt(m.get("macro_f1")),
                     fmt(m.get("retention"), 3), fmt(m.get("agreement"), 3), f"{m['params']:,}",
                     millions(m.get("flops")),
                     f"{m['size_bytes'] / 1e6:.1f}", millions(m.get("compressed_size_bytes"))] +
                    [ratio(m["size_bytes"], b["size_bytes"]) for b in bases])
    if not any(m.get("compressed_size_bytes") for m in report["models"]):   # no sparse model: an empty column
        column = head.index("compressed MB")
        head, rows = drop_column(head, column), [drop_column(r, column) for r in rows]
    return head, rows


def drop_column(cells: list[str], column: int) -> list[str]:
    return cells[:column] + cells[column + 1:]


def search_table(search: dict) -> Table:
    """Every finalist of a search: its plan, proxy, predicted and measured latency, accuracy."""
    budget = search["budget"]
    head = ["finalist", "trial", "proxy accuracy (validation)", "predicted p50 ms", "measured p50 ms",
            "test accuracy", "retention", f"within {budget['latency_ms']:.2f} ms",
            f"retention >= {budget['min_retention']:.2f}", "measured front"]
    rows = [[r["name"], str(r["trial"]), f"{r['proxy_accuracy']:.4f}", f"{r['predicted_p50_ms']:.2f}",
             fmt(r["measured_p50_ms"], 2), f"{r['accuracy']:.4f}", f"{r['retention']:.3f}",
             "yes" if r["meets_budget"] else "no", "yes" if r["meets_retention"] else "no",
             "yes" if r["name"] in search["front"] else ""] for r in search["finalists"]]
    return head, rows


def trials_table(search: dict) -> Table:
    """Every trial of a search, compact: what it proposed, was predicted and scored."""
    head = ["trial", "plan", "status", "predicted p50 ms", "proxy accuracy", "proxy retention"]
    rows = [[str(r["number"]), r["plan"] or "", r["status"], fmt(r["predicted_p50_ms"], 2),
             fmt(r["proxy_accuracy"], 4), fmt(r["proxy_retention"], 3)] for r in search.get("trial_table", [])]
    return head, rows


def space_line(space: dict) -> str:
    """The search space in one line."""
    parts = [f"recoveries {', '.join(space['recoveries'])}", f"precisions {', '.join(space['precisions'])}"]
    if space.get("layers"):
        parts.append(f"layers {space['layers'][0]}-{space['layers'][1]}, heads removed "
                     f"{space['heads_removed'][0]:g}-{space['heads_removed'][1]:g}, FFN removed "
                     f"{space['ffn_removed'][0]:g}-{space['ffn_removed'][1]:g} (steps of {space['removed_step']:g})")
    if space.get("theseus_successor_layers"):
        parts.append(f"theseus successor layers {', '.join(map(str, space['theseus_successor_layers']))}")
    limit = f"at most {space['max_trials']} trials" if space.get("max_trials") else "trials until the time budget"
    return f"space: {'; '.join(parts)}; {limit}, {space['finalists']} finalists"


def time_lines(timing: dict) -> list[str]:
    lines = [f"finals: estimated {timing['finals_estimated_min']:.1f} min, took {timing['finals_min']:.1f} min "
             f"({timing['minutes_left_at_finals']:.1f} min of the time budget left when they began)"]
    if timing["finalists_dropped"]:
        lines.append(f"left out of the finals to keep the time budget: {', '.join(timing['finalists_dropped'])}")
    if timing["benchmark_time_limited"]:
        lines.append("the time budget cut the finals' benchmark short (fewer timed calls; see the warnings)")
    return lines


def compared_table(search: dict) -> Table:
    """Hand-written variants measured in the search's finals, against the searched model."""
    head = ["hand-written variant", "measured p50 ms", "test accuracy", "retention", "searched model",
            "searched as accurate", "searched as fast", "searched speedup"]
    rows = [[r["name"], fmt(r["measured_p50_ms"], 2), f"{r['accuracy']:.4f}", f"{r['retention']:.3f}",
             r.get("searched", ""), yes_no(r.get("searched_as_accurate")), yes_no(r.get("searched_as_fast")),
             fmt(r.get("searched_speedup"), 2)] for r in search.get("compared", [])]
    return head, rows


def yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "no")


def search_lines(search: dict) -> list[str]:
    trials, held_out = search["trials"], search["latency_model"].get("held_out") or {}
    lines = [search["outcome"],
             f"trials: {trials['total']} ({trials['trained']} trained briefly, {trials['not_trained_over_budget']} "
             f"predicted over budget and not trained, {trials['failed']} failed"
             + (f", {trials['stopped']} stopped by an interrupt" if trials.get("stopped") else "") + ")"]
    if "space" in search:
        lines.append(space_line(search["space"]))
    if "time" in search:
        lines += time_lines(search["time"])
    if held_out:
        lines.append(f"latency model: median error {held_out['median_abs_relative_error']:.1%} on "
                     f"{held_out['structures']} held-out structures, rank correlation {fmt(held_out['spearman'], 3)}")
    if contention := search["latency_model"].get("contention"):
        lines.append(f"latency model timed while other processes used {contention['median']:.0%} of the CPUs "
                     f"(median over its timed structures; worst {contention['worst']:.0%})")
    if search["budget"]["searched_for_ms"] != search["budget"]["latency_ms"]:
        lines.append(f"the budget is below the fastest plan's predicted {search['budget']['searched_for_ms']:.2f} ms: "
                     "the fastest plans were searched")
    picked = search["chosen"] or search["best_effort"]
    if picked:
        lines.append(f"recipe that rebuilds {picked}: {search['recipe_file']}")
    return lines


def millions(value: float | None) -> str:
    """Multiply-adds or bytes in millions; '-' where the report has none (older reports, dense models)."""
    return fmt(None if value is None else value / 1e6, 1)


def latency_table(report: dict, key: tuple) -> Table:
    """One measurement (profile, batch, length): latency percentiles, throughput, memory, speedups."""
    bases = [b for b in baselines_of(report) if latency_row(b, key)]
    front = next((f["models"] for f in report.get("pareto", [])
                  if (f["profile"], f["batch_size"], f["sequence_length"]) == key), [])
    head = ["model", "accuracy", "p50 ms", "p90 ms", "p99 ms", "samples/s", "peak RSS MiB"]
    head += [f"speedup vs {b['name']}" for b in bases] + ["Pareto"]
    rows = []
    for m in sorted(report["models"], key=lambda m: (latency_row(m, key) or {}).get("p50_ms", float("inf"))):
        row = latency_row(m, key)
        if row is None:
            continue
        accuracy = as_timed_on(m, key[0])["accuracy"]    # Optimum's: this profile's preset's build
        rows.append([m["name"], f"{accuracy:.4f}", f"{row['p50_ms']:.2f}", f"{row['p90_ms']:.2f}",
                     f"{row['p99_ms']:.2f}", f"{row['throughput']:.0f}", fmt(row.get("peak_rss_mb"), 0)] +
                    [f"{latency_row(b, key)['p50_ms'] / row['p50_ms']:.2f}x" for b in bases] +
                    ["yes" if m["name"] in front else ""])
    return head, rows


def markdown_table(report: dict) -> str:
    """The summary table in Markdown (printed by `compressor run`)."""
    return render_markdown(summary_table(report))


def exports_table(report: dict) -> str:
    """One row per ONNX export (empty when the recipe exported nothing)."""
    entries = [("teacher", report["teacher"])] + [(m["name"], m) for m in report["models"]]
    rows = [(name, entry["onnx"]) for name, entry in entries if "onnx" in entry]
    if not rows:
        return ""
    head = ["export", "precision", "fused", "accuracy", "change vs fp32", "agreement with fp32",
            "fp32 graph max logit diff", "MB"]
    # A torch-dynamic-int8 deployment has no fused graph and no parity record of its own.
    body = [[name, onnx["precision"], "yes" if onnx.get("optimized") else "no", f"{onnx['accuracy']:.4f}",
             f"{onnx['accuracy_change'] * 100:+.2f} pt", fmt(onnx.get("agreement_with_fp32"), 3),
             fmt(onnx.get("parity_max_abs_diff"), 1, "e"), f"{onnx['size_bytes'] / 1e6:.1f}"] for name, onnx in rows]
    return render_markdown((head, body))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def fmt(value: float | None, digits: int = 4, style: str = "f") -> str:
    return "-" if value is None else f"{value:.{digits}{style}}"


def render_markdown(table: Table) -> str:
    head, rows = table
    align = ["---"] + ["---:" if any(c[:1].isdigit() or (c[:1] and c[:1] in "+-") for c in col) else "---"
                       for col in list(zip(*rows))[1:]] if rows else ["---"] * len(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_html_table(table: Table) -> str:
    head, rows = table
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


# -- the chart -------------------------------------------------------------------------

def pareto_png(report: dict) -> bytes | None:
    """Accuracy vs p50 latency, one panel per measurement; marker area ~ file size."""
    keys = measurement_keys(report["models"])
    if not keys:
        return None
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(keys), figsize=(9 * len(keys), 5), squeeze=False)
    biggest = max(m["size_bytes"] for m in report["models"]) or 1
    fronts = {(f["profile"], f["batch_size"], f["sequence_length"]): f["models"] for f in report.get("pareto", [])}
    for ax, key in zip(axes[0], keys):
        measured = sorted((as_timed_on(m, key[0]) for m in report["models"] if latency_row(m, key)),
                          key=lambda m: latency_row(m, key)["p50_ms"])
        # Names beside close markers land on the wrong ones: each marker carries a number
        # (fastest first) and the key beside the panel names it.
        for number, m in enumerate(measured, start=1):
            row = latency_row(m, key)
            ax.scatter(row["p50_ms"], m["accuracy"], s=40 + 600 * m["size_bytes"] / biggest, alpha=0.6,
                       marker="s" if m.get("baseline") else "o",
                       color="tab:gray" if m.get("baseline") else "tab:blue", edgecolors="black")
            ax.annotate(str(number), (row["p50_ms"], m["accuracy"]), fontsize=7, ha="center", va="center")
        ax.text(1.02, 1.0, "\n".join(f"{n:>2}  {m['name']}" for n, m in enumerate(measured, start=1)),
                transform=ax.transAxes, fontsize=8, va="top", ha="left", family="monospace")
        front = [(latency_row(m, key)["p50_ms"], m["accuracy"]) for name in fronts.get(key, [])
                 for m in measured if m["name"] == name]
        if front:
            xs, ys = zip(*sorted(front))
            # markers too: a front of one model is a step of no length
            ax.step(xs, ys, where="post", color="tab:red", linewidth=1, marker="o", markersize=4,
                    label="Pareto front")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        low, high = ax.get_xlim()     # minor labels only where few fit (they crowd over a decade)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g") if high / low < 8
                                     else matplotlib.ticker.NullFormatter())
        ax.set_xlabel("p50 latency (ms, log scale)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{key[0]}, batch {key[1]}, sequence {key[2]}")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


# -- report.md / report.html -------------------------------------------------------------

def environment_lines(env: dict) -> list[str]:
    cpu = env.get("cpu", {})
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v)
    return [f"date: {env.get('date')}",
            f"CPU: {cpu.get('model')} ({cpu.get('cores')} cores{quota_note(env)}, {cpu.get('machine')}; "
            f"flags: {', '.join(cpu.get('flags', [])) or 'none of interest'})",
            f"threads: {threads_line(env)}; Python {env.get('python')}; {env.get('platform')}",
            f"packages: {packages}"] + isa_limits_line(env)


def quota_note(env: dict) -> str:
    """The cgroup quota the figures were measured under, when one was set (`cpu_quota`)."""
    quota = env.get("cpu_quota")
    return f", a cgroup quota of {quota:g} CPUs" if quota is not None else ""


def isa_limits_line(env: dict) -> list[str]:
    """The instruction-set limits a run was measured under, when any (its CPU flags say more)."""
    limits = env.get("isa_limits")
    return [f"instruction sets limited by: {', '.join(f'{k}={v}' for k, v in limits.items())}"] if limits else []


def threads_line(env: dict) -> str:
    """The threads each profile was timed at (reports before that record: torch's setting)."""
    if "threads" in env:
        return ", ".join(f"{name} {count}" for name, count in env["threads"].items()) or "none timed"
    return f"torch {env.get('torch_threads')}"


def models_title(report: dict) -> str:
    """The models table's title, with the test examples every accuracy in the report is measured on."""
    samples = report["teacher"].get("eval_samples")
    if samples is None:
        return "Models"
    data = report.get("data")      # absent in reports from before it was recorded
    seen = data["texts_in_train"]["test"]["in_train"] if data else 0
    # Said beside the count it qualifies, not only among the warnings further down.
    text = "text pair" if data and data["pair_task"] else "text"
    also = f", {seen:,} of them with a {text} the train split also holds" if seen else ""
    return f"Models (accuracies on the same {samples:,} test examples{also})"


def sections(report: dict) -> list[tuple[str, str, object]]:
    """(kind, title, content) in report order; kind is 'table', 'lines' or 'chart'."""
    out: list[tuple[str, str, object]] = [("table", models_title(report), summary_table(report))]
    if "labels" in report.get("data", {}):       # reports from before the labels were recorded have none
        out.append(("lines", "Task and labels", task_lines(report["data"])))
    if baselines_of(report):
        out.append(("lines", "Baselines: how each was built", baseline_lines(report)))
    exports = [("teacher", report["teacher"])] + [(m["name"], m) for m in report["models"]]
    if any("onnx" in e for _, e in exports):
        out.append(("markdown", "ONNX exports (parity and accuracy gate)", exports_table(report)))
    for key in measurement_keys(report["models"]):
        out.append(("table", f"Latency: profile {key[0]}, batch {key[1]}, sequence {key[2]}",
                    latency_table(report, key)))
    if report.get("benchmark", {}).get("rankings"):
        out.append(("lines", "Ranking by latency (fastest first; '=' joins models that tie within the noise; "
                             "(Nx): median per-call ratio of a group's fastest to the previous group's)",
                    ranking_lines(report["benchmark"])))
    if report.get("pareto"):
        out.append(("chart", "Accuracy vs latency (numbered fastest first; marker area grows with file size; "
                             "squares: baselines)", None))
    search = report.get("search")
    if search and "finalists" in search:
        out.append(("lines", "Search to a latency budget", search_lines(search)))
        out.append(("table", "Search finalists (predicted beside measured latency)", search_table(search)))
        if search.get("compared"):
            out.append(("table", "Searched model against hand-written variants (same run)", compared_table(search)))
        if search.get("trial_table"):
            out.append(("table", "Search trials (proxies: predicted latency, brief training)", trials_table(search)))
    elif search:
        out.append(("lines", "Search to a latency budget",
                    [search["outcome"], f"its own report: {search['dir']}/report.json"]))
    skipped = report.get("benchmark", {}).get("skipped", [])
    if skipped:
        out.append(("lines", "Skipped profiles", unmeasured_lines(report["benchmark"]) +
                    [f"{s['profile']}: {s['reason']}" for s in skipped]))
    if report.get("warnings"):
        out.append(("lines", "Warnings", report["warnings"]))
    benchmark = report.get("benchmark", {})
    # Every profile skipped: no latency was measured anywhere, so no "where and when".
    measured = benchmark.get("environment") if benchmark.get("profiles") else None
    if measured:
        out.append(("lines", "Where and when the latencies were measured", environment_lines(measured)))
    out.append(("lines", "Environment (this report written)" if measured else "Environment",
                environment_lines(report["environment"])))
    return out


def task_lines(data: dict, shown: int = 12) -> list[str]:
    """The task, its labels and how the scored test examples fall among them (the commonest
    first), and what always predicting the commonest one scores: the floor for accuracy."""
    examples = data["examples"]
    counts = sorted(data["test_labels"].items(), key=lambda item: -item[1])   # stable: label order on ties
    scored = sum(count for _, count in counts)
    more = f", and {len(counts) - shown} more labels (report.json: data.test_labels)" if len(counts) > shown else ""
    floor = data["most_frequent"]
    return [f"{data['task']}: {'text pairs' if data['pair_task'] else 'single texts'}; "
            + ", ".join(f"{examples[name]:,} {name}" for name in examples) + f" examples; {len(data['labels'])} labels",
            "test examples scored, by label: " + ", ".join(f"{name!r} {count:,} ({count / scored:.1%})"
                                                             for name, count in counts[:shown]) + more,
            f"always predicting the commonest, {floor['label']!r}, scores accuracy {floor['accuracy']:.4f} and "
            f"macro-F1 {floor['macro_f1']:.4f}"]


def unmeasured_lines(benchmark: dict) -> list[str]:
    """Why a run with a benchmark has no latency at all: every profile was skipped here."""
    if benchmark.get("profiles"):
        return []
    unbuilt = benchmark.get("baselines_not_built")
    return ["nothing was measured: every profile is skipped on this machine (below)" +
            (f"; the baselines {', '.join(unbuilt)} were not built, as nothing would measure them" if unbuilt else "")]


BASELINE_RECIPES = {
    "pytorch-eager-fp32": "the teacher in PyTorch eager mode, fp32, as fine-tuning wrote it",
    "onnxruntime-fp32": "the teacher exported to ONNX as is (no offline fusion), fp32, in ONNX Runtime",
    "optimum-default-int8": "Optimum's CPU recipe: ORTModelForSequenceClassification export, ORTOptimizer O2, "
                            "ORTQuantizer with the AutoQuantizationConfig preset for the CPU (dynamic, the "
                            "preset's own defaults)",
}


def baseline_lines(report: dict) -> list[str]:
    """What each baseline is, and for Optimum's which preset each profile measured."""
    lines = []
    for b in baselines_of(report):
        line = f"{b['name']}: {BASELINE_RECIPES.get(b['name'], b['name'])}"
        optimum = b.get("optimum")
        if optimum:
            for preset, build in optimum["builds"].items():
                s = build["settings"]
                profiles = [p for p, q in optimum["profiles"].items() if q == preset]
                line += (f"; preset {preset} (accuracy {build['accuracy']:.4f}, activations {s['activations_dtype']}, "
                         f"weights {s['weights_dtype']}, "
                         f"{'per-channel' if s['per_channel'] else 'per-tensor'}, reduce_range {s['reduce_range']}, "
                         f"operators {', '.join(s['operators_to_quantize'])})"
                         + (f" on profile {', '.join(profiles)}" if profiles else ""))
        lines.append(line)
    return lines


def ranking_lines(benchmark: dict) -> list[str]:
    """One line per measurement: groups joined by '<', tied models by '='. A model joins a
    group by tying its fastest, so two models of neighbouring groups may tie as well: those
    pairs are named, lest '<' read as 'clearly faster' between them."""
    lines = []
    for r in benchmark["rankings"]:
        groups, group_of = [], {}
        for i, g in enumerate(r["groups"]):
            step = f" ({g['vs_previous_group']['ratio']:.2f}x)" if g.get("vs_previous_group") else ""
            groups.append(" = ".join(g["models"]) + step)
            group_of.update(dict.fromkeys(g["models"], i))
        across = [f"{a} = {b}" for a, b in r.get("ties", []) if group_of.get(a) != group_of.get(b)]
        lines.append(f"{r['profile']} batch {r['batch_size']} sequence {r['sequence_length']}: "
                     + " < ".join(groups) + (f"; tied across groups: {', '.join(across)}" if across else ""))
    return lines


def render_report_md(report: dict, chart_file: str | None) -> str:
    parts = [f"# Report: {report['recipe']['name']}", ""]
    for kind, title, content in sections(report):
        parts += [f"## {title}", ""]
        if kind == "table":
            parts.append(render_markdown(content))
        elif kind == "markdown":
            parts.append(content)
        elif kind == "chart":
            parts.append(f"![Pareto chart]({chart_file})" if chart_file else "(no chart)")
        else:
            parts += [f"- {line}" for line in content]
        parts.append("")
    return "\n".join(parts)


STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;"
         "margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}"
         "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}img{max-width:100%}")


def render_report_html(report: dict, chart: bytes | None) -> str:
    """Self-contained: styles and the chart are inline, nothing is fetched."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Report: "
             f"{html.escape(report['recipe']['name'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>Report: {html.escape(report['recipe']['name'])}</h1>"]
    for kind, title, content in sections(report):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if kind == "table":
            parts.append(render_html_table(content))
        elif kind == "markdown":
            lines = [line for line in content.splitlines() if not line.startswith("|-")]
            rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
            parts.append(render_html_table((rows[0], rows[1:])))
        elif kind == "chart" and chart:
            parts.append(f"<img alt='Pareto chart' src='data:image/png;base64,{base64.b64encode(chart).decode()}'>")
        elif kind == "lines":
            parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in content) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_reports(report: dict, out_dir: Path) -> None:
    """report.json, report.md, report.html and pareto.png (when there are measurements; an
    earlier one goes), replaced together (`atomic_files`, report.json last): a stop while the
    chart renders (seconds) or the files are written leaves the earlier set; one while they
    replace it leaves no report.json, until the rerun writes the set again. Never a
    report.json beside the renderings of another."""
    chart = pareto_png(report)
    atomic_files(out_dir, {"pareto.png": chart,
                           "report.md": render_report_md(report, "pareto.png" if chart else None).encode(),
                           "report.html": render_report_html(report, chart).encode(),
                           "report.json": json_bytes(report)})
