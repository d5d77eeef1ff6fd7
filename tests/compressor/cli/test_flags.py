"""Number flags say what they take in their config field's words, through the real command."""

from __future__ import annotations

import pytest

from compressor.cli.commands import main

COMMANDS = {
    "finetune": ["finetune", "--task", "wordnet-supersense", "--out", "{out}"],
    "export": ["export", "--model", "m", "--out", "{out}"],
    "search": ["search", "--teacher", "t", "--task", "wordnet-supersense", "--latency-budget-ms", "5", "--out", "{out}"],
    "tokenizer": ["tokenizer", "--corpus", "wordnet", "--out", "{out}"],
    "pretrain": ["pretrain", "--objective", "dae", "--corpus", "wordnet", "--steps", "1", "--out", "{out}"],
    "embeddings": ["embeddings", "--corpus", "wordnet", "--out", "{out}"],
}


@pytest.mark.parametrize("command, flag, value, expected", [
    # Not argparse's "invalid float value: 'x'": what the flag takes, as a recipe's field says it.
    ("finetune", "--epochs", "x", "expected a positive number (got 'x')"),
    ("finetune", "--lr", "1e-x", "expected a positive number (got '1e-x')"),
    ("finetune", "--domain-lr", "fast", "expected a positive number (got 'fast')"),
    ("export", "--tolerable-loss", "lots", "expected a number in [0, 1] (got 'lots')"),
    ("export", "--min-accuracy", "high", "expected a number in [0, 1] (got 'high')"),
    ("search", "--proxy-lr", "x", "expected a positive number (got 'x')"),
    ("pretrain", "--warmup-ratio", "x", "expected a number in [0, 1) (got 'x')"),
    ("pretrain", "--mask-ratio", "x", "expected a number in [0, 1] (got 'x')"),
    ("embeddings", "--lr", "x", "expected a positive number (got 'x')"),
    # Out of bounds or not finite: the value as typed (0, not the 0.0 it parses to).
    ("finetune", "--epochs", "0", "expected a positive number (got 0)"),
    ("finetune", "--epochs", "nan", "expected a positive number (got nan)"),
    ("finetune", "--adapter-init-std", "1e1", "expected a number in (0, 1] (got 1e1)"),
    ("export", "--accuracy-tolerance", "-0.5", "expected a number in [0, 1] (got -0.5)"),
    ("search", "--time-budget-min", "0", "expected a positive number (got 0)"),
    ("pretrain", "--mask-ratio", "1.5", "expected a number in [0, 1] (got 1.5)"),
    ("pretrain", "--warmup-ratio", "1", "expected a number in [0, 1) (got 1)"),
    # An integer flag takes its field's bounds, where they are narrower than any positive count.
    ("export", "--block-size", "8", "expected an integer from 16 to 2147483647 (got 8)"),
    ("search", "--latency-held-out", "501", "expected a positive integer from 1 to 500 (got 501)"),
    ("pretrain", "--max-length", "4", "expected an integer from 8 to 512 (got 4)"),
    ("embeddings", "--dim", "1", "expected an integer from 2 to 2147483647 (got 1)"),
    ("tokenizer", "--vocab-size", "many", "expected a positive integer from 1 to 2147483647 (got 'many')"),
    ("tokenizer", "--min-frequency", "2.5", "expected a positive integer from 1 to 2147483647 (got 2.5)"),
])
def test_a_number_flag_says_what_it_takes_as_its_config_field_does(command, flag, value, expected, tmp_path,
                                                                   capsys):
    argv = [a.format(out=tmp_path / "out") for a in COMMANDS[command]]
    assert main([*argv, flag, value]) == 2
    assert capsys.readouterr().err == f"error: compressor {command}: argument {flag}: {expected}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_number_flag_in_bounds_reaches_the_config_as_the_number():
    from compressor.cli.commands import build_parser
    args = build_parser().parse_args(["finetune", "--task", "t", "--out", "o", "--epochs", "1e-1", "--lr", "3e-5",
                                      "--adapter-init-std", "1", "--batch-size", "4"])
    assert (args.epochs, args.lr, args.adapter_init_std, args.batch_size) == (0.1, 3e-5, 1.0, 4)
    assert isinstance(args.batch_size, int)


@pytest.mark.parametrize("command, flags, message", [
    # A check across fields names every flag it concerns, as typed, and not the value parsed
    # from other text (`(got 0.001)` for 1e-3): the value is not what is wrong.
    ("finetune", ["--domain-lr", "1e-3"], "--domain-lr: set without --domain-corpus; expected a corpus to run MLM on"),
    ("finetune", ["--domain-steps", "50"], "--domain-steps: set without --domain-corpus; expected a corpus to run "
                                           "MLM on"),
    ("export", ["--quantize", "static-int8", "--scope", "linears", "--format", "qoperator"],
     "--scope linears writes a QDQ graph; expected --format qdq with it, or --scope ops"),
    ("export", ["--quantize", "dynamic-int8", "--calibration", "entropy"],
     "--calibration applies to quantize mode static-int8, not dynamic-int8"),
    ("export", ["--quantize", "fp16", "--no-per-channel"],
     "--no-per-channel applies to quantize mode dynamic-int8 or static-int8 or inc, not fp16"),
    ("tokenizer", ["--kind", "bpe", "--vocab-size", "10"],
     "--vocab-size 10 is too small for --kind bpe; expected at least 261 (special tokens plus the 256 bytes)"),
    ("pretrain", ["--objective", "clm", "--init", "minilm"],          # the later --objective wins
     "--init continues masked-LM pretraining; --objective clm builds its own model: expected --objective mlm or "
     "mlm-wwm, or no --init"),
    # A check of one field: that field's flag, not `--quantize` and the whole config.
    ("export", ["--quantize", "int4-weight-only", "--block-size", "48"],
     "--block-size: expected a power of 2 >= 16, such as 32 or 64 (got 48)"),
    # A list flag's value as typed, not the Python list; a name it does not take, in our words.
    ("search", ["--precisions", "int8,int8"], "--precisions: int8 listed more than once; expected each once "
                                              "(got 'int8,int8')"),
    ("search", ["--baselines", "teacher"], "--baselines: expected one of pytorch-eager-fp32, onnxruntime-fp32, "
                                           "optimum-default-int8 (got 'teacher')"),
    # A dae noise value: what its option takes, the item as typed (not pydantic's "a valid boolean").
    ("pretrain", ["--objective-option", "whole_words=maybe"],
     "dae noise option whole_words: expected 0 or 1 (got 'whole_words=maybe')"),
    ("pretrain", ["--dae-noise", "infilling,masking=2"], "dae noise option mask: expected a number in [0, 1] (got "
                                                         "'masking=2')"),
    ("search", ["--recoveries", "finetun"], "--recoveries: expected one of finetune, distill, theseus (got "
                                            "'finetun'); did you mean 'finetune'?"),
])
def test_a_setting_the_config_refuses_names_the_flags_as_typed(command, flags, message, tmp_path, capsys):
    argv = [a.format(out=tmp_path / "out") for a in COMMANDS[command]]
    assert main([*argv, *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert list(tmp_path.iterdir()) == []
