"""The latency model: costs, the fit, held-out scoring and reuse on the same machine only."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from compressor.search.latency import (COSTS, Point, Structure, TeacherShape, costs, fit, held_out_error,
                                       load_or_none, model_key)

SHAPE = TeacherShape(hidden=384, head_dim=32, layers=6, heads=12, ffn=1536)
MACHINE = {"cpu": {"model": "x", "flags": ["avx2"], "cores": 2}, "packages": {"onnxruntime": "1.32.0"}}
# ms per unit of each cost (a made-up machine): a call 0.2 ms, a layer 0.05 ms, ...
TRUTH = {"fp32": np.array([0.2, 0.05, 1e-4, 2e-5, 2e-9, 2.2e-9, 1e-7, 3e-9, 5e-7]),
         "int8": np.array([0.25, 0.06, 1e-4, 2e-5, 1e-9, 1.1e-9, 1e-7, 3e-9, 5e-7])}


def structures(seed: int, count: int) -> list[Structure]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        depth = int(rng.integers(1, 7))
        out.append(Structure(heads=tuple(int(h) for h in rng.integers(1, 13, depth)),
                             ffn=tuple(int(f) for f in rng.integers(1, 13, depth) * 128),
                             precision="fp32" if i % 2 else "int8"))
    return out


def measured(items: list[Structure], noise: float = 0.0, seed: int = 0) -> list[Point]:
    rng = np.random.default_rng(seed)
    return [Point(structure=s, batch=b, length=n,
                  ms=float(costs(s, SHAPE, b, n) @ TRUTH[s.precision]) * (1 + noise * rng.standard_normal()))
            for s in items for b in (1, 8) for n in (12, 20, 31)]


def test_costs_follow_the_structure():
    whole = Structure(heads=(12,) * 6, ffn=(1536,) * 6)
    half = Structure(heads=(6,) * 6, ffn=(768,) * 6)
    a, b = costs(whole, SHAPE, 8, 20), costs(half, SHAPE, 8, 20)
    named = dict(zip(COSTS, zip(a, b)))
    assert named["call"] == (1, 1) and named["layers"] == (6, 6) and named["tokens"] == (160, 160)
    for cost in ("projections", "ffn", "ffn_act", "attention", "softmax"):
        assert named[cost][0] == 2 * named[cost][1], cost
    assert named["projections"][0] == 160 * 4 * 384 * 32 * 72          # 6 layers x 12 heads
    assert costs(whole, SHAPE, 8, 40)[COSTS.index("attention")] == 4 * a[COSTS.index("attention")]


def test_costs_of_a_last_layer_on_the_first_token_only():
    two = Structure(heads=(12, 6), ffn=(1536, 768))
    full, first = costs(two, SHAPE, 8, 20), costs(two, SHAPE, 8, 20, first_token_last=True)
    named = dict(zip(COSTS, zip(full, first)))
    # Keys and values of both layers on all 160 tokens; queries and outputs of the last on 8.
    assert named["projections"][1] == 2 * 384 * 32 * (160 * 18 + 160 * 12 + 8 * 6)
    assert named["ffn"][1] == 2 * 384 * (160 * 1536 + 8 * 768)
    assert named["attention"][1] == 8 * 20 * 2 * 32 * (20 * 12 + 1 * 6)
    assert named["layer_tokens"][1] == 160 + 8
    assert all(f <= w for w, f in named.values())
    # One token per row: nothing to leave out.
    np.testing.assert_array_equal(costs(two, SHAPE, 8, 1), costs(two, SHAPE, 8, 1, first_token_last=True))


def test_a_model_fitted_on_first_token_exports_says_so_in_its_key_and_predictions():
    points = [p.model_copy(update={"ms": float(costs(p.structure, SHAPE, p.batch, p.length, True)
                                                @ TRUTH[p.structure.precision])})
              for p in measured(structures(0, 20))]
    model = fit(points, SHAPE, MACHINE, "k", first_token_last=True)
    assert model.first_token_last
    for point in points[:10]:
        assert model.predict_ms(point.structure, point.batch, point.length) == pytest.approx(point.ms, rel=1e-3)
    assert model_key(MACHINE, {}, SHAPE, True) != model_key(MACHINE, {}, SHAPE) == model_key(MACHINE, {}, SHAPE, False)
    # graphs whose residual LayerNorms run unfused are another graph: another key (fused keeps the old one)
    assert model_key(MACHINE, {}, SHAPE, True, "unfused") != model_key(MACHINE, {}, SHAPE, True, "fused") \
        == model_key(MACHINE, {}, SHAPE, True)


def test_fit_recovers_a_linear_machine_and_predicts_unseen_structures():
    model = fit(measured(structures(0, 20)), SHAPE, MACHINE, "k")
    unseen = structures(1, 8)
    for point in measured(unseen):
        assert model.predict_ms(point.structure, point.batch, point.length) == pytest.approx(point.ms, rel=1e-3)
    scored = held_out_error(model, measured(unseen))
    assert scored["structures"] == 8 and scored["median_abs_relative_error"] < 1e-3 and scored["spearman"] > 0.99


def test_held_out_error_sees_a_bad_model():
    model = fit(measured(structures(0, 20)), SHAPE, MACHINE, "k")
    # A model that predicts every structure twice as slow is 100% off.
    wrong = model.model_copy(update={"coefficients": {p: list(2 * np.asarray(c)) for p, c in
                                                      model.coefficients.items()}})
    assert held_out_error(wrong, measured(structures(1, 8)))["median_abs_relative_error"] == pytest.approx(1.0)


def test_noisy_measurements_still_rank_structures():
    model = fit(measured(structures(0, 24), noise=0.05, seed=1), SHAPE, MACHINE, "k")
    scored = held_out_error(model, measured(structures(1, 10), noise=0.05, seed=2))
    assert scored["median_abs_relative_error"] < 0.15 and scored["spearman"] > 0.9


def test_p50_is_the_median_of_the_batches():
    model = fit(measured(structures(0, 20)), SHAPE, MACHINE, "k")
    s = structures(1, 1)[0]
    shapes = [(8, 10), (8, 20), (8, 30)]
    assert model.predict_p50(s, shapes) == pytest.approx(model.predict_ms(s, 8, 20))


def test_a_precision_without_measurements_is_refused():
    fp32_only = [p for p in measured(structures(0, 20)) if p.structure.precision == "fp32"]
    model = fit(fp32_only, SHAPE, MACHINE, "k")
    with pytest.raises(ValueError, match="no int8 measurements"):
        model.predict_ms(Structure(heads=(1,), ffn=(1,), precision="int8"), 1, 8)


def test_saved_model_is_reused_only_for_its_key(tmp_path):
    key = model_key(MACHINE, {"threads": 2}, SHAPE)
    model = fit(measured(structures(0, 20)), SHAPE, MACHINE, key)
    model.save(tmp_path / "latency.json")
    assert load_or_none(tmp_path / "latency.json", key) == model
    other_cpu = {**MACHINE, "cpu": {**MACHINE["cpu"], "flags": ["avx2", "avx512_vnni"]}}
    for other in (model_key(other_cpu, {"threads": 2}, SHAPE), model_key(MACHINE, {"threads": 1}, SHAPE),
                  model_key(MACHINE, {"threads": 2}, SHAPE.model_copy(update={"hidden": 768})),
                  model_key({**MACHINE, "cpu_quota": 1.5}, {"threads": 2}, SHAPE)):     # in a container held to less
        assert other != key and load_or_none(tmp_path / "latency.json", other) is None
    assert load_or_none(tmp_path / "missing.json", key) is None


@pytest.mark.parametrize("fields, why", [({"heads": (2, 2), "ffn": (8,)}, "same layers"),
                                         ({"heads": (0,), "ffn": (8,)}, "at least one head"),
                                         ({"heads": (), "ffn": ()}, "at least 1")])
def test_structure_validation(fields, why):
    with pytest.raises(ValidationError, match=why):
        Structure(**fields)
