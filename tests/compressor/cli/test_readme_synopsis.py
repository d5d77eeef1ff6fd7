"""The README's command synopses and the real parser say the same thing.

The README is the user's front door: a flag it shows that the parser lacks fails on the first
try, and a flag the parser has that it never shows is a feature nobody finds. Both directions
are checked against `build_parser()`, and where a flag has fixed choices, the alternatives the
synopsis lists (`--precision fp32|bf16`) must be exactly those choices."""

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
    return problems


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_synopsis_matches_the_parser(name: str) -> None:
    assert mismatches(subcommands()[name], synopses().get(name, "")) == []


def test_mismatches_are_found() -> None:
    """The comparison itself can fail: an invented flag, a missing one and wrong choices."""
    parser = subcommands()["finetune"]
    text = synopses()["finetune"].replace("--precision fp32|bf16", "--precision fp32|fp16").replace("[--quiet]", "")
    assert mismatches(parser, text + " [--no-such-flag]") == [
        "--no-such-flag: shown, but the parser lacks it", "--quiet: in the parser, never shown",
        "--precision: shows fp32|fp16, the parser takes fp32|bf16"]
