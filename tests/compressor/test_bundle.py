"""ModelBundle: saving as an ordinary HF dir plus compressor.json, atomically."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.bundle import PROVENANCE_FILE, ModelBundle
from pretrain.batching import MAX_LENGTH, encode
from pretrain.errors import UserError
from pretrain.finetune import predict_logits

HISTORY = ({"pass": "drop-layers", "config": {"keep": [0, 2]}},
           {"pass": "finetune", "config": {"epochs": 1.0, "lr": 0.0001}})


def _logits(bundle: ModelBundle, split) -> np.ndarray:
    return predict_logits(bundle.model, encode(bundle.tokenizer, split))


@pytest.fixture
def trained_bundle(bert_bundle, tiny_task):
    """A bundle whose weights differ from the saved tiny model's, with a task and a history."""
    with torch.no_grad():
        for p in bert_bundle.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return bert_bundle.replace(task=tiny_task.spec, history=HISTORY)


def test_round_trip_preserves_predictions_task_and_history(trained_bundle, tiny_task, tmp_path):
    path = trained_bundle.save(tmp_path / "out")
    assert path == tmp_path / "out"
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", PROVENANCE_FILE, "tokenizer.json"} <= names
    assert "pytorch_model.bin" not in names

    loaded = ModelBundle.load(path)
    assert loaded.model is not trained_bundle.model
    assert loaded.task == tiny_task.spec
    assert loaded.history == HISTORY
    assert loaded.label_names == tiny_task.label_names
    assert loaded.params == trained_bundle.params
    test = tiny_task.split("test")
    np.testing.assert_allclose(_logits(loaded, test), _logits(trained_bundle, test), atol=1e-6, rtol=0)

    provenance = json.loads((path / PROVENANCE_FILE).read_text())
    assert provenance["label_names"] == list(tiny_task.label_names)
    assert provenance["history"] == [dict(h) for h in HISTORY]
    assert "compressor_version" in provenance


def test_saved_dir_is_a_plain_hf_dir(trained_bundle, tmp_path):
    path = trained_bundle.save(tmp_path / "hf")
    model = AutoModelForSequenceClassification.from_pretrained(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    assert model.config.id2label == trained_bundle.model.config.id2label
    inputs = tokenizer(["a small dog"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, trained_bundle.model(**inputs).logits)


def test_builtin_task_name_round_trips(bert_bundle, tmp_path):
    path = bert_bundle.replace(task="wordnet-supersense").save(tmp_path / "b")
    assert ModelBundle.load(path).task == "wordnet-supersense"


def test_atomic_save_leaves_no_temporary_dirs(trained_bundle, tmp_path):
    trained_bundle.save(tmp_path / "model")
    trained_bundle.save(tmp_path / "model")          # and again, over the first
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_saving_over_an_earlier_save_replaces_it_and_a_users_dir_is_refused(trained_bundle, bert_bundle, tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "notes.txt").write_text("a user's own file")
    with pytest.raises(UserError, match="save path .* holds files this command did not write"):
        trained_bundle.save(target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]       # untouched

    (target / "notes.txt").unlink()
    trained_bundle.save(target)                      # an empty dir is taken
    (target / "stale.txt").write_text("from an earlier run")
    bert_bundle.save(target)                         # an earlier save is replaced whole
    assert "stale.txt" not in {p.name for p in target.iterdir()}
    assert ModelBundle.load(target).history == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_failed_save_keeps_the_old_dir_and_leaves_no_temporary(trained_bundle, monkeypatch, tmp_path):
    target = tmp_path / "model"
    trained_bundle.save(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(trained_bundle.model, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        trained_bundle.replace(history=()).save(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_replace_and_copy_model_do_not_touch_the_original(bert_bundle):
    other = bert_bundle.copy_model()
    assert other is not bert_bundle.model
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(other.parameters(), bert_bundle.model.parameters()))
    new = bert_bundle.replace(model=other, history=({"pass": "drop-layers", "config": {"keep": [0]}},))
    assert new.model is other and bert_bundle.history == ()
    assert new.history == ({"pass": "drop-layers", "config": {"keep": [0]}},)


def test_loading_a_missing_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        ModelBundle.load(tmp_path / "missing")


def test_hf_dir_without_provenance_loads_with_empty_history(tiny_bert_dir):
    bundle = ModelBundle.load(tiny_bert_dir)
    assert bundle.history == () and bundle.task is None


def test_outputs_get_ordinary_permissions(tmp_path):
    """Temp-then-rename must not leave the 0700/0600 modes of mkdtemp/mkstemp behind."""
    import os
    import stat
    from pretrain.atomic import atomic_dir, write_json
    mask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            write_json(tmp / "report.json", {"a": 1})
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "out" / "report.json").stat().st_mode) == 0o644


def test_the_fine_tuning_length_round_trips_and_the_default_is_not_written(bert_bundle, tmp_path):
    """compressor.json records a length other than the default (what every later stage cuts
    texts to); a model at the default writes the file exactly as before the field existed."""
    bert_bundle.replace(max_length=64).save(tmp_path / "short")
    assert json.loads((tmp_path / "short" / PROVENANCE_FILE).read_text())["max_length"] == 64
    loaded = ModelBundle.load(tmp_path / "short")
    assert loaded.max_length == loaded.usable_length == 64
    bert_bundle.save(tmp_path / "default")
    assert "max_length" not in json.loads((tmp_path / "default" / PROVENANCE_FILE).read_text())
    assert ModelBundle.load(tmp_path / "default").max_length == MAX_LENGTH
    # The tiny BERT has 128 positions: a longer recorded length is cut to them.
    assert bert_bundle.replace(max_length=512).usable_length == 128


@pytest.mark.parametrize("field, value, message", [
    ("max_length", "long", r"max_length is 'long'; expected a positive integer"),
    ("pair_task", "yes", r"pair_task is 'yes'; expected true or false"),
])
def test_a_bad_recorded_setting_is_a_user_error(bert_bundle, tmp_path, field, value, message):
    bert_bundle.save(tmp_path / "m")
    record = json.loads((tmp_path / "m" / PROVENANCE_FILE).read_text())
    (tmp_path / "m" / PROVENANCE_FILE).write_text(json.dumps({**record, field: value}))
    with pytest.raises(UserError, match=message):
        ModelBundle.load(tmp_path / "m")


def test_the_input_shape_round_trips_and_an_unrecorded_one_is_not_known(bert_bundle, tmp_path):
    """compressor.json records whether the task gave text pairs (what evaluate, export and
    bench check a task against); a dir without the field loads as not known."""
    bert_bundle.replace(pair_task=True).save(tmp_path / "pairs")
    assert json.loads((tmp_path / "pairs" / PROVENANCE_FILE).read_text())["pair_task"] is True
    assert ModelBundle.load(tmp_path / "pairs").pair_task is True
    bert_bundle.replace(pair_task=False).save(tmp_path / "single")
    assert ModelBundle.load(tmp_path / "single").pair_task is False
    bert_bundle.save(tmp_path / "unknown")
    assert "pair_task" not in json.loads((tmp_path / "unknown" / PROVENANCE_FILE).read_text())
    assert ModelBundle.load(tmp_path / "unknown").pair_task is None
