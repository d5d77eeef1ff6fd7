"""Fixtures shared by the compressor tests: recipe runs, and the BART, XLNet and BiLM models
pretrained here for the teacher-family tests."""

from __future__ import annotations

import functools

import pytest

from compressor.cli import finetune_command as finetune_command_module
from compressor.cli.pretrain_command import pretrain_command
from compressor.pipeline import run as pipeline_run
from compressor.pipeline.recipe import parse_recipe
from pretrain.objectives import SIZES, ModelSize
from pretrain.pretraining import make_config

# family -> the objective that pretrains it
OBJECTIVES = {"bart": "dae", "xlnet": "plm", "bilm": "bilm"}


@pytest.fixture(scope="session")
def family_objectives() -> dict[str, str]:
    return dict(OBJECTIVES)


@pytest.fixture(scope="module")
def family_test_size():
    """A `test` model size below `tiny` (hidden 32; BiLM cells 64), registered for the requesting
    module only; and one torch thread: run_recipe and `compressor finetune` set torch to every
    core, and on a shared machine one thread is faster for tiny models."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline_run, "set_threads", lambda threads: None)
        mp.setattr(finetune_command_module, "set_threads", lambda threads: None)
        mp.setitem(SIZES, "test", ModelSize(layers=2, hidden=32, heads=2, intermediate=64))
        yield


@pytest.fixture(scope="module")
def pretrained(family_test_size, wordnet_corpus_file, tmp_path_factory):
    """family -> dir of a model pretrained for 2 steps by `compressor pretrain` (built on first use),
    so that the real command, objective and loop run in seconds."""
    corpus = wordnet_corpus_file(200)
    root = tmp_path_factory.mktemp("pretrained")
    made = {}

    def get(family: str):
        if family not in made:
            cfg = make_config(objective=OBJECTIVES[family], corpus=corpus, size="test", steps=2, batch_size=4,
                              max_length=32, buffer_size=32, seed=0)
            pretrain_command(cfg, root / family, show_progress=False, threads=1)
            made[family] = root / family
        return made[family]
    return get


@pytest.fixture(scope="module")
def run_raw():
    """`run_raw(raw, out, **kwargs)`: run a recipe dict as `compressor run` does, quietly and
    leaving torch's thread count alone (while the requesting module runs): run_recipe sets it
    to every core, and on a shared machine one thread is faster for tiny models."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline_run, "set_threads", lambda threads: None)

        def run(raw: dict, out, **kwargs) -> dict:
            recipe, steps = parse_recipe(raw)
            return pipeline_run.run_recipe(recipe, steps, out, show_progress=False, **kwargs)
        yield run


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
    """`family_runs(recipe)` -> `runs(family)`: (out dir, report) of the Pipeline `recipe(family)`
    builds, run on first use and kept for the requesting module."""
    root = tmp_path_factory.mktemp("family-recipes")

    def runs_of(recipe):
        @functools.cache
        def runs(family: str):
            return root / family, recipe(family).run(root / family, show_progress=False)
        return runs
    return runs_of
