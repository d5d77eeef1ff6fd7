"""The README's command synopses and the real parser say the same thing.

The README is the user's front door: a flag it shows that the parser lacks fails on the first
try, and a flag the parser has that it never shows is a feature nobody finds. Both directions
are checked against `build_parser()`; where a flag has fixed choices, the alternatives the
synopsis lists (`--precision fp32|bf16`) must be exactly those choices, and a number it shows
(`--epochs 1`) must be the flag's default, as its help states one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from compressor.cli.commands import build_parser

README = Path(__file__).resolve().parents[3] / "README.md"
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([^\s\[\]]+))?")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def synopses() -> dict[str, str]:
    """Each subcommand's synopsis text: every `compressor SUB ...` line of the README's code
    blocks, continuation lines joined, several lines of one subcommand concatenated."""
    found: dict[str, str] = {}
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            match = re.match(r"\s*(?:\.venv/bin/)?compressor\s+([a-z-]+)(.*)", line)
            if match:
                found[match[1]] = found.get(match[1], "") + " " + match[2]
    return found


def test_every_subcommand_has_a_synopsis() -> None:
    assert sorted(subcommands()) == sorted(synopses())


def mismatches(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """What the synopsis `text` and `parser` disagree on, one line per flag."""
    options = {flag: action for flag, action in parser._option_string_actions.items() if flag.startswith("--")}
    shown = {flag: value for flag, value in FLAG.findall(text)}
    problems = [f"{flag}: shown, but the parser lacks it" for flag in sorted(set(shown) - set(options))]
    problems += [f"{flag}: in the parser, never shown" for flag in sorted(set(options) - set(shown) - {"--help"})]
    for flag, value in shown.items():
        choices = options[flag].choices if flag in options else None
        if choices and "|" in value and value.split("|") != list(choices):
            problems.append(f"{flag}: shows {value}, the parser takes {'|'.join(choices)}")
        default = number_default(options[flag]) if flag in options else None
        if default is not None and as_number(value) is not None and as_number(value) != default:
            problems.append(f"{flag}: shows {value}, the parser's default is {default:g}")
    return problems


def as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def number_default(action: argparse.Action) -> float | None:
    """A flag's numeric default: its own, or, for a flag left None to mean "the config's
    default", the one its help names (`(default 100)`, cli/commands.py: from_config)."""
    if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
        return float(action.default)
    named = re.search(r"\(default ([-+.\deE]+)\)", action.help or "")
    return as_number(named[1]) if named else None


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_synopsis_matches_the_parser(name: str) -> None:
    assert mismatches(subcommands()[name], synopses().get(name, "")) == []


def test_mismatches_are_found() -> None:
    """The comparison itself can fail: an invented flag, a missing one and wrong choices."""
    parser = subcommands()["finetune"]
    text = synopses()["finetune"].replace("--precision fp32|bf16", "--precision fp32|fp16").replace("[--quiet]", "")
    text = text.replace("--batch-size 32", "--batch-size 16").replace("--domain-steps 100", "--domain-steps 50")
    assert mismatches(parser, text + " [--no-such-flag]") == [
        "--no-such-flag: shown, but the parser lacks it", "--quiet: in the parser, never shown",
        "--batch-size: shows 16, the parser's default is 32",
        "--precision: shows fp32|fp16, the parser takes fp32|bf16",
        "--domain-steps: shows 50, the parser's default is 100"]
