"""The stage cache: reused while the key holds, rebuilt when it changes, one log line each way."""

from __future__ import annotations

import json
import logging
import re

from compressor.pipeline.cache import cached


def test_a_stage_is_built_once_then_reused_and_rebuilt_for_a_new_key(tmp_path, caplog):
    builds = []

    def write(tmp):
        builds.append(tmp)
        (tmp / "weights.bin").write_bytes(b"w")
        return {"metrics": {"accuracy": 0.5}}
    path = tmp_path / "baselines" / "onnxruntime-fp32"
    with caplog.at_level(logging.INFO, logger="compressor.pipeline"):
        first = cached(path, "key-1", write)
        again = cached(path, "key-1", write)
        cached(path, "key-2", write)
    assert len(builds) == 2 and first == again
    assert first == {"key": "key-1", "metrics": {"accuracy": 0.5}, "files": ["weights.bin"],
                     "build_seconds": first["build_seconds"]}
    assert isinstance(first["build_seconds"], float) and first["build_seconds"] >= 0
    messages = [r.getMessage() for r in caplog.records if r.name == "compressor.pipeline"]
    assert messages[0] == "stage baselines/onnxruntime-fp32: building"
    assert re.fullmatch(r"stage baselines/onnxruntime-fp32: built in \d+\.\d s", messages[1])
    assert messages[2] == "stage baselines/onnxruntime-fp32: cached" and messages[3].endswith("building")


def test_a_stage_whose_files_are_gone_is_built_again_and_an_older_record_is_trusted(tmp_path):
    """A stage.json outliving its files (a dir deleted in part) was reused, and what read the
    files crashed with a traceback."""
    builds = []

    def write(tmp):
        builds.append(tmp)
        (tmp / "model.onnx").write_bytes(b"graph")
        return {}
    path = tmp_path / "ft-onnx"
    cached(path, "key-1", write)
    (path / "model.onnx").unlink()
    cached(path, "key-1", write)
    assert len(builds) == 2 and (path / "model.onnx").is_file()
    record = json.loads((path / "stage.json").read_text())
    (path / "stage.json").write_text(json.dumps({k: v for k, v in record.items() if k != "files"}))
    cached(path, "key-1", write)                 # written before records listed their files
    assert len(builds) == 2


def test_each_quantize_mode_at_its_defaults_has_a_key_of_its_own():
    """A mode is the default of its own config type: left out, every mode at its defaults made
    one key, and later variants were built as copies of the first (recipes/quantization.yaml)."""
    from compressor.pipeline.recipe import parse_step
    from compressor.pipeline.stages import step_key
    modes = ["dynamic-int8", "static-int8", "int4-weight-only", "fp16", "torch-dynamic-int8", "inc"]
    keys = [json.dumps(step_key(parse_step({"quantize": {"mode": mode}}, "v"))) for mode in modes]
    assert len(set(keys)) == len(modes)
