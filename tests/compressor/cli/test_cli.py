"""The `compressor` command, run as a user runs it: `python -m compressor ...` in a subprocess.

Each subprocess spends seconds importing torch and transformers, so every command of this
module is started once, by one module fixture, a few at a time in parallel; the tests then
check the results. Bad input must end with exit code 2, exactly one line on stderr starting
with "error:", no traceback, and no output dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from compressor.cli import finetune_command as finetune_module
from compressor.cli import main
from compressor.evaluate import evaluate_path
from pretrain.data import files, load_task
from pretrain.data.overlap import overlap_warning
from pretrain.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")   # BertModel.forward's order


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"$ compressor {' '.join(self.argv)}\nexit {self.returncode}\n--- stderr\n{self.stderr[-3000:]}"


def run_cli(argv: list[str], cwd: Path) -> Result:
    # Several commands share two cores here: keep idle OpenMP threads from spinning.
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-m", "compressor", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return Result(argv, proc.returncode, proc.stdout, proc.stderr)


# Bad-input commands all run in ONE process (importing torch and transformers costs seconds a
# process), each through the same `main` that `python -m compressor` exits with, its stdout and
# stderr captured. An exception `main` lets escape is recorded as exit 1 with its traceback, so
# a test sees it as a failure. Two of them also run as real subprocesses (SUBPROCESS_CHECKED).
BATCH_RUNNER = """
import contextlib, io, json, sys, traceback
from compressor.cli import main
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except BaseException:
            traceback.print_exc()
            code = 1
    results[name] = [argv, code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""
SUBPROCESS_CHECKED = ("missing-model", "unknown-flag")


def run_in_one_process(jobs: dict[str, list[str]], cwd: Path) -> dict[str, Result]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-c", BATCH_RUNNER, json.dumps(jobs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: Result(*fields) for name, fields in json.loads(proc.stdout.splitlines()[-1]).items()}


def export_onnx(model_dir: Path, onnx_dir: Path) -> None:
    """model.onnx (opset 17, dynamic batch and sequence) + config.json + tokenizer files."""
    onnx_dir.mkdir()
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    example = {name: torch.ones((2, 7), dtype=torch.long) for name in ONNX_INPUTS}
    example["token_type_ids"].zero_()
    axes = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS} | {"logits": {0: "batch"}}
    with warnings.catch_warnings():   # the TorchScript exporter's deprecation and tracer notices
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(example[n] for n in ONNX_INPUTS), str(onnx_dir / "model.onnx"),
                          input_names=list(ONNX_INPUTS), output_names=["logits"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    for name in ("config.json", *TOKENIZER_FILES):
        shutil.copy(model_dir / name, onnx_dir / name)


def write_recipe(path: Path, model_dir: Path, variants: str, teacher_extra: str = "") -> Path:
    path.write_text(f"name: cli\nteacher:\n  model: {model_dir}\n  task: {{path: data.csv}}\n{teacher_extra}"
                    f"variants:\n{variants}", encoding="utf-8")
    return path


# name -> how to check the one-line error message (besides the common checks).
BAD_INPUT = {
    "missing-model": lambda msg: "not found" in msg and "no-such-model" in msg,
    "unsupported-family": lambda msg: "'gpt2'" in msg and "bert" in msg and "distilbert" in msg,
    "unknown-task": lambda msg: "no-such-task" in msg and "wordnet-supersense" in msg and "wordnet-wsd" in msg,
    "unknown-pass": lambda msg: "prune-everything" in msg and "drop-layers" in msg and "finetune" in msg,
    "wrong-field-type": lambda msg: "teacher.finetune.epochs" in msg and "'two'" in msg and "number" in msg,
    "missing-label-column": lambda msg: "nolabel.csv" in msg and "'label'" in msg and "category" in msg,
    "unknown-flag": lambda msg: "--bogus-flag" in msg,
    "unknown-profile": lambda msg: "'tpu'" in msg and "cpu" in msg and "gpu-cuda-fp16" in msg,
    "unknown-strategy": lambda msg: "'lora'" in msg and all(
        name in msg for name in ("'full'", "'frozen'", "'scalar-mix'", "'adapters'")),
    "intermediate-clash": lambda msg: "'clash'" in msg and "labels clash" in msg and "noun.animal" in msg,
    "missing-domain-corpus": lambda msg: "no-such-corpus.txt" in msg and "wordnet" in msg,
    "domain-steps-without-corpus": lambda msg: msg.startswith("error: --domain-steps: ") and "--domain-corpus" in msg,
    # Outputs that would lose an input or a user's files (each job names its own --out).
    "out-is-the-input": lambda msg: "would replace the input" in msg and "never modified" in msg,
    "out-holds-the-input": lambda msg: "would replace the input" in msg and "models" in msg,
    "out-inside-the-input": lambda msg: "lies inside the input" in msg and "result.json" in msg,
    "out-not-ours": lambda msg: "did not write" in msg and "export.json" in msg,
    "run-out-holds-the-teacher": lambda msg: "would replace the input" in msg and "tiny" in msg,
    "run-force-over-its-recipe": lambda msg: "would replace the input" in msg and "own.yaml" in msg,
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_bert_dir, tiny_csv, gpt2_dir):
    root = tmp_path_factory.mktemp("cli")
    recipes = root / "recipes"
    recipes.mkdir()
    shutil.copy(tiny_csv, recipes / "data.csv")       # recipes name their data relative to themselves
    nolabel = root / "nolabel.csv"
    nolabel.write_text(tiny_csv.read_text().replace("text,label", "text,category", 1))
    clash = root / "clash.csv"        # labels sharing one name (not all) with the target's
    clash.write_text("text,label\n" + "".join(f"{i},{'noun.animal' if i % 2 else 'other'}\n" for i in range(40)))
    existing = root / "existing"          # an earlier finetune output (the files that mark one)
    existing.mkdir()
    (existing / "keep.txt").write_text("precious")
    for name in finetune_module.FINETUNE_OUTPUT:
        (existing / name).write_text("{}")
    kept = root / "models" / "tiny"                 # a model a user keeps beside others
    shutil.copytree(tiny_bert_dir, kept)
    own = root / "own-recipes"                       # a user's recipe dir, given as --out with --force
    own.mkdir()
    write_recipe(own / "own.yaml", kept, "  v: []\n")

    tiny, csv = str(tiny_bert_dir), str(tiny_csv)
    quick = ["--epochs", "1", "--batch-size", "16", "--lr", "1e-3", "--quiet"]
    jobs = {
        "finetune": ["finetune", "--model", tiny, "--task", csv, "--out", str(root / "ft"), *quick],
        "finetune-default-lr": ["finetune", "--model", tiny, "--task", csv, "--out", str(root / "ft-frozen"),
                                "--strategy", "frozen", "--epochs", "1", "--batch-size", "16", "--quiet"],
        "run": ["run", str(write_recipe(recipes / "good.yaml", tiny_bert_dir,
                                        "  same: []\n  two-layers:\n    - drop-layers: {keep: [0, 1]}\n"
                                        "    - finetune: {epochs: 1, batch_size: 16}\n")),
                "--out", str(root / "run-out"), "--quiet"],
        "missing-model": ["finetune", "--model", str(root / "no-such-model"), "--task", csv],
        "unsupported-family": ["finetune", "--model", str(gpt2_dir), "--task", csv],
        "unknown-task": ["finetune", "--model", tiny, "--task", "no-such-task"],
        "unknown-pass": ["run", str(write_recipe(recipes / "bad-pass.yaml", tiny_bert_dir,
                                                 "  v:\n    - prune-everything: {}\n"))],
        "wrong-field-type": ["run", str(write_recipe(recipes / "bad-type.yaml", tiny_bert_dir, "  v: []\n",
                                                     "  finetune: {epochs: two}\n"))],
        "missing-label-column": ["finetune", "--model", tiny, "--task", str(nolabel)],
        "unknown-flag": ["finetune", "--model", tiny, "--task", csv, "--bogus-flag"],
        "unknown-profile": ["bench", "--model", tiny, "--task", csv, "--profile", "tpu"],
        "unknown-strategy": ["finetune", "--model", tiny, "--task", csv, "--strategy", "lora"],
        "intermediate-clash": ["finetune", "--model", tiny, "--task", csv, "--intermediate-task", str(clash)],
        "missing-domain-corpus": ["finetune", "--model", tiny, "--task", csv,
                                  "--domain-corpus", str(root / "no-such-corpus.txt")],
        "domain-steps-without-corpus": ["finetune", "--model", tiny, "--task", csv, "--domain-steps", "5"],
        "existing-out": ["finetune", "--model", tiny, "--task", "no-such-task", "--out", str(existing)],
        "out-is-the-input": ["finetune", "--model", str(kept), "--task", csv, "--out", str(kept)],
        "out-holds-the-input": ["export", "--model", str(kept), "--task", csv, "--out", str(root / "models")],
        "out-inside-the-input": ["bench", "--model", str(kept), "--task", csv, "--profile", "cpu",
                                 "--out", str(kept / "result.json")],
        "out-not-ours": ["export", "--model", str(kept), "--task", csv, "--out", str(existing)],
        "run-out-holds-the-teacher": ["run", str(write_recipe(recipes / "teacher-inside.yaml", kept, "  v: []\n")),
                                      "--out", str(root / "models"), "--force"],
        "run-force-over-its-recipe": ["run", str(own / "own.yaml"), "--out", str(own), "--force"],
    }
    for name in BAD_INPUT:
        if "--out" not in jobs[name]:
            jobs[name] += ["--out", str(root / f"out-{name}")]

    batched = {name: argv for name, argv in jobs.items()
               if (name in BAD_INPUT or name == "existing-out") and name not in SUBPROCESS_CHECKED}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(run_cli, argv, root) for name, argv in jobs.items() if name not in batched}
        in_one = pool.submit(run_in_one_process, batched, root)
        finetuned = futures["finetune"].result()
        if finetuned.returncode == 0:
            export_onnx(root / "ft", root / "onnx")
            futures["evaluate"] = pool.submit(
                run_cli, ["evaluate", "--model", str(root / "ft"), "--reference", str(root / "ft")], root)
            futures["evaluate-onnx"] = pool.submit(
                run_cli, ["evaluate", "--model", str(root / "onnx"), "--task", csv,
                          "--reference", str(root / "ft")], root)
            futures["bench"] = pool.submit(
                run_cli, ["bench", "--model", str(root / "onnx"), "--task", csv, "--profile", "cpu",
                          "--batch-sizes", "1,4", "--iterations", "5"], root)
        results = {name: f.result() for name, f in futures.items()} | in_one.result()
    return root, results


EXISTING = sorted(["keep.txt", *finetune_module.FINETUNE_OUTPUT])


def ok(cli, name) -> Result:
    root, results = cli
    if name not in results:
        pytest.fail(f"not run: {results['finetune']}")
    result = results[name]
    assert result.returncode == 0, str(result)
    return result


def test_finetune_writes_an_hf_dir_with_metrics(cli, tiny_task):
    root, _ = cli
    result = ok(cli, "finetune")
    out = root / "ft"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "metrics.json", "compressor.json", "tokenizer.json",
            "tokenizer_config.json", "vocab.txt"} <= names
    assert not [n for n in names if n.startswith(".")]
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {str(i): name for i, name in enumerate(tiny_task.label_names)}

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "tiny" and metrics["split"] == "test"
    assert 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["macro_f1"] <= 1
    assert metrics["samples"] == len(tiny_task.split("test"))
    assert metrics["train_seconds"] > 0
    assert metrics["train_samples"] == len(tiny_task.split("train"))
    assert metrics["strategy"] == "full" and metrics["processes"] == 1
    assert metrics["trainable_params"] == metrics["total_params"] > 0
    assert json.loads(result.stdout) == metrics              # what it printed is what it wrote
    assert metrics["lr"] == metrics["config"]["lr"] == 1e-3  # --lr 1e-3 given: it wins over full's 1e-4


def test_finetune_without_lr_records_the_strategys_default(cli):
    from pretrain.finetune import DEFAULT_LR
    root, _ = cli
    ok(cli, "finetune-default-lr")
    metrics = json.loads((root / "ft-frozen" / "metrics.json").read_text())
    assert metrics["strategy"] == "frozen"
    assert metrics["lr"] == metrics["config"]["lr"] == DEFAULT_LR["frozen"] != 1e-4


def test_lr_flag_defaults_to_none_and_help_lists_the_strategy_defaults():
    from compressor.cli.commands import build_parser, default_rates
    from pretrain.finetune import DEFAULT_LR
    args = build_parser().parse_args(["finetune", "--task", "t", "--out", "o", "--strategy", "adapters"])
    assert args.lr is None                                   # the config picks the strategy's rate
    shown = dict(pair.split() for pair in default_rates().split(", "))
    assert {strategy: float(lr) for strategy, lr in shown.items()} == DEFAULT_LR
    assert default_rates().startswith("full 1e-4, adapters 1e-3")


def test_flags_take_defaults_and_choices_from_the_configs():
    from compressor.cli.commands import build_parser
    from compressor.export.onnx import ExportSettings
    from compressor.export.quantize import StaticInt8Config
    from pretrain.finetune import FinetuneConfig
    parser = build_parser()
    ft = parser.parse_args(["finetune", "--task", "t", "--out", "o"])
    config = FinetuneConfig()
    assert (ft.epochs, ft.batch_size, ft.seed, ft.strategy, ft.embedding_updates, ft.adapter_size) == (
        config.epochs, config.batch_size, config.seed, config.strategy, config.embedding_updates,
        config.adapter_size)
    assert (ft.adapter_init_std, ft.domain_steps, ft.domain_lr) == (None, None, None)   # the config's defaults
    ex = parser.parse_args(["export", "--model", "m", "--out", "o"])
    assert (ex.parity_tolerance, ex.accuracy_tolerance) == (ExportSettings().parity_tolerance,
                                                            ExportSettings().accuracy_tolerance)
    assert ex.quantize is None and ex.calibration is None and ex.scope is None
    for mode in ("none", "dynamic-int8", "static-int8", "inc", "torch-dynamic-int8", "fp16", "int4-weight-only"):
        assert parser.parse_args(["export", "--model", "m", "--out", "o", "--quantize", mode]).quantize == mode
    for flag, field in (("--calibration", "calibration"), ("--format", "format"), ("--scope", "scope"),
                        ("--weight-type", "weight_type")):
        value = StaticInt8Config.model_fields[field].default
        assert getattr(parser.parse_args(["export", "--model", "m", "--out", "o", flag, value]), field) == value


def test_evaluate_prints_metrics_and_agreement(cli):
    root, results = cli
    result = json.loads(ok(cli, "evaluate").stdout)
    metrics = json.loads((root / "ft" / "metrics.json").read_text())
    assert result["kind"] == "torch" and result["task"] == "tiny" and result["split"] == "test"
    assert result["accuracy"] == pytest.approx(metrics["accuracy"])
    assert result["macro_f1"] == pytest.approx(metrics["macro_f1"])
    assert result["agreement"] == 1.0
    assert ok(cli, "evaluate").stderr.strip() == ""


def test_evaluate_onnx_dir_matches_torch(cli):
    torch_result = json.loads(ok(cli, "evaluate").stdout)
    onnx_result = json.loads(ok(cli, "evaluate-onnx").stdout)
    assert onnx_result["kind"] == "onnx"
    assert onnx_result["samples"] == torch_result["samples"]
    assert onnx_result["accuracy"] == torch_result["accuracy"]
    assert onnx_result["macro_f1"] == pytest.approx(torch_result["macro_f1"])
    assert onnx_result["agreement"] == 1.0


def test_run_recipe(cli):
    root, _ = cli
    result = ok(cli, "run")
    out = root / "run-out"
    report = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["same", "two-layers"]
    assert report["models"][0]["agreement"] == 1.0
    assert report["models"][1]["params"] < report["teacher"]["params"]
    for name in ("teacher", "same", "two-layers"):
        assert (out / name / "model.safetensors").is_file()
    # A summary table (its layout may change) naming every stage, then where the report is.
    lines = result.stdout.splitlines()
    assert all(any(name in line for line in lines[:-1]) for name in ("teacher", "same", "two-layers"))
    assert lines[-1] == f"report: {out / 'report.json'} (also report.md, report.html)"


def test_bench_prints_latency_memory_and_accuracy(cli):
    result = json.loads(ok(cli, "bench").stdout)
    assert result["kind"] == "onnx" and result["profile"]["name"] == "cpu" and result["samples"] == 30
    assert 0 <= result["accuracy"] <= 1 and result["size_bytes"] > 0
    assert [(row["batch_size"], row["sequence_length"]) for row in result["latency"]] == [(1, "real"), (4, "real")]
    for row in result["latency"]:
        assert row["iterations"] == 5 and 0 < row["p50_ms"] <= row["p99_ms"] and row["peak_rss_mb"] > 10
    assert result["environment"]["cpu"]["cores"] >= 1


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_is_one_error_line_exit_2(cli, name):
    root, results = cli
    result = results[name]
    assert result.returncode == 2, str(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"stderr is not exactly one line:\n{result.stderr}"
    assert lines[0].startswith("error:")
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert BAD_INPUT[name](lines[0]), lines[0]
    assert not (root / f"out-{name}").exists()


def test_outputs_refused_leave_every_input_and_file_as_it_was(cli, tiny_bert_dir):
    root, results = cli
    assert all(results[name].returncode == 2 for name in BAD_INPUT if name.startswith(("out-", "run-out")))
    kept = root / "models" / "tiny"
    assert sorted(p.name for p in (root / "models").iterdir()) == ["tiny"]
    assert sorted(p.name for p in kept.iterdir()) == sorted(p.name for p in tiny_bert_dir.iterdir())
    assert (kept / "model.safetensors").read_bytes() == (tiny_bert_dir / "model.safetensors").read_bytes()
    assert sorted(p.name for p in (root / "existing").iterdir()) == EXISTING
    assert [p.name for p in (root / "own-recipes").iterdir()] == ["own.yaml"]


def test_failing_finetune_leaves_an_existing_out_dir_alone(cli):
    root, results = cli
    result = results["existing-out"]
    assert result.returncode == 2 and result.stderr.startswith("error: unknown task"), str(result)
    assert sorted(p.name for p in (root / "existing").iterdir()) == EXISTING
    assert (root / "existing" / "keep.txt").read_text() == "precious"
    assert not [p for p in root.iterdir() if p.name.startswith(".existing")]


# --- in-process checks of edge cases (no subprocess: nothing is imported again) ---

@pytest.mark.parametrize("value", ["0", "-1"])
def test_evaluate_rejects_non_positive_max_samples(cli, capsys, value):
    root, _ = cli
    ok(cli, "finetune")
    code = main(["evaluate", "--model", str(root / "ft"), "--max-samples", value])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.startswith("error:")


def test_a_file_with_repeated_rows_gets_one_stderr_line_for_each_overlap(tiny_bert_dir, tiny_csv, tmp_path, capsys):
    """Test rows repeating train rows inflated the accuracy these commands print, unsaid; then
    they were said twice, by the load-time line (files.py) and the scored split's line
    (overlap.py). Now the scored split's line alone counts its train texts, the load-time line
    the other overlaps, on stderr (stdout stays the JSON), and the exit code is 0. Each
    command runs in a process of its own, which prints the load-time line afresh."""
    header, *rows = tiny_csv.read_text().splitlines()
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([header, *rows, *rows[:100]]) + "\n")       # 100 rows twice: in two splits, some
    files._WARNED.clear()
    task = load_task(str(twice))
    capsys.readouterr()
    texts = {name: set(task.split(name).texts) for name in ("train", "validation", "test")}

    def held_out_line(other: str, scored: str) -> str:
        shared = len(texts[other] & (texts["train"] | texts[scored]))
        assert shared > 0
        return (f"warning: {twice}: {shared} {other} text(s) also occur in the train or {scored} split (duplicate "
                "rows); expected each once (drop the duplicate rows)")

    def scored_line(overlap: dict, split: str) -> str:
        assert overlap[split]["in_train"] > 0
        return f"warning: {overlap_warning(split, overlap[split], pair_task=False)}"

    def stderr_of(argv: list[str]) -> tuple[dict, list[str]]:
        files._WARNED.clear()
        assert main(argv) == 0, argv
        captured = capsys.readouterr()
        return (json.loads(captured.out) if captured.out.startswith("{") else {}), captured.err.splitlines()

    evaluate = ["evaluate", "--model", str(tiny_bert_dir), "--task", str(twice)]
    for split, other in (("test", "validation"), ("validation", "test")):
        result, err = stderr_of([*evaluate, "--split", split])
        assert err == [held_out_line(other, split), scored_line(result["texts_in_train"], split)], split
    in_two = len([t for t in set().union(*texts.values()) if sum(t in part for part in texts.values()) > 1])
    assert stderr_of([*evaluate, "--split", "train"])[1] == [   # scores nothing held out: the load-time line says all
        f"warning: {twice}: {in_two} text(s) occur in more than one of the train, validation and test splits "
        "(duplicate rows), so validation and test accuracy count examples seen in training; expected each once "
        "(drop the duplicate rows)"]
    metrics, err = stderr_of(["finetune", "--model", str(tiny_bert_dir), "--task", str(twice), "--out",
                              str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "16", "--max-train-samples", "16",
                              "--quiet"])
    assert err == [held_out_line("validation", "test"), scored_line(metrics["texts_in_train"], "test")]
    (tmp_path / "data.csv").write_text(twice.read_text())
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_bert_dir, "  same: []\n")
    _, err = stderr_of(["run", str(recipe), "--out", str(tmp_path / "run"), "--quiet"])
    data = json.loads((tmp_path / "run" / "report.json").read_text())["data"]
    overlap_lines = [line for line in err if "commonest" not in line]   # the tiny model's other warning
    assert overlap_lines == [held_out_line("validation", "test").replace(str(twice), str(tmp_path / "data.csv")),
                             scored_line(data["texts_in_train"], "test")]
    assert main(["evaluate", "--model", str(tiny_bert_dir), "--task", str(tiny_csv)]) == 0
    assert capsys.readouterr().err == ""                                  # distinct texts: not a word


@pytest.mark.parametrize("argv", [["export", "--model", "minilm", "--out", "{tmp}/x"],
                                  ["evaluate", "--model", "minilm"],
                                  ["bench", "--model", "minilm"]])
def test_the_bundled_encoder_where_a_classifier_is_needed_says_to_fine_tune_first(argv, tmp_path, capsys):
    code = main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert "minilm is the bundled pretrained encoder" in err and "compressor finetune --model minilm" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["evaluate", "export", "bench"])
@pytest.mark.parametrize("value, expected", [("0", "argument --max-length: expected a positive integer"),
                                             ("129", "--max-length 129: expected a positive number of tokens, at "
                                                     "most the 128 position embeddings"),
                                             # [CLS] [SEP] and no text: the tokenizer cut nothing at 1 or 2
                                             ("2", "--max-length 2: expected at least 3 tokens for ")])
def test_a_max_length_the_model_cannot_run_at_is_one_line_exit_2(command, value, expected, tiny_bert_dir, tiny_csv,
                                                                  tmp_path, capsys):
    argv = [command, "--model", str(tiny_bert_dir), "--task", str(tiny_csv), "--max-length", value]
    argv += {"export": ["--out", str(tmp_path / "out")], "bench": ["--out", str(tmp_path / "bench.json")]}.get(
        command, [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("step, message", [
    ("{finetune: {max_length: 4}}", "variants.v[0].finetune.max_length: expected an integer from 8 to 512 (got 4)"),
    ("{prune-heads: {fraction: 1.5}}", "variants.v[0].prune-heads.fraction: expected a number in [0, 1) (got 1.5)"),
    ("{quantize: {mode: inc, tolerable_loss: [0.1]}}",
     "variants.v[0].quantize.tolerable_loss: expected a number in [0, 1] (got a list)"),
])
def test_a_recipe_number_out_of_range_or_of_the_wrong_type_is_one_line_exit_2(step, message, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nteacher: {{model: minilm, task: wordnet-supersense}}\nvariants:\n  v: [{step}]\n")
    assert main(["run", str(recipe), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {recipe}: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


@pytest.mark.parametrize("flags, message", [
    # refused as argparse reads them, the value as typed (not the 5.0 the config was given)
    (["--tolerable-loss", "5"], "compressor export: argument --tolerable-loss: expected a number in [0, 1] (got 5)"),
    (["--parity-tolerance", "0"], "compressor export: argument --parity-tolerance: expected a positive number (got 0)"),
])
def test_an_export_number_flag_out_of_range_says_what_it_takes(flags, message, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_bert_dir), "--out", str(out), "--quantize", "inc", *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


@pytest.mark.parametrize("flag, value, expected", [
    ("--batch-sizes", "1,x", "expected comma-separated positive integers (e.g. 1,8), got '1,x'"),
    ("--batch-sizes", ",", "expected comma-separated positive integers (e.g. 1,8), got ','"),
    ("--batch-sizes", "1,0", "got '1,0'"),
    ("--sequence-lengths", "real,abc", "integers >= 2 or 'real' (e.g. real,128), got 'real,abc'"),
    ("--sequence-lengths", "real,1", "integers >= 2 or 'real' (e.g. real,128), got 'real,1'"),   # no [CLS] [SEP]
    ("--iterations", "ten", "expected a positive integer from 1 to 10000 (got 'ten')"),
    ("--iterations", "99999999999999999999", "expected a positive integer from 1 to 10000"),
])
def test_list_and_count_flags_say_what_they_expect(capsys, flag, value, expected):
    assert main(["bench", "--model", "m", "--profile", "cpu", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: compressor bench: argument {flag}: ") and expected in err


def test_run_force_over_the_dir_of_its_own_recipe_names_the_recipe_first(tmp_path, capsys):
    """--force would clear the dir the recipe file lies in: refused as the run's other --out
    errors are, the recipe file first."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nteacher: {model: minilm, task: wordnet-supersense}\nvariants: {v: []}\n")
    assert main(["run", str(recipe), "--out", str(tmp_path), "--force"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {recipe}: --out {tmp_path} holds the input {recipe}: "), line
    assert [p.name for p in tmp_path.iterdir()] == ["r.yaml"]


SEEDED = [["evaluate", "--model", "m"], ["export", "--model", "m", "--out", "o"], ["bench", "--model", "m"],
          ["embeddings", "--corpus", "c", "--out", "o"]]
THREADED = [["search", "--teacher", "t", "--out", "o"], ["finetune", "--out", "o"],
            ["pretrain", "--corpus", "c", "--out", "o"]]          # these take --seed too


@pytest.mark.parametrize("argv, flag, value, expected", [
    *[(argv, "--seed", value, expected) for argv in SEEDED + THREADED for value, expected in (
        ("-1", "expected a seed from 0 to 4294967295 (got -1)"),
        ("99999999999999999999", "expected a seed from 0 to 4294967295"))],
    *[(argv, "--threads", "99999999999999999999", "expected a thread count from 1 to 1024") for argv in THREADED],
])
def test_seeds_and_thread_counts_out_of_range_are_one_line_errors(capsys, tmp_path, argv, flag, value, expected):
    """A negative seed drew another seed's splits (random.Random ignores the sign); one past
    2**63 or a thread count past what torch takes raised a traceback."""
    assert main([*argv, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {flag}: {expected}" in err
    assert list(tmp_path.iterdir()) == []


def test_bench_out_replaces_only_an_earlier_bench_result(tmp_path):
    from compressor.cli.bench_command import RESULT_KEYS, check_earlier_result
    mine = tmp_path / "notes.json"
    for text in ('{"mine": 1}', "plain notes", '[1, 2]'):
        mine.write_text(text)
        with pytest.raises(UserError, match="is a file `compressor bench` did not write"):
            check_earlier_result(mine)
        assert mine.read_text() == text
    earlier = tmp_path / "result.json"
    earlier.write_text(json.dumps({key: None for key in RESULT_KEYS}))
    check_earlier_result(earlier)
    check_earlier_result(tmp_path / "new.json")


def test_an_input_of_the_wrong_kind_is_named_as_such_not_as_missing(tmp_path, capsys):
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    (tmp_path / "data.csv").mkdir()
    (tmp_path / "recipe").mkdir()
    cases = [(["finetune", "--model", str(tmp_path / "model.onnx"), "--task", "wordnet-supersense"],
              "is a file; expected a Hugging Face model dir"),
             (["finetune", "--task", str(tmp_path / "data.csv")], "a directory; expected a data file"),
             (["run", str(tmp_path / "recipe")], "is a directory; expected a recipe .yaml file")]
    for argv, expected in cases:
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err and "not found" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_label_mismatch_counts_what_is_missing(tiny_task):
    from compressor.evaluate import label_permutation
    with pytest.raises(UserError, match=r"the model lacks 3 of the task's 4 labels \(e.g. \[") as err:
        label_permutation(("other", tiny_task.label_names[0]), tiny_task)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"the task lacks 1 of the model's labels \(e.g. \['other'\]\)"):
        label_permutation(("other", *tiny_task.label_names), tiny_task)


def test_recorded_relative_task_path_still_works_from_another_dir(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(tiny_csv, work / "data.csv")
    monkeypatch.chdir(work)
    monkeypatch.setattr(finetune_module, "set_threads", lambda threads: None)
    finetune_module.finetune_command(str(tiny_bert_dir), {"path": "data.csv"}, tmp_path / "ft",
                                     {"epochs": 0.1, "batch_size": 16}, show_progress=False)
    monkeypatch.chdir(tmp_path)
    try:
        result = evaluate_path(str(tmp_path / "ft"), None)
    except UserError as err:
        pytest.fail(f"evaluate from another dir failed: {err}")
    assert result["samples"] == 30


@pytest.mark.parametrize("command", [["evaluate"], ["export", "--out", "onnx"], ["bench", "--iterations", "1"]])
def test_a_recorded_task_file_that_is_gone_is_named_as_the_models_record(command, tiny_bert_dir, tmp_path,
                                                                          monkeypatch, capsys):
    # "data file not found" named a path the user never typed: the model's record of it.
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    gone = tmp_path / "moved.csv"
    (model / "compressor.json").write_text(json.dumps({"task": {"path": str(gone)}, "task_seed": 0}))
    monkeypatch.chdir(tmp_path)
    assert main([command[0], "--model", str(model), *command[1:]]) == 2
    assert capsys.readouterr().err == (f"error: {model} records its task's data file {gone}, which is not there "
                                       "(moved or deleted?); expected --task naming the task's file where it is now\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_an_interrupted_command_says_what_it_left_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    from compressor.cli import export_command as export_module
    from pretrain.resume import checkpoint_dir

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(finetune_module, "finetune_command", interrupted)
    monkeypatch.setattr(export_module, "export_command", interrupted)
    out = tmp_path / "ft"
    finetune = ["finetune", "--model", "minilm", "--task", "wordnet-supersense", "--out", str(out)]
    assert main(finetune) == 130
    assert capsys.readouterr().err == f"interrupted: nothing was written to {out}\n"   # before any checkpoint
    checkpoint_dir(out).mkdir()
    (checkpoint_dir(out) / "checkpoint.pt").write_bytes(b"")
    assert main(finetune) == 130
    assert capsys.readouterr().err == (f"interrupted: the last checkpoint is in {checkpoint_dir(out)}; rerun the "
                                       "same command with --resume to continue\n")
    assert main(["export", "--model", "m", "--out", str(tmp_path / "x")]) == 130
    assert capsys.readouterr().err == f"interrupted: nothing was written to {tmp_path / 'x'}\n"


def test_a_stop_while_the_libraries_import_is_one_line_too(monkeypatch, capsys):
    """Ctrl-C in the first seconds, while torch and transformers import, ended in a traceback."""
    from compressor.cli import commands

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(commands, "quiet_libraries", interrupted)
    assert main(["export", "--model", "m", "--out", "x"]) == 130
    assert capsys.readouterr().err == "interrupted: nothing was written\n"


# Run as `python -m compressor`, with a Ctrl-C arriving while the command's modules import.
STOPPED_WHILE_IMPORTING = """
import runpy, sys
class Interrupting:
    def find_spec(self, name, path=None, target=None):
        if name == "compressor.cli.commands":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupting())
sys.argv = ["compressor", "--version"]
runpy.run_module("compressor", run_name="__main__", alter_sys=True)
"""


def test_a_stop_while_the_command_imports_is_one_line_and_exit_130():
    """pydantic and logging imported before main could catch a Ctrl-C: a traceback, and the
    process died of the signal (-2). Also what the `compressor` script calls (pyproject.toml)."""
    import tomllib
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", STOPPED_WHILE_IMPORTING], cwd=root, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert (proc.returncode, proc.stderr) == (130, "interrupted: nothing was written\n")
    script = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["compressor"]
    assert script == "compressor.cli:main"      # the function run above


# A stop as `python -m compressor` imports the command's modules, sent by a sitecustomize (which
# Python runs before the command): the command started as a user starts it.
STOP_WHILE_IMPORTING = """
import os, signal, sys, time
class Stopping:
    started = False
    def find_spec(self, name, path=None, target=None):
        Stopping.started = Stopping.started or name == "compressor.cli.commands"
        if Stopping.started and name == "{module}":
            sys.meta_path.remove(self)
{stop}
sys.meta_path.insert(0, Stopping())
"""


def run_stopped_while_importing(tmp_path: Path, stop: str, module: str = "compressor.cli.commands"
                                ) -> subprocess.CompletedProcess:
    """The stop runs as `module` is looked for, once commands.py has begun to import."""
    site = STOP_WHILE_IMPORTING.replace("{module}", module).replace("{stop}", textwrap.indent(stop, " " * 12))
    (tmp_path / "sitecustomize.py").write_text(site)
    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, "-m", "compressor", "--version"], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})


def test_a_sigterm_while_the_command_imports_is_one_line_and_exit_143(tmp_path):
    """SIGTERM's handler came with the command's, after pydantic and logging imported: one in
    the first ~0.3 s killed the process with no line (-15)."""
    proc = run_stopped_while_importing(tmp_path, "os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)")
    assert (proc.returncode, proc.stderr) == (143, "terminated: nothing was written\n")


def test_a_ctrl_c_inside_an_exec_while_the_command_imports_exits_130(tmp_path):
    """A Ctrl-C landing in an exec'd string, as every @dataclass makes (pydantic's, at import),
    printed its line, and Python 3.11 then ended the process by SIGINT (-2), not 130."""
    proc = run_stopped_while_importing(tmp_path, 'exec("os.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass")')
    assert (proc.returncode, proc.stderr) == (130, "interrupted: nothing was written\n")


# A class whose attribute's __set_name__ (functools.cached_property has one) is cut short by a stop.
STOP_AS_A_CLASS_IS_MADE = """
class Slow:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIG{name}); time.sleep(60)
type("Made", (), {"cache": Slow()})
"""


@pytest.mark.parametrize("name, code, line", [("INT", 130, "interrupted"), ("TERM", 143, "terminated")])
def test_a_stop_as_a_class_is_made_while_the_command_imports_is_one_line(tmp_path, name, code, line):
    """Python 3.11 wraps an exception raised in a __set_name__ in a RuntimeError: a traceback, exit 1."""
    proc = run_stopped_while_importing(tmp_path, STOP_AS_A_CLASS_IS_MADE.replace("{name}", name))
    assert (proc.returncode, proc.stderr) == (code, f"{line}: nothing was written\n")


def test_a_ctrl_c_as_pydantic_core_starts_is_one_line_and_exit_130(tmp_path):
    """pydantic-core, its import of `datetime` cut short, panicked: pyo3's PanicException, the
    Ctrl-C lost, a traceback and exit 1. (Rust's own panic message, printed before, stays.)"""
    proc = run_stopped_while_importing(tmp_path, "os.kill(os.getpid(), signal.SIGINT); time.sleep(60)", "datetime")
    assert proc.returncode == 130
    assert proc.stderr.endswith("\ninterrupted: nothing was written\n") and "Traceback" not in proc.stderr


# A command under torchrun that would run for ten minutes: its export is a sleep.
UNDER_TORCHRUN = """
import sys, time
from compressor.cli import export_command, main
def slow(*args, **kwargs):
    print("exporting", flush=True)
    time.sleep(600)
export_command.export_command = slow
sys.exit(main(["export", "--model", "m", "--out", sys.argv[1]]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_command_under_torchrun_stops_in_order_when_torchrun_is_killed(tmp_path):
    """torchrun passes on its own Ctrl-C or SIGTERM; killed by SIGKILL, its workers ran on to the end."""
    from tests.pretrain.test_child_process import children_running, ended_within, kill_left
    root = Path(__file__).resolve().parents[3]
    (tmp_path / "worker.py").write_text(UNDER_TORCHRUN)
    torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                                 str(tmp_path / "worker.py"), str(tmp_path / "out")], cwd=root,
                                env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        assert torchrun.stdout.readline() == "exporting\n"
        workers = children_running(torchrun.pid, b"worker.py")
        torchrun.kill()
        torchrun.wait(timeout=30)
        assert len(workers) == 1 and ended_within(workers[0], 10)
        assert f"terminated: nothing was written to {tmp_path / 'out'}\n" in torchrun.stderr.read()
    finally:
        torchrun.kill()
        for worker in workers:
            kill_left(worker)


# A command stopped, and stopped again while it says so (its own process: a stop that escapes
# main would end pytest's session).
STOPPED_TWICE = """
import os, signal, sys
from compressor.cli import commands
commands.quiet_libraries()       # as main does before the command's modules import
from compressor.cli import export_command
def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
def stopped_again(args):         # the user's second Ctrl-C, and a SIGTERM, as the line is written
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    return "nothing was written"
export_command.export_command = interrupted
commands.after_interrupt = stopped_again
sys.exit(commands.main(["export", "--model", "m", "--out", "x"]))
"""


def test_a_second_stop_while_the_first_is_reported_keeps_one_line_and_its_exit_code():
    """Ctrl-C pressed again and again (export, 14 s in): the second one landed as the first
    one's line was printed, and the command ended in a traceback after it, killed by the signal."""
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", STOPPED_TWICE], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert (proc.returncode, proc.stderr) == (130, "interrupted: nothing was written\n")


# Run as `python -m compressor`, with a stop arriving as the interpreter exits after the command.
STOPPED_WHILE_EXITING = """
import atexit, os, runpy, signal, sys, time
def stop():        # registered before the command runs: called after the at-exit calls it registers
    os.kill(os.getpid(), signal.SIG{name})
    time.sleep(0.5)
atexit.register(stop)
sys.argv = ["compressor", "--version"]
runpy.run_module("compressor", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_a_stop_while_the_interpreter_exits_after_a_command_keeps_its_exit_code(name):
    """A bench wrote its --out and printed its JSON; the interpreter then took 3 s to unload
    torch and ONNX Runtime, and a Ctrl-C or SIGTERM in those seconds ended the finished command
    by the signal (-2 or -15: 130 or 143 in a shell), with no line saying what it left."""
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", STOPPED_WHILE_EXITING.replace("{name}", name)], cwd=root,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("compressor ")


@pytest.mark.parametrize("command", ["export", "bench", "tokenizer", "embeddings"])
def test_a_second_command_writing_the_same_output_is_refused(command, tiny_bert_dir, tiny_csv, tmp_path, capsys):
    """Two exports into one --out both exited 0, and one's output was silently lost (the last
    rename won). A live writer's temporary beside the output (`.NAME.tmp-*`) refuses the second."""
    import fcntl
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a few words of text\n\nand a second document\n")
    out = tmp_path / ("out.json" if command == "bench" else "out")
    argv = {"export": ["export", "--model", str(tiny_bert_dir), "--task", str(tiny_csv)],
            "bench": ["bench", "--model", str(tiny_bert_dir), "--task", str(tiny_csv), "--iterations", "1"],
            "tokenizer": ["tokenizer", "--corpus", str(corpus), "--vocab-size", "100"],
            "embeddings": ["embeddings", "--corpus", str(corpus), "--steps", "1"]}[command]
    writing = tmp_path / f".{out.name}.tmp-an0th3r"         # as another command's, locked while it writes
    writing.mkdir()
    held = os.open(writing, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        assert main([*argv, "--out", str(out)]) == 2
    finally:
        os.close(held)
    assert capsys.readouterr().err == (f"error: --out {out} is in use by another command writing the same output; "
                                       "wait for it to finish, or choose another --out\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["corpus.txt", writing.name])


def running(command: str, out: Path) -> contextlib.AbstractContextManager:
    """What a running `command` holds on its --out, from its start to its end."""
    from compressor.pipeline.outdir import exclusive_use
    from pretrain.atomic import claimed_output
    from pretrain.resume import claimed_checkpoint
    return {"export": lambda: claimed_output(out),
            "finetune": lambda: claimed_checkpoint(out, {"model": "m"}, False, "finetune_settings.json"),
            "run": lambda: exclusive_use(out)}[command]()


# What the first command leaves in the parent of --out (`out` there) once it ends, without
# ever writing its output (the refused one adds nothing).
LEFT_BY = {"export": [], "finetune": ["out.checkpoint", "out.checkpoint/finetune_settings.json"],
           "run": ["out", "out/.lock"]}


@pytest.mark.parametrize("first, second", [("export", "finetune"), ("finetune", "export"), ("run", "export"),
                                           ("export", "run"), ("finetune", "run"), ("run", "finetune"),
                                           ("run", "pretrain"), ("finetune", "tokenizer"), ("export", "search")])
def test_a_command_writing_the_output_another_command_writes_is_refused(first, second, tiny_bert_dir, tiny_csv,
                                                                        tmp_path, monkeypatch, capsys):
    """An export and a finetune into one --out, started together, both ran: finetune held its
    checkpoint dir, export a claim beside the output, and neither looked for the other's (nor
    did a run, holding its dir's .lock). Every command writing an --out now takes the same
    claim, so the second one stops in one line, whichever commands they are. The first starts
    just after the second has checked its output (both found it free), or before a `run` or
    `search`, which check nothing there."""
    from compressor.cli import export_command, pretrain_command
    inputs, out = tmp_path / "inputs", tmp_path / "work" / "out"
    inputs.mkdir()
    corpus = inputs / "corpus.txt"
    corpus.write_text("a few words of text\n\nand a second document\n")
    recipe = inputs / "recipe.yaml"
    recipe.write_text(json.dumps({"name": "tiny", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
                                  "data": {"max_train_samples": 16, "max_eval_samples": 16}, "variants": {"same": []}}))
    argv = {"finetune": ["finetune", "--model", str(tiny_bert_dir), "--task", str(tiny_csv), "--epochs", "1",
                         "--max-train-samples", "16", "--max-eval-samples", "16", "--quiet"],
            "export": ["export", "--model", str(tiny_bert_dir), "--task", str(tiny_csv), "--max-eval-samples", "16"],
            "run": ["run", str(recipe), "--quiet"],
            "pretrain": ["pretrain", "--objective", "mlm", "--corpus", str(corpus), "--size", "tiny", "--steps", "1",
                         "--tokenizer", str(tiny_bert_dir), "--quiet"],
            "tokenizer": ["tokenizer", "--corpus", str(corpus), "--vocab-size", "100"],
            "search": ["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--profile", "cpu",
                       "--latency-budget-ms", "1000", "--precisions", "fp32", "--max-trials", "1", "--quiet"]}[second]
    with contextlib.ExitStack() as first_command:
        checks = {"finetune": finetune_module, "export": export_command, "pretrain": pretrain_command,
                  "tokenizer": pretrain_command}.get(second)
        if checks is None:
            first_command.enter_context(running(first, out))
        else:
            checked = checks.check_output

            def then_the_first_starts(*args, **kwargs):
                checked(*args, **kwargs)
                first_command.enter_context(running(first, out))
            monkeypatch.setattr(checks, "check_output", then_the_first_starts)
        assert main([*argv, "--out", str(out)]) == 2
    recipe_first = f"{recipe}: " if second == "run" else ""     # a run's --out refusals name its recipe
    assert capsys.readouterr().err == (f"error: {recipe_first}--out {out} is in use by another command writing the "
                                       "same output; wait for it to finish, or choose another --out\n")
    left = sorted(str(path.relative_to(out.parent)) for path in out.parent.rglob("*")) if out.parent.exists() else []
    assert left == LEFT_BY[first]


@pytest.mark.parametrize("failure, said", [
    (OSError(28, "No space left on device", "x/model.onnx"), "No space left on device"),
    (RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file data/0: "
                  "file write failed"), "is the disk full?"),
    (OSError(30, "Read-only file system"), "Read-only file system"),
])
def test_a_write_the_disk_refuses_mid_command_is_one_line_exit_2(failure, said, tmp_path, monkeypatch, capsys):
    """finetune, export and bench wrote nothing through `disk_errors`: a full disk ended in a
    traceback (torch.save's own error names no cause at all)."""
    from compressor.cli import export_command as export_module

    def refused(*args, **kwargs):
        raise failure
    monkeypatch.setattr(export_module, "export_command", refused)
    assert main(["export", "--model", "m", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {tmp_path / 'x'}: ") and said in err and err.count("\n") == 1
    monkeypatch.setattr(export_module, "export_command", lambda *a, **k: 1 / 0)   # not a write: still a bug
    with pytest.raises(ZeroDivisionError):
        main(["export", "--model", "m", "--out", str(tmp_path / "x")])


def test_version_prints_one_line_with_the_libraries_and_exits_0(capsys):
    from importlib.metadata import version

    from compressor import __version__
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"compressor {__version__} (python ")
    assert f"torch {version('torch')}" in out and f"onnxruntime {version('onnxruntime')}" in out


def test_sigterm_stops_a_command_in_order_with_exit_143(tmp_path, monkeypatch, capsys):
    """A job scheduler's SIGTERM: the same orderly stop as Ctrl-C (temporaries removed, the
    checkpoint kept), exit 143; the process's own SIGTERM handler is put back afterwards."""
    import signal

    from pretrain.atomic import atomic_dir

    def export_then_terminated(model, out, *args, **kwargs):
        with atomic_dir(out):                          # half way through writing the output
            os.kill(os.getpid(), signal.SIGTERM)
    from compressor.cli import export_command as export_module
    monkeypatch.setattr(export_module, "export_command", export_then_terminated)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "x"
    assert main(["export", "--model", "m", "--out", str(out)]) == 143
    assert capsys.readouterr().err == f"terminated: nothing was written to {out}\n"
    assert list(tmp_path.iterdir()) == []                # no temporary left beside it
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_says_which_stages_it_reused_and_which_it_built(cli, capsys):
    """A rerun of the fixture's recipe: every stage comes from the cache, one stderr line each;
    --quiet hides them; nothing of the logging set-up outlives the command."""
    import logging
    root, _ = cli
    ok(cli, "run")
    argv = ["run", str(root / "recipes" / "good.yaml"), "--out", str(root / "run-out")]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if line.startswith("stage ")] == [
        "stage teacher: cached", "stage same: cached", "stage two-layers: cached"]
    assert main([*argv, "--quiet"]) == 0
    assert "stage " not in capsys.readouterr().err
    assert logging.getLogger("compressor.pipeline").handlers == []


def test_run_prints_report_warnings_on_stderr_and_only_results_on_stdout(tmp_path, monkeypatch, capsys):
    # A script reading stdout gets the results alone; a warning is a note to the person.
    import compressor.pipeline as pipeline
    import compressor.report.render as render
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nteacher: {model: minilm, task: wordnet-supersense}\nvariants: {a: []}\n")
    report = {"warnings": ["sensitive-int8 is 66% smaller than expected"], "teacher": {}, "models": []}
    monkeypatch.setattr(pipeline, "run_recipe", lambda *args, **kwargs: report)
    monkeypatch.setattr(render, "markdown_table", lambda report: "| table |")
    monkeypatch.setattr(render, "exports_table", lambda report: "")
    assert main(["run", str(recipe), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "warning:" not in out and out.splitlines()[0] == "| table |"
    assert err.splitlines() == ["warning: sensitive-int8 is 66% smaller than expected"]
