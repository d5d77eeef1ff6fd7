"""`compressor export` and `compressor evaluate` on exports.

A user's run (a quantized export) and two bad inputs go through subprocesses, started
together by one module fixture as in tests/compressor/cli/test_cli.py; the other cases call the
same `main` in-process, which skips seconds of imports per command.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pretrain.models
from compressor.bundle import ModelBundle
from compressor.cli import export_command
from compressor.cli import main
from compressor.export.quantize import QuantizeConfig
from compressor.passes import Context, apply_pass


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "compressor", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# name -> what the one error line must mention.
BAD_INPUT = {
    "corrupted-onnx": ["cannot load ONNX model", "model.onnx"],
    "unsupported-family": ["'gpt2'", "not supported", "distilbert"],
    "option-of-another-mode": ["--calibration applies to quantize mode static-int8, not dynamic-int8"],
    "onnx-as-source": ["is an ONNX model", "model.safetensors"],
    "options-without-quantize": ["--per-channel", "only meaningful with a --quantize mode"],
    "linears-as-qoperator": ["--scope linears writes a QDQ graph; expected --format qdq with it, or --scope ops"],
    "skip-layernorm-unfused-graph": ["--skip-layernorm", "only meaningful with --optimize"],
}
IN_SUBPROCESS = ("int8", "corrupted-onnx", "unsupported-family")


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_bert_dir, tiny_csv, tiny_task, gpt2_dir):
    root = tmp_path_factory.mktemp("export-cli")
    corrupted = root / "corrupted"
    corrupted.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (corrupted / name).write_bytes((tiny_bert_dir / name).read_bytes())
    (corrupted / "model.onnx").write_bytes(b"\x08\x07 not a protobuf at all")
    recorded = root / "recorded"    # a model whose `quantize` pass asked for dynamic int8
    quantized = apply_pass(ModelBundle.load(tiny_bert_dir), "quantize", QuantizeConfig(),
                           Context(task=tiny_task, show_progress=False))
    quantized.save(recorded)

    tiny, csv = str(tiny_bert_dir), str(tiny_csv)
    jobs = {
        "fp32": ["export", "--model", tiny, "--task", csv, "--out", str(root / "fp32"), "--optimize"],
        "int8": ["export", "--model", tiny, "--task", csv, "--out", str(root / "int8"), "--optimize",
                 "--quantize", "dynamic-int8", "--per-channel", "--accuracy-tolerance", "1"],
        "corrupted-onnx": ["evaluate", "--model", str(corrupted), "--task", csv],
        "unsupported-family": ["export", "--model", str(gpt2_dir), "--task", csv],
        "option-of-another-mode": ["export", "--model", tiny, "--task", csv, "--quantize", "dynamic-int8",
                                   "--calibration", "percentile"],
        "onnx-as-source": ["export", "--model", str(corrupted), "--task", csv],
        "options-without-quantize": ["export", "--model", tiny, "--task", csv, "--per-channel"],
        "linears-as-qoperator": ["export", "--model", tiny, "--task", csv, "--quantize", "static-int8",
                                 "--scope", "linears", "--format", "qoperator"],
        "skip-layernorm-unfused-graph": ["export", "--model", tiny, "--task", csv, "--skip-layernorm", "fused"],
        "as-recorded": ["export", "--model", str(recorded), "--task", csv, "--out", str(root / "as-recorded"),
                        "--accuracy-tolerance", "1"],
        "forced-fp32": ["export", "--model", str(recorded), "--task", csv, "--out", str(root / "forced-fp32"),
                        "--quantize", "none"],
        "at-length": ["export", "--model", tiny, "--task", csv, "--out", str(root / "at-length"), "--max-length", "40"],
    }
    for name in BAD_INPUT:
        if jobs[name][0] == "export":
            jobs[name] += ["--out", str(root / f"out-{name}")]
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(run_cli, jobs[name], root) for name in IN_SUBPROCESS}
        results = {name: in_process(argv) for name, argv in jobs.items() if name not in IN_SUBPROCESS}
        results |= {name: f.result() for name, f in futures.items()}
    if results["int8"].returncode == 0:    # `compressor evaluate` on a quantized export
        results["evaluate-int8"] = in_process(["evaluate", "--model", str(root / "int8"),
                                               "--reference", str(root / "fp32")])
    return root, results


def in_process(argv: list[str]) -> subprocess.CompletedProcess:
    """`main(argv)` with its stdout and stderr captured, shaped like a subprocess result."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as mp:
        for module in (export_command, pretrain.models):    # keep the tests' one torch thread
            mp.setattr(module, "set_threads", lambda threads: None)
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def ok(cli, name) -> subprocess.CompletedProcess:
    result = cli[1][name]
    assert result.returncode == 0, f"{result.args}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.parametrize("name, precision", [("fp32", "fp32"), ("int8", "dynamic-int8")])
def test_export_writes_a_gated_dir_and_prints_its_record(cli, tiny_task, name, precision):
    root, _ = cli
    printed = json.loads(ok(cli, name).stdout)
    assert printed == json.loads((root / name / "export.json").read_text())
    assert printed["path"] == str(root / name) and printed["precision"] == precision
    assert printed["optimized"] and printed["fusions"]["Attention"] == 3   # the last layer runs the first token alone
    assert printed["parity_max_abs_diff"] <= 1e-4 and printed["eval_samples"] == len(tiny_task.split("test"))
    assert not [p for p in root.iterdir() if p.name.startswith(f".{name}")]


def test_evaluate_reads_a_quantized_export(cli):
    root, _ = cli
    result = json.loads(ok(cli, "evaluate-int8").stdout)
    record = json.loads((root / "int8" / "export.json").read_text())
    assert result["kind"] == "onnx" and result["task"] == "tiny"     # the task recorded at export
    assert result["accuracy"] == record["accuracy"]
    assert result["agreement"] == pytest.approx(record["agreement_with_fp32"])


@pytest.mark.parametrize("name, precision", [("as-recorded", "dynamic-int8"), ("forced-fp32", "fp32")])
def test_quantization_defaults_to_what_the_model_records(cli, name, precision):
    assert json.loads(ok(cli, name).stdout)["precision"] == precision


def test_max_length_sets_the_length_an_export_is_gated_at_and_ships(cli):
    """export had no --max-length: an export was always gated at the length its model records."""
    from transformers import AutoTokenizer
    from compressor.evaluate import load_predictor
    root, _ = cli
    assert json.loads(ok(cli, "at-length").stdout)["max_length"] == 40
    assert json.loads((root / "at-length" / "compressor.json").read_text())["max_length"] == 40
    assert AutoTokenizer.from_pretrained(str(root / "at-length")).model_max_length == 40
    assert load_predictor(root / "at-length").max_length == 40
    longer = load_predictor(root / "at-length", 100)      # past the shipped tokenizer's cap, within the positions
    assert longer.max_length == longer.tokenizer.model_max_length == 100
    assert json.loads(ok(cli, "fp32").stdout)["max_length"] == 128


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_is_one_error_line_exit_2(cli, name):
    root, results = cli
    result = results[name]
    assert result.returncode == 2, f"{result.args}\n{result.stderr[-3000:]}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert all(part in lines[0] for part in BAD_INPUT[name]), lines[0]
    assert result.stdout == "" and not (root / f"out-{name}").exists()


def test_options_without_a_mode_apply_to_the_mode_the_model_recorded():
    """README: --quantize defaults to what the model's quantize pass recorded, and the other
    flags are that pass's options; `--per-channel` alone was refused on such a model."""
    from compressor.cli.export_command import quantize_config
    from pretrain.errors import UserError
    recorded = {"mode": "dynamic-int8", "per_channel": False}
    cfg = quantize_config(None, {"per_channel": True, "calibration": None}, recorded)
    assert (cfg.mode, cfg.per_channel) == ("dynamic-int8", True)
    assert quantize_config(None, {"per_channel": None}, recorded) is None          # nothing given: the record
    with pytest.raises(UserError, match="calibration applies to quantize mode static-int8, not dynamic-int8"):
        quantize_config(None, {"calibration": "minmax"}, recorded)
    with pytest.raises(UserError, match="only meaningful with a --quantize mode"):
        quantize_config(None, {"per_channel": True}, None)


def test_no_per_channel_turns_off_what_a_static_mode_defaults_to():
    """static-int8 and inc default to per-channel scales; --no-per-channel (and
    --no-reduce-range) set the option off, and leaving both out keeps the mode's default."""
    from compressor.cli.commands import build_parser
    from compressor.cli.export_command import quantize_config
    parse = build_parser().parse_args
    off = parse(["export", "--model", "m", "--out", "o", "--quantize", "static-int8", "--no-per-channel"])
    cfg = quantize_config(off.quantize, {"per_channel": off.per_channel, "reduce_range": off.reduce_range})
    assert (cfg.mode, cfg.per_channel) == ("static-int8", False)
    default = parse(["export", "--model", "m", "--out", "o", "--quantize", "static-int8"])
    assert (default.per_channel, default.reduce_range) == (None, None)
    assert quantize_config(default.quantize, {"per_channel": default.per_channel}).per_channel is True
    from pretrain.errors import UserError
    with pytest.raises(UserError, match="^--no-per-channel: only meaningful with a --quantize mode"):
        quantize_config(None, {"per_channel": False}, None)     # named as typed


def test_a_task_of_the_other_shape_than_the_model_was_fine_tuned_on_is_refused(shape_tuned, tiny_csv, tmp_path,
                                                                               capsys):
    """A pair model gated on single texts passed its parity and accuracy gates on inputs it was
    never trained on, and the export recorded that task."""
    model, out = shape_tuned["pairs"], tmp_path / "out"
    assert main(["export", "--model", str(model), "--task", str(tiny_csv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {model} was fine-tuned on text pairs (text, text_pair); task 'tiny' gives single texts: "
                   "expected a task with a text_pair column, or a model fine-tuned on single texts\n")
    assert not out.exists()
