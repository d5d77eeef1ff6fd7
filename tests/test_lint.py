"""Pyflakes' checks (ruff's F rules) over the code: an undefined name is a crash waiting for
the branch that reaches it (the einsum rewrite read a name before assigning it), and an
unused import is usually a leftover."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_undefined_names_or_unused_imports():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", "--quiet",
                             "compressor", "pretrain", "benchmarks", "tests"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
