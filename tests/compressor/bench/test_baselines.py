"""The Optimum baseline is built with the preset Optimum provides for the profile's CPU."""

from __future__ import annotations

import json
import platform
import shutil

import pytest

from compressor.bench import baselines, measure
from compressor.bench.baselines import (OPTIMUM_PRESETS, preset_for_cpu, preset_for_this_cpu, preset_settings,
                                        preset_unsupported)
from compressor.bench.profiles import load_profile
from compressor.pipeline import run as pipeline_run
from compressor.pipeline import run_recipe
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError

AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}
VNNI = AVX512 | {"avx512_vnni"}
AMX = VNNI | {"amx_int8", "amx_bf16", "avx512_bf16"}


@pytest.mark.parametrize("flags, machine, preset", [
    (AVX2, "x86_64", "avx2"),
    (AVX2 | {"avx_vnni"}, "x86_64", "avx2"),      # VNNI without AVX-512: Optimum has no preset for it
    (AVX512, "x86_64", "avx512"),
    (VNNI, "x86_64", "avx512_vnni"),
    (AMX, "x86_64", "avx512_vnni"),              # no AMX preset: the VNNI one is what a user picks
    ({"fp", "asimd", "asimddp"}, "aarch64", "arm64"),
    (set(), "arm64", "arm64"),
])
def test_the_preset_follows_the_cpu_flags(flags, machine, preset):
    assert preset_for_cpu(flags, machine) == preset
    assert preset_unsupported(preset, flags, machine) is None


def test_a_preset_the_cpu_cannot_run_says_why():
    assert "avx512_vnni" in preset_unsupported("avx512_vnni", AVX512, "x86_64")
    assert "avx512f" in preset_unsupported("avx512", AVX2, "x86_64")
    assert "ARM64" in preset_unsupported("arm64", VNNI, "x86_64")
    assert "x86" in preset_unsupported("avx2", set(), "aarch64")


def test_each_preset_keeps_optimum_defaults():
    settings = {p: preset_settings(p) for p in OPTIMUM_PRESETS}
    for preset, s in settings.items():
        assert s["preset"] == preset and s["is_static"] is False and s["per_channel"] is True
        assert s["activations_dtype"] == "QUInt8" and "MatMul" in s["operators_to_quantize"]
    # Optimum's avx2 preset uses unsigned weights; the AVX-512 and ARM presets signed ones.
    assert settings["avx2"]["weights_dtype"] == "QUInt8"
    assert {settings[p]["weights_dtype"] for p in ("avx512", "avx512_vnni", "arm64")} == {"QInt8"}


def test_a_profile_may_name_its_preset(monkeypatch):
    monkeypatch.setattr(baselines, "platform", type("P", (), {"machine": staticmethod(lambda: "x86_64")}))
    monkeypatch.setattr("compressor.bench.environment.cpu_flags", lambda: VNNI)
    cpu = load_profile("cpu")
    assert baselines.optimum_preset(cpu) == "avx512_vnni"
    assert baselines.optimum_preset(cpu.model_copy(update={"optimum_preset": "avx2"})) == "avx2"
    monkeypatch.setattr("compressor.bench.environment.cpu_flags", lambda: AVX2)
    with pytest.raises(UserError, match="profile cpu: optimum_preset avx512_vnni needs the CPU flags avx512f, "
                                        "avx512_vnni, which this CPU lacks; expected one this CPU runs \\(avx2\\)"):
        baselines.optimum_preset(cpu.model_copy(update={"optimum_preset": "avx512_vnni"}))


def profile_file(tmp_path, name, preset) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nprovider: CPUExecutionProvider\nthreads: 1\noptimum_preset: {preset}\n")
    return str(path)


def tiny_recipe(model_dir, csv_path, profiles) -> dict:
    return {"name": "presets", "seed": 0, "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)}},
            "variants": {"same": []},
            "benchmark": {"profiles": profiles, "batch_sizes": [2], "iterations": 2,
                          "baselines": ["optimum-default-int8"]}}


def test_a_preset_the_cpu_cannot_run_stops_the_run_before_any_stage(tiny_bert_dir, tiny_csv, tmp_path):
    foreign = "arm64" if platform.machine() not in ("aarch64", "arm64") else "avx2"
    recipe, steps = parse_recipe(tiny_recipe(tiny_bert_dir, tiny_csv, [profile_file(tmp_path, "mine", foreign)]))
    with pytest.raises(UserError, match=f"profile mine: optimum_preset {foreign} needs"):
        run_recipe(recipe, steps, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_each_profile_is_measured_against_its_own_preset(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    """Two CPU profiles with different presets: two builds, each profile times its own."""
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("x86 presets")
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: None)
    own, other = preset_for_this_cpu(), "avx2"
    if own == other:
        pytest.skip("this CPU runs only the avx2 preset")
    loaded = []
    real = measure.load_runner
    # Memory is probed in a child process per model; this is about which build each profile times.
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, *a, **k: [100.0] * len(batch_sets))
    monkeypatch.setattr(measure, "load_runner",
                        lambda model, profile, ids=None: loaded.append((profile.name, model.name, model.path)) or
                        real(model, profile, ids))
    raw = tiny_recipe(tiny_bert_dir, tiny_csv, ["cpu", profile_file(tmp_path, "cpu-avx2", other)])
    recipe, steps = parse_recipe(raw)
    report = run_recipe(recipe, steps, tmp_path / "out", show_progress=False)
    optimum = next(m for m in report["models"] if m["name"] == "optimum-default-int8")["optimum"]
    assert optimum["preset"] == own and optimum["profiles"] == {"cpu": own, "cpu-avx2": other}
    assert set(optimum["builds"]) == {own, other}
    assert optimum["builds"][other]["settings"]["weights_dtype"] == "QUInt8"
    for build in optimum["builds"].values():      # scored like the entry, predictions left out
        assert {"retention", "agreement"} <= set(build) and "predictions" not in build
    timed = {profile: path for profile, name, path in loaded if name == "optimum-default-int8"}
    assert timed["cpu"].parent.name == f"optimum-default-int8-{own}"
    assert timed["cpu-avx2"].parent.name == f"optimum-default-int8-{other}"
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"preset {own}" in md and f"preset {other}" in md


@pytest.mark.parametrize("recorded, shipped", [(None, 128), (64, 64)])
def test_a_baseline_ships_a_tokenizer_that_cuts_where_it_was_scored(tiny_bert_dir, tmp_path, recorded, shipped):
    """Scored and timed at the teacher's fine-tuning length, the plain export's tokenizer cuts
    there too, not at the model's positions (a deployed baseline would see longer text)."""
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert_dir, teacher)
    tokenizer_config = json.loads((teacher / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 512
    (teacher / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if recorded:
        (teacher / "compressor.json").write_text(json.dumps({"max_length": recorded}))
    out = tmp_path / "onnxruntime-fp32"
    out.mkdir()
    baselines.build_onnxruntime_fp32(teacher, out)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == saved["max_length"] == shipped     # MiniLM's files carry max_length 128
