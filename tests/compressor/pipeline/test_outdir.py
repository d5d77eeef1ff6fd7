"""The output dir of a run: one run at a time, and a clear refusal for the second."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from compressor.pipeline import outdir
from pretrain.errors import UserError


def test_a_run_beside_one_that_makes_the_same_new_dir_first_is_told_it_is_in_use(tmp_path, monkeypatch):
    """Both found the dir absent, the other made it first, and this one's mkdir failed with a
    disk error ("File exists") instead of the refusal a dir in use gets."""
    out = tmp_path / "new-run"
    other_run = contextlib.ExitStack()
    real_mkdir = Path.mkdir

    def made_meanwhile(path, *args, **kwargs):
        if path == out and not out.exists():
            monkeypatch.setattr(Path, "mkdir", real_mkdir)
            other_run.enter_context(outdir.exclusive_use(out))    # makes the dir and holds it
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", made_meanwhile)
    with other_run, pytest.raises(UserError, match=r"in use by another run"):
        with outdir.exclusive_use(out):
            pass


def test_a_claim_refused_names_the_recipe_file_and_leaves_no_lock(tmp_path):
    from compressor.pipeline.recipe import parse_recipe
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": "minilm", "task": "wordnet-supersense"},
                              "variants": {"v": []}})
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"^recipes/r.yaml: .* holds files that neither"):
        with outdir.claimed_out_dir(tmp_path, recipe, force=False, source="recipes/r.yaml"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_error_of_the_run_a_claim_holds_is_not_renamed(tmp_path):
    """Only the claim's refusals get the recipe file: a stage's errors say where they come from."""
    from compressor.pipeline.recipe import parse_recipe
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": "minilm", "task": "wordnet-supersense"},
                              "variants": {"v": []}})
    with pytest.raises(UserError, match=r"^variants.v\[0\]: no$"):
        with outdir.claimed_out_dir(tmp_path / "out", recipe, force=False, source="recipes/r.yaml"):
            raise UserError("variants.v[0]: no")


def test_an_out_dir_no_dir_can_be_made_at_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """Not a refused write (those are WriteErrors): mkdir under /proc, as root, said ENOENT."""
    import errno
    import os

    def no_dir_here(path, *args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    monkeypatch.setattr(Path, "mkdir", no_dir_here)
    with pytest.raises(UserError, match=r"^--out .*/out: cannot make the directory there \(No such file or "
                                        r"directory\); expected a path where a directory can be made$"):
        outdir.make_out_dir(tmp_path / "out")


def test_a_run_and_another_command_writing_its_dir_refuse_each_other(tmp_path, monkeypatch):
    """A run held only DIR/.lock, which an export or a finetune into the same --out never
    looked at: started beside the run, it went on, and its last rename replaced the run's dir,
    finished stages and all. The run now claims its dir as every command claims its --out."""
    from pretrain.atomic import claimed_output
    out = tmp_path / "out"
    refused = rf"^--out {out} is in use by another command writing the same output; wait for it to finish"
    with claimed_output(out):                     # an export into `out`, running
        with pytest.raises(UserError, match=refused):
            with outdir.exclusive_use(out):
                pass
        assert not out.exists()                   # neither the dir it made nor its lock file
    out.mkdir()
    (out / "run.json").write_text("{}")
    with outdir.exclusive_use(out):               # a run in `out`, running
        with pytest.raises(UserError, match=refused):
            with claimed_output(out):
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]     # the claims go with their commands
    monkeypatch.chdir(out)                        # --out .: the claim is beside the dir, not in it
    with outdir.exclusive_use(Path(".")):
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert sorted(p.name for p in out.iterdir()) == [".lock", "run.json"]
