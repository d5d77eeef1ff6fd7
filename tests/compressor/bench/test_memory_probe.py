"""The memory probe loads a model as the benchmark does: added modules kept, the profile's ORT settings."""

from __future__ import annotations

import subprocess
import sys

import onnxruntime as ort

from compressor.bench import memory_probe
from compressor.export.onnx import ONNX_FILE
from compressor.export.trace import write_onnx
from pretrain.models import count_params
from pretrain.strategies import prepare


def job_for(path, kind, graph_optimization="all") -> dict:
    return {"kind": kind, "path": str(path), "inputs": [], "calls": 1, "threads": 1,
            "provider": "CPUExecutionProvider", "device": "cpu", "graph_optimization": graph_optimization}


def test_torch_models_keep_their_adapters(bert_bundle, tmp_path):
    model = bert_bundle.copy_model()
    prepare(model, "adapters", 8)
    bert_bundle.replace(model=model).save_into(tmp_path / "adapters")
    loaded = memory_probe.torch_module(job_for(tmp_path / "adapters", "torch"))
    # A plain AutoModel load would drop the adapters (and their weights) with a warning.
    assert count_params(loaded) == count_params(model)
    assert any("adapter" in name for name, _ in loaded.named_parameters())


def test_onnx_sessions_get_the_profile_graph_optimization_level(bert_bundle, tmp_path):
    write_onnx(bert_bundle.model, tmp_path / ONNX_FILE)
    for level, expected in (("disabled", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                            ("basic", ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)):
        session = memory_probe.onnx_session(job_for(tmp_path / ONNX_FILE, "onnx", level))
        assert session.get_session_options().graph_optimization_level == expected


def test_an_onnx_probe_never_imports_torch(bert_bundle, tmp_path):
    write_onnx(bert_bundle.model, tmp_path / ONNX_FILE)
    code = ("import sys, json; from compressor.bench import memory_probe as m; "
            f"m.onnx_model({job_for(tmp_path / ONNX_FILE, 'onnx')!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_sets_run_smallest_first_and_readings_come_back_in_the_profiles_order(monkeypatch):
    """The high-water mark resets only to what the process holds: a larger batch run first
    would show in a smaller one's reading. The child gets the sets smallest first."""
    import json

    import numpy as np

    from compressor.bench import measure
    from compressor.bench.profiles import load_profile
    from compressor.bench.runners import Deployable
    seen = {}

    def child(args, **kwargs):
        job = json.loads(args[-1])
        seen["sizes"] = [int(np.load(path)["0:input_ids"].size) for path in job["inputs"]]
        readings = [float(size) for size in seen["sizes"]]        # a reading that names its set
        return subprocess.CompletedProcess(args, 0, stdout=json.dumps({"peak_rss_mb": readings}), stderr="")
    monkeypatch.setattr(measure.subprocess, "run", child)
    sets = [[{"input_ids": np.zeros((n, 16), dtype=np.int64)}] for n in (32, 1, 8)]
    model = Deployable("m", "onnx", "unused.onnx", "fp32")
    assert measure.peak_rss_mb(model, load_profile("cpu"), sets) == [512.0, 16.0, 128.0]
    assert seen["sizes"] == [16, 128, 512]
