"""The stage cache: reused while the key holds, rebuilt when it changes, one log line each way."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import time

import pytest

from compressor.pipeline.cache import cached
from pretrain.errors import UserError


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


class Stop(Exception):
    pass


def test_a_build_that_resumes_a_stopped_one_records_the_time_of_both(tmp_path):
    """A stopped teacher or variant resumes its checkpoints on the rerun: the time it records
    is that of both builds, not only of the part the rerun did."""
    path, attempts = tmp_path / "v", tmp_path / ".work" / "k.attempts.json"

    def stopped(tmp):
        time.sleep(0.3)
        raise Stop

    def resumed(tmp):
        time.sleep(0.2)
        return {}
    with pytest.raises(Stop):
        cached(path, "k", stopped, attempts=attempts)
    record = cached(path, "k", resumed, attempts=attempts)
    assert record["build_seconds"] >= 0.5 and record["build_attempts"] == 2
    assert "build_seconds_partial" not in record
    assert not attempts.exists()                              # its time is in stage.json now
    assert "build_attempts" not in cached(tmp_path / "w", "k", resumed, attempts=tmp_path / "w.json")


def test_a_build_stopped_by_bad_input_leaves_no_note_of_its_time(tmp_path):
    """Bad input is corrected in the recipe, a new key: nothing would ever read the note."""
    attempts = tmp_path / ".work" / "k.attempts.json"

    def bad(tmp):
        raise UserError("variants.v[0]: fraction must be below 1")
    with pytest.raises(UserError):
        cached(tmp_path / "v", "k", bad, attempts=attempts)
    assert not (tmp_path / ".work").exists()


def killed_build(path, attempts):
    def write(tmp):
        os._exit(9)                                           # as SIGKILL: nothing runs after it
    cached(path, "k", write, attempts=attempts)


def test_a_build_that_resumes_a_killed_one_marks_its_time_partial(tmp_path):
    path, attempts = tmp_path / "v", tmp_path / ".work" / "k.attempts.json"
    child = multiprocessing.get_context("fork").Process(target=killed_build, args=(path, attempts))
    child.start()
    child.join()
    assert child.exitcode == 9 and not path.exists()
    record = cached(path, "k", lambda tmp: {}, attempts=attempts)
    assert record["build_seconds_partial"] is True and record["build_attempts"] == 2


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
