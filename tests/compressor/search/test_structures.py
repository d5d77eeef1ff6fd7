"""Structures cut from a (tiny) teacher, exported and timed for the latency model."""

from __future__ import annotations

import json

import pytest

from compressor.bench.profiles import load_profile
from compressor.search import structures as module
from compressor.search.latency import Structure
from compressor.search.structures import build, fit_latency_model, sample_structures, teacher_shape
from pretrain.models import encoder_layers


def test_teacher_shape_and_samples(bert_bundle):
    shape = teacher_shape(bert_bundle)
    assert (shape.hidden, shape.head_dim, shape.layers, shape.heads, shape.ffn) == (32, 8, 4, 4, 64)
    sampled = sample_structures(shape, 5, ("fp32", "int8"), seed=0)
    assert len(sampled) == 10 and sampled[:5] == [s.model_copy(update={"precision": "fp32"}) for s in sampled[5:]]
    assert all(len(s.heads) <= 4 and max(s.heads) <= 4 and max(s.ffn) <= 64 and min(s.ffn) >= 5 for s in sampled)
    assert sample_structures(shape, 5, ("fp32",), seed=0) == sampled[:5]        # seeded


def test_build_cuts_the_teacher_to_the_structure(bert_bundle):
    out = build(bert_bundle, Structure(heads=(1, 4, 2), ffn=(64, 10, 33), precision="int8"))
    layers = encoder_layers(out.model)
    assert len(layers) == 3 and out.deploy["quantize"]["mode"] == "dynamic-int8"
    assert [layer.attention.self.query.out_features for layer in layers] == [8, 32, 16]
    assert [layer.intermediate.dense.out_features for layer in layers] == [64, 10, 33]
    assert len(encoder_layers(bert_bundle.model)) == 4                          # the teacher is untouched
    with pytest.raises(ValueError, match="larger than the teacher"):
        build(bert_bundle, Structure(heads=(5,), ffn=(8,)))


def test_fit_measures_then_reuses_on_the_same_machine(bert_bundle, tiny_task, tmp_path, monkeypatch):
    profile = load_profile("cpu").model_copy(update={"warmup": 1})
    monkeypatch.setattr(module, "BATCHES", 2)
    monkeypatch.setattr(module, "CALLS_PER_BATCH", 2)
    model = fit_latency_model(bert_bundle, tiny_task, profile, [2], work=tmp_path / "work",
                              cache=tmp_path / "latency.json", fit_count=3, held_out_count=2,
                              precisions=("fp32",), log=lambda _: None)
    assert model.points == 4 * 2                       # the whole teacher + 3 structures, 2 batches each
    assert set(model.coefficients) == {"fp32"} and all(c >= 0 for c in model.coefficients["fp32"])
    assert model.held_out["structures"] >= 1 and model.held_out["median_abs_relative_error"] >= 0
    whole = Structure(heads=(4,) * 4, ffn=(64,) * 4)
    assert model.predict_ms(whole, 2, 10) > 0
    assert json.loads((tmp_path / "latency.json").read_text())["key"] == model.key
    # Other processes' share of the CPUs while each structure was timed (4 fitted and the
    # held-out ones), summarised.
    contention = model.contention
    assert 0 <= contention["median"] <= contention["worst"] <= 1 and contention["measurements"] >= 5
    monkeypatch.setattr(module, "measure", lambda *a, **k: pytest.fail("measured again"))
    # Whatever else loads this machine now: a model fitted under contention is refitted, which
    # test_a_cached_model_fitted_under_contention_is_fitted_again checks.
    monkeypatch.setattr(module, "contended", lambda recorded: False)
    again = fit_latency_model(bert_bundle, tiny_task, profile, [2], work=tmp_path / "work",
                              cache=tmp_path / "latency.json", fit_count=3, held_out_count=2,
                              precisions=("fp32",), log=lambda _: None)
    assert again == model
    # The key left out the structure counts and seed: a rerun with other settings reused a
    # model fitted on other structures.
    asked = dict(batch_sizes=[2], fit_count=3, held_out_count=2, precisions=("fp32",), seed=0)
    monkeypatch.setattr(module, "export_structures", refitted)
    for change in ({"fit_count": 4}, {"held_out_count": 3}, {"seed": 1}, {"batch_sizes": [4]},
                   {"precisions": ("fp32", "int8")}):
        settings = {**asked, **change}
        with pytest.raises(Refitted):
            fit_latency_model(bert_bundle, tiny_task, profile, settings.pop("batch_sizes"), work=tmp_path / "work",
                              cache=tmp_path / "latency.json", log=lambda _: None, **settings)


class Refitted(Exception):
    pass


def test_a_cached_model_fitted_under_contention_is_fitted_again(bert_bundle, tiny_task, tmp_path, monkeypatch):
    """A model timed while other processes took the CPUs predicts high; reused from the cache,
    every later search on the machine would pass over plans that fit its budget."""
    profile = load_profile("cpu").model_copy(update={"warmup": 1})
    monkeypatch.setattr(module, "BATCHES", 2)
    monkeypatch.setattr(module, "CALLS_PER_BATCH", 2)
    asked = {"work": tmp_path / "work", "cache": tmp_path / "latency.json", "fit_count": 1, "held_out_count": 0,
             "precisions": ("fp32",), "log": lambda _: None}
    model = fit_latency_model(bert_bundle, tiny_task, profile, [2], **asked)
    quiet = {"median": 0.05, "worst": 0.3, "measurements": 2}     # one burst: the median is what the fit pooled
    model.model_copy(update={"contention": quiet}).save(tmp_path / "latency.json")
    monkeypatch.setattr(module, "export_structures", refitted)
    assert fit_latency_model(bert_bundle, tiny_task, profile, [2], **asked).contention == quiet
    model.model_copy(update={"contention": {**quiet, "median": 0.4}}).save(tmp_path / "latency.json")
    with pytest.raises(Refitted):
        fit_latency_model(bert_bundle, tiny_task, profile, [2], **asked)


def refitted(*args, **kwargs):
    raise Refitted


def test_structure_exports_stop_at_the_deadline_and_keep_what_they_made(bert_bundle, tiny_task, tmp_path):
    """--time-budget-min did not bound the latency model's phase: any number of structures was
    exported past it."""
    import time

    from pretrain.errors import UserError
    shape = teacher_shape(bert_bundle)
    structures = sample_structures(shape, 2, ("fp32",), seed=0)
    with pytest.raises(UserError, match=r"structure exports used up the time budget \(0 of 2 made, kept in .*\); "
                                        r"expected a larger time budget or fewer latency structures"):
        module.export_structures(bert_bundle, structures, tiny_task, tmp_path / "work", deadline=time.monotonic() - 1)
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())
    made = module.export_structures(bert_bundle, structures[:1], tiny_task, tmp_path / "work")
    # an export already made is reused past the deadline; the next one is not started
    with pytest.raises(UserError, match=r"\(1 of 2 made"):
        module.export_structures(bert_bundle, structures, tiny_task, tmp_path / "work", deadline=time.monotonic() - 1)
    assert all(path.is_file() for path in made.values())
