"""The README's code map names every module, so that a contributor finds where a thing lives
(and where a new one goes). Two dirs are described by example there, their modules by kind:
the pretraining objectives ("mlm.py, clm.py, pairs.py, ...") and the commands ("one module per
command")."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BY_EXAMPLE = {"pretrain/objectives", "compressor/cli"}


def code_map() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Code map", 1)[1].split("### Adding a pass", 1)[0]


def test_every_module_is_in_the_code_map():
    text = code_map()
    modules = [p for package in ("pretrain", "compressor") for p in sorted((ROOT / package).rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py")
               and str(p.parent.relative_to(ROOT)) not in BY_EXAMPLE]
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name not in text]
    assert not missing, f"modules the README's code map does not name: {missing}"
