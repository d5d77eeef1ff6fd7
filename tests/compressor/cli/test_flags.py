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
    ("pretrain", "--max-length", "4", "expected an integer from 8 to 2147483647 (got 4)"),
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
