"""Passes from another package: an entry point in the group `encoder_compressor.passes` makes
its passes usable in recipes and `compressor run`, as the built-in ones; a broken one is one
warning line, and the tool still works."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

PLUGIN = '''
from compressor.bundle import ModelBundle
from compressor.passes import Context, PassConfig, register


class ScaleHead(PassConfig):
    factor: float = 2.0


@register("scale-head", ScaleHead)
def scale_head(bundle: ModelBundle, cfg: ScaleHead, ctx: Context) -> ModelBundle:
    model = bundle.copy_model()
    model.classifier.weight.data *= cfg.factor
    return bundle.replace(model=model)
'''


def installed(site: Path, name: str, module: str, source: str) -> None:
    """What `pip install` of a package declaring the entry point leaves on the path."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[encoder_compressor.passes]\n{name} = {module}\n")


def in_python(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def test_a_plugins_pass_runs_in_a_recipe_through_the_cli(tiny_bert_dir, tiny_csv, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    installed(site, "scale-plugin", "scale_plugin", PLUGIN)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "plugged", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
        "variants": {"scaled": [{"scale-head": {"factor": 3.0}}]}}))
    done = in_python(site, "-m", "compressor", "run", str(recipe), "--out", str(tmp_path / "out"), "--quiet",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    history = (tmp_path / "out" / "scaled" / "compressor.json").read_text()
    assert '"pass": "scale-head"' in history and '"factor": 3.0' in history


def test_a_plugin_that_fails_to_import_is_one_warning_and_the_rest_works(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    installed(site, "broken-plugin", "broken_plugin", "raise RuntimeError('no such backend')\n")
    done = in_python(site, "-c", textwrap.dedent("""
        from compressor.passes import pass_names
        print(len(pass_names()))"""), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "broken-plugin" in line]
    assert warnings == ["warning: pass plugin 'broken-plugin' (broken_plugin) did not load: no such backend"]
    assert int(done.stdout.split()[-1]) > 10                # the built-in passes are all there
